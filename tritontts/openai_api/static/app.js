// The page of the speech API: models and their modes, voices, streamed playback, WAV download.
// Plain ES module, no dependencies; every request goes to the API this page is served by.
import * as liveText from "./live-text.js";

const API = new URL("../", location.href);
const KEY_STORAGE = "tritontts-api-key";
const LEVELS = ["very_low", "low", "moderate", "high", "very_high"];
const MODE_LABELS = {
  clone: "Clone a voice",
  cross_lingual: "Cross-lingual",
  instruct2: "Instruct",
  create: "Create from attributes",
};
const MODE_ORDER = Object.keys(MODE_LABELS);
const REFERENCE_RATE = 16000;

const $ = (id) => document.getElementById(id);
const state = {
  key: sessionStorage.getItem(KEY_STORAGE) || "",
  models: [],
  voices: [],
  source: "saved",
  reference: null, // {blob, label}
  recorder: null,
  run: null, // {controller, player}
  audioUrl: null,
  context: null,
  wantStream: true,
  live: null, // live-text.js's session, once mounted
};

class ApiError extends Error {
  constructor(message, status = 0, param = null, code = null) {
    super(message);
    this.status = status;
    this.param = param;
    this.code = code;
  }
}

async function errorOf(response) {
  const text = await response.text();
  try {
    const error = JSON.parse(text).error;
    if (error && error.message) return new ApiError(error.message, response.status, error.param, error.code);
  } catch (_) {
    // not the API's JSON: a proxy's page, say
  }
  const detail = text.trim().slice(0, 300);
  return new ApiError(`${response.status} ${response.statusText}${detail ? ": " + detail : ""}`, response.status);
}

async function call(path, options = {}) {
  const headers = new Headers(options.headers || {});
  if (state.key) headers.set("Authorization", `Bearer ${state.key}`);
  let response;
  try {
    response = await fetch(new URL(path, API), { ...options, headers });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(`cannot reach the API: ${err.message}`);
  }
  if (response.ok) return response;
  const error = await errorOf(response);
  if (response.status === 401) askForKey(error.message);
  throw error;
}

async function callJson(path, options) {
  return (await call(path, options)).json();
}

// --- messages ---------------------------------------------------------------------------------------------

function showError(err) {
  const box = $("error");
  const where = err.param ? ` (${err.param})` : "";
  box.textContent = err.message + where;
  box.hidden = false;
  document.body.dataset.error = err.code || String(err.status || "");
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
  delete document.body.dataset.error;
}

function setStatus(text, runState) {
  $("status").textContent = text;
  if (runState) $("result").dataset.state = runState;
}

// --- the key ----------------------------------------------------------------------------------------------

function askForKey(message) {
  $("key-panel").hidden = false;
  $("main-panel").hidden = true;
  $("server-state").textContent = "API key needed";
  if (state.key) {
    $("key-error").textContent = message;
    $("key-error").hidden = false;
  }
}

$("key-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  state.key = $("key-input").value.trim();
  if ($("key-remember").checked) sessionStorage.setItem(KEY_STORAGE, state.key);
  else sessionStorage.removeItem(KEY_STORAGE);
  $("key-input").value = "";
  $("key-error").hidden = true;
  await start();
});

// --- models and modes -------------------------------------------------------------------------------------

function currentModel() {
  return state.models.find((m) => m.id === $("model").value);
}

function currentMode() {
  const checked = document.querySelector('input[name="mode"]:checked');
  return checked ? checked.value : "clone";
}

function renderModels() {
  const select = $("model");
  const previous = select.value;
  select.replaceChildren();
  for (const model of state.models) {
    const option = new Option(model.ready === false ? `${model.id} (not ready)` : model.id, model.id);
    select.add(option);
  }
  if (state.models.some((m) => m.id === previous)) select.value = previous;
  renderModes();
}

function renderModes() {
  const model = currentModel();
  const box = $("modes");
  const previous = currentMode();
  box.querySelectorAll("label").forEach((label) => label.remove());
  if (!model) return;
  const modes = (model.modes || ["clone"]).filter((m) => m in MODE_LABELS);
  modes.sort((a, b) => MODE_ORDER.indexOf(a) - MODE_ORDER.indexOf(b));
  for (const mode of modes) {
    const label = document.createElement("label");
    label.className = "check";
    const input = document.createElement("input");
    Object.assign(input, { type: "radio", name: "mode", value: mode, checked: mode === previous });
    input.addEventListener("change", renderVoicePanel);
    label.append(input, " " + MODE_LABELS[mode]);
    box.append(label);
  }
  const first = box.querySelector("input");
  if (first && !document.querySelector('input[name="mode"]:checked')) first.checked = true;
  const info = [`${model.sample_rate ? model.sample_rate / 1000 + " kHz" : ""}`];
  if (model.streaming === false) info.push("no streaming model: whole files only");
  if (model.ready === false) info.push("not ready on Triton");
  $("model-info").textContent = info.filter(Boolean).join(" · ");
  $("stream").disabled = model.streaming === false;
  $("stream").checked = model.streaming !== false && state.wantStream;
  if (state.live) state.live.refresh();
  renderVoicePanel();
}

function renderVoicePanel() {
  const mode = currentMode();
  const design = mode === "create";
  $("design-box").hidden = !design;
  $("instructions-box").hidden = mode !== "instruct2";
  document.querySelector("#voice-card .tabs").hidden = design;
  const savedTab = document.querySelector('.tab[data-source="saved"]');
  savedTab.disabled = mode === "cross_lingual"; // a saved voice has a transcript: it clones
  if (savedTab.disabled && state.source === "saved") state.source = "upload";
  for (const tab of document.querySelectorAll(".tab")) {
    tab.classList.toggle("active", tab.dataset.source === state.source);
    tab.setAttribute("aria-selected", String(tab.dataset.source === state.source));
  }
  for (const pane of document.querySelectorAll(".pane")) pane.hidden = design || pane.dataset.pane !== state.source;
  const ownReference = !design && state.source !== "saved";
  $("reference-box").hidden = !ownReference || !state.reference;
  const transcript = mode === "clone";
  $("ref-text").hidden = $("ref-text-label").hidden = !transcript;
}

$("model").addEventListener("change", renderModes);
$("stream").addEventListener("change", () => (state.wantStream = $("stream").checked));
for (const tab of document.querySelectorAll(".tab")) {
  tab.addEventListener("click", () => {
    state.source = tab.dataset.source;
    renderVoicePanel();
  });
}
for (const select of document.querySelectorAll("select.level")) {
  for (const level of LEVELS) select.add(new Option(level.replace("_", " "), level, false, level === "moderate"));
}

// --- voices -----------------------------------------------------------------------------------------------

async function loadVoices(select) {
  const body = await callJson("v1/audio/voices");
  state.voices = body.data || [];
  const picker = $("voice");
  const previous = select || picker.value;
  picker.replaceChildren();
  for (const voice of state.voices) picker.add(new Option(voice.name, voice.name));
  if (!state.voices.length) picker.add(new Option("(no saved voices)", ""));
  if (state.voices.some((v) => v.name === previous)) picker.value = previous;
  showVoiceInfo();
}

function showVoiceInfo() {
  const voice = state.voices.find((v) => v.name === $("voice").value);
  $("voice-info").textContent = voice ? `${voice.duration} s · “${voice.transcript}”` : "";
  $("voice-delete").disabled = !voice;
}

$("voice").addEventListener("change", showVoiceInfo);

$("voice-delete").addEventListener("click", async () => {
  const name = $("voice").value;
  if (!name || !confirm(`Delete the voice '${name}'?`)) return;
  clearError();
  try {
    await call(`v1/audio/voices/${encodeURIComponent(name)}`, { method: "DELETE" });
    await loadVoices();
    setStatus(`Deleted the voice '${name}'.`);
  } catch (err) {
    showError(err);
  }
});

$("voice-save").addEventListener("click", async () => {
  if (!state.reference) return;
  clearError();
  const name = $("voice-name").value.trim();
  const form = new FormData();
  form.append("name", name);
  form.append("transcript", $("ref-text").value);
  form.append("audio_sample", state.reference.blob, `${name || "voice"}.wav`);
  $("voice-save").disabled = true;
  setStatus(`Saving '${name}'…`);
  try {
    await call("v1/audio/voices", { method: "POST", body: form });
    await loadVoices(name);
    state.source = "saved";
    renderVoicePanel();
    setStatus(`Saved the voice '${name}'.`);
  } catch (err) {
    showError(err);
    setStatus("Not saved.");
  } finally {
    $("voice-save").disabled = false;
  }
});

// --- references: a file or the microphone, sent as 16 kHz mono WAV ---------------------------------------

function audioContext() {
  if (!state.context) state.context = new AudioContext();
  if (state.context.state === "suspended") state.context.resume();
  return state.context;
}

function wavBlob(int16Bytes, rate) {
  const header = new DataView(new ArrayBuffer(44));
  const ascii = (offset, text) => [...text].forEach((c, i) => header.setUint8(offset + i, c.charCodeAt(0)));
  ascii(0, "RIFF");
  header.setUint32(4, 36 + int16Bytes.byteLength, true);
  ascii(8, "WAVEfmt ");
  header.setUint32(16, 16, true);
  header.setUint16(20, 1, true);
  header.setUint16(22, 1, true);
  header.setUint32(24, rate, true);
  header.setUint32(28, rate * 2, true);
  header.setUint16(32, 2, true);
  header.setUint16(34, 16, true);
  ascii(36, "data");
  header.setUint32(40, int16Bytes.byteLength, true);
  return new Blob([header, int16Bytes], { type: "audio/wav" });
}

function wavSeconds(view) {
  // the length of a PCM WAV from its fmt and data chunks
  let rate = 0;
  let frameBytes = 2;
  for (let offset = 12; offset + 8 <= view.byteLength; ) {
    const id = String.fromCharCode(...new Uint8Array(view.buffer, offset, 4));
    const size = view.getUint32(offset + 4, true);
    if (id === "fmt ") {
      rate = view.getUint32(offset + 12, true);
      frameBytes = view.getUint16(offset + 20, true);
    } else if (id === "data") {
      return rate ? Math.min(size, view.byteLength - offset - 8) / frameBytes / rate : 0;
    }
    offset += 8 + size + (size % 2);
  }
  return 0;
}

function int16Of(samples) {
  const out = new DataView(new ArrayBuffer(samples.length * 2));
  samples.forEach((v, i) => out.setInt16(i * 2, Math.max(-1, Math.min(1, v)) * 32767, true));
  return new Uint8Array(out.buffer);
}

async function referenceWav(blob) {
  const decoded = await audioContext().decodeAudioData(await blob.arrayBuffer());
  const length = Math.max(1, Math.ceil(decoded.duration * REFERENCE_RATE));
  const offline = new OfflineAudioContext(1, length, REFERENCE_RATE);
  const source = offline.createBufferSource();
  source.buffer = decoded;
  source.connect(offline.destination);
  source.start();
  const rendered = await offline.startRendering();
  return { blob: wavBlob(int16Of(rendered.getChannelData(0)), REFERENCE_RATE), seconds: decoded.duration };
}

async function setReference(blob, label) {
  let reference = { blob, label };
  try {
    const wav = await referenceWav(blob);
    reference = { blob: wav.blob, label: `${label}, ${wav.seconds.toFixed(2)} s` };
  } catch (_) {
    // the browser cannot decode it: sent as it is, the API says what it makes of it
  }
  state.reference = reference;
  $("ref-audio").src = URL.createObjectURL(reference.blob);
  $("ref-info").textContent = reference.label;
  $("reference-box").dataset.ready = "true";
  renderVoicePanel();
}

$("ref-file").addEventListener("change", async () => {
  const file = $("ref-file").files[0];
  if (file) await setReference(file, file.name);
});

$("record-start").addEventListener("click", async () => {
  clearError();
  if (!navigator.mediaDevices || !window.MediaRecorder) {
    showError(new ApiError("recording needs a secure page (https, or http on localhost) and MediaRecorder"));
    return;
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (err) {
    showError(new ApiError(`no microphone: ${err.message}`));
    return;
  }
  const recorder = new MediaRecorder(stream);
  const parts = [];
  recorder.ondataavailable = (event) => parts.push(event.data);
  recorder.onstop = async () => {
    stream.getTracks().forEach((track) => track.stop());
    $("record-state").textContent = "";
    await setReference(new Blob(parts, { type: recorder.mimeType }), "recording");
  };
  recorder.start();
  state.recorder = recorder;
  $("record-start").disabled = true;
  $("record-stop").disabled = false;
  $("record-state").textContent = "recording…";
});

$("record-stop").addEventListener("click", () => {
  if (state.recorder && state.recorder.state !== "inactive") state.recorder.stop();
  state.recorder = null;
  $("record-start").disabled = false;
  $("record-stop").disabled = true;
});

// --- speech -----------------------------------------------------------------------------------------------

class Player {
  // PCM chunks scheduled back to back on the Web Audio clock as they arrive; every byte kept for the WAV.
  constructor(rate) {
    this.context = audioContext();
    this.rate = rate;
    this.next = 0;
    this.carry = null;
    this.parts = [];
    this.samples = 0;
    this.chunks = 0;
    this.firstAt = null;
    this.sources = [];
  }

  push(bytes) {
    if (this.carry) {
      const joined = new Uint8Array(this.carry.length + bytes.length);
      joined.set(this.carry);
      joined.set(bytes, this.carry.length);
      bytes = joined;
      this.carry = null;
    }
    if (bytes.length % 2) {
      this.carry = bytes.slice(-1);
      bytes = bytes.slice(0, -1);
    }
    const count = bytes.length / 2;
    if (!count) return;
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const samples = new Float32Array(count);
    for (let i = 0; i < count; i++) samples[i] = view.getInt16(i * 2, true) / 32768;
    this.parts.push(bytes.slice());
    this.samples += count;
    this.chunks += 1;
    const buffer = this.context.createBuffer(1, count, this.rate);
    buffer.copyToChannel(samples, 0);
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    const now = this.context.currentTime;
    const at = Math.max(this.next, now + 0.02);
    source.start(at);
    this.sources.push(source);
    this.next = at + count / this.rate;
    if (this.firstAt === null) this.firstAt = performance.now() + (at - now) * 1000;
  }

  stop() {
    this.sources.forEach((source) => source.stop());
  }

  wav() {
    const all = new Uint8Array(this.samples * 2);
    let offset = 0;
    for (const part of this.parts) {
      all.set(part, offset);
      offset += part.length;
    }
    return wavBlob(all, this.rate);
  }
}

function speechRequest(stream) {
  const model = currentModel();
  const mode = currentMode();
  const fields = {
    model: model.id,
    input: $("text").value,
    response_format: stream ? "pcm" : "wav",
    text_normalization: $("normalize").checked,
  };
  if (stream) fields.stream_format = $("stream-format").value;
  if (mode === "create") {
    fields.voice = { gender: $("gender").value, pitch: $("pitch").value, speed: $("speed").value };
    return jsonBody(fields);
  }
  if (mode === "instruct2") fields.instructions = $("instructions").value;
  if (state.source === "saved") {
    fields.voice = $("voice").value;
    return jsonBody(fields);
  }
  const form = new FormData();
  for (const [name, value] of Object.entries(fields)) form.append(name, String(value));
  if (state.reference) form.append("ref_audio", state.reference.blob, "reference.wav");
  if (mode === "clone" && $("ref-text").value.trim()) form.append("ref_text", $("ref-text").value);
  return { method: "POST", body: form };
}

function jsonBody(fields) {
  return { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(fields) };
}

async function readRaw(response, player) {
  const reader = response.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    player.push(value);
    showProgress(player);
  }
}

async function readSse(response, player) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    pending += value;
    let end;
    while ((end = pending.indexOf("\n\n")) >= 0) {
      const event = pending.slice(0, end);
      pending = pending.slice(end + 2);
      const data = event
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      const message = JSON.parse(data);
      if (message.type === "speech.audio.delta") {
        player.push(Uint8Array.from(atob(message.audio), (c) => c.charCodeAt(0)));
        showProgress(player);
      } else if (message.type === "error") {
        const error = message.error || {};
        throw new ApiError(error.message || "the stream ended with an error", 0, error.param, error.code);
      }
    }
  }
}

function showProgress(player) {
  $("chunks").textContent = String(player.chunks);
  $("audio-seconds").textContent = `${(player.samples / player.rate).toFixed(2)} s`;
  if (player.firstAt !== null && $("ttfa").dataset.ms === undefined) {
    const ms = player.firstAt - state.run.started;
    $("ttfa").dataset.ms = ms.toFixed(0);
    $("ttfa").textContent = `${ms.toFixed(0)} ms`;
  }
}

function showResult(blob, seconds, elapsed) {
  if (state.audioUrl) URL.revokeObjectURL(state.audioUrl);
  state.audioUrl = URL.createObjectURL(blob);
  $("output").src = state.audioUrl;
  $("output").hidden = false;
  $("download").href = state.audioUrl;
  $("download").hidden = false;
  $("audio-seconds").textContent = `${seconds.toFixed(2)} s`;
  if (seconds > 0 && elapsed > 0) $("rtf").textContent = (elapsed / 1000 / seconds).toFixed(3);
}

function resetResult() {
  for (const id of ["ttfa", "audio-seconds", "rtf", "chunks"]) {
    $(id).textContent = "–";
    delete $(id).dataset.ms;
  }
  $("output").removeAttribute("src");
  $("output").load();
  $("output").hidden = true;
  $("download").hidden = true;
}

async function speak() {
  clearError();
  const model = currentModel();
  if (!model) return;
  const stream = $("stream").checked && model.streaming !== false;
  resetResult();
  const controller = new AbortController();
  const player = stream ? new Player(model.sample_rate) : null;
  state.run = { controller, player, started: performance.now() };
  $("speak").disabled = true;
  $("stop").disabled = false;
  setStatus("Speaking…", "running");
  try {
    const response = await call("v1/audio/speech", { ...speechRequest(stream), signal: controller.signal });
    if (stream) {
      await ($("stream-format").value === "sse" ? readSse(response, player) : readRaw(response, player));
      const elapsed = performance.now() - state.run.started;
      showResult(player.wav(), player.samples / player.rate, elapsed);
      setStatus(`Done: ${player.chunks} chunk${player.chunks === 1 ? "" : "s"} streamed.`, "done");
    } else {
      const blob = await response.blob();
      const elapsed = performance.now() - state.run.started;
      const seconds = wavSeconds(new DataView(await blob.arrayBuffer()));
      $("ttfa").textContent = `${elapsed.toFixed(0)} ms`;
      $("ttfa").dataset.ms = elapsed.toFixed(0);
      $("chunks").textContent = "1";
      showResult(blob, seconds, elapsed);
      $("output").play().catch(() => {});
      setStatus("Done: whole file.", "done");
    }
  } catch (err) {
    if (err.name === "AbortError") {
      setStatus("Stopped.", "stopped");
    } else {
      showError(err);
      setStatus("Failed.", "error");
    }
    if (player && player.samples) showResult(player.wav(), player.samples / player.rate, 0);
  } finally {
    $("speak").disabled = false;
    $("stop").disabled = true;
  }
}

$("speak").addEventListener("click", speak);
$("stop").addEventListener("click", () => {
  if (!state.run) return;
  if (state.run.controller) state.run.controller.abort();
  if (state.run.player) state.run.player.stop();
});

// --- text typed in as it is spoken (live-text.js) --------------------------------------------------------

async function base64Of(blob) {
  const bytes = new Uint8Array(await blob.arrayBuffer());
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

async function sessionConfig({ bistream = false } = {}) {
  const mode = currentModel() ? currentMode() : "clone";
  const config = {
    model: $("model").value,
    stream_audio: true,
    split_granularity: "sentence",
    text_normalization: $("normalize").checked,
  };
  if (bistream) config.bistream = true;
  if (state.key) config.api_key = state.key;
  if (mode === "create") {
    config.voice = { gender: $("gender").value, pitch: $("pitch").value, speed: $("speed").value };
    return config;
  }
  if (mode === "instruct2") config.instructions = $("instructions").value;
  if (state.source === "saved") config.voice = $("voice").value;
  else if (state.reference) {
    config.ref_audio = await base64Of(state.reference.blob);
    if (mode === "clone" && $("ref-text").value.trim()) config.ref_text = $("ref-text").value;
  }
  return config;
}

const liveContext = {
  api: API,
  config: sessionConfig,
  takesBistream: () => currentModel()?.bistream === true,
  begin(rate) {
    clearError();
    resetResult();
    const player = new Player(rate);
    state.run = { controller: null, player, started: performance.now() };
    setStatus("Listening…", "running");
    return player;
  },
  progress: showProgress,
  finish(player) {
    showResult(player.wav(), player.samples / player.rate, 0); // no RTF: the typing set the pace
    setStatus(`Done: ${player.chunks} chunk${player.chunks === 1 ? "" : "s"} spoken as typed.`, "done");
  },
  fail(error) {
    showError(new ApiError(error.message || "the session failed", 0, error.param, error.code));
    setStatus("Failed.", "error");
  },
};

// --- start ------------------------------------------------------------------------------------------------

async function start() {
  try {
    const body = await callJson("v1/models");
    state.models = body.data || [];
    await loadVoices();
  } catch (err) {
    if (err.status !== 401) {
      $("server-state").textContent = "unavailable";
      $("main-panel").hidden = false;
      showError(err);
    }
    return;
  }
  $("key-panel").hidden = true;
  $("main-panel").hidden = false;
  $("server-state").textContent = `${state.models.length} model${state.models.length === 1 ? "" : "s"}`;
  renderModels();
  document.body.dataset.ready = "true";
  if (await liveText.available(API)) state.live = liveText.mount($("live-text"), liveContext);
  window.liveTextChecked = true;
}

start();
