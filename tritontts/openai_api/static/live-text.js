// Typing text in as it is spoken, over the WebSocket endpoint /v1/audio/speech/stream (docs/streaming-text.md).
// Shown only where the server has the endpoint: a WebSocket to it opens (and is closed at once).
// Each sentence is spoken once the character after its mark arrives; with the bistream switch (models whose
// /v1/models entry says `bistream: true`) every piece typed joins one running utterance instead.
export const PATH = "v1/audio/speech/stream";

export function available(api) {
  return probe(api);
}

function socketUrl(api) {
  const url = new URL(PATH, api);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url;
}

export function probe(api, timeoutMs = 1500) {
  return new Promise((resolve) => {
    let socket;
    try {
      socket = new WebSocket(socketUrl(api));
    } catch (_) {
      resolve(false);
      return;
    }
    const timer = setTimeout(() => finish(false), timeoutMs);
    function finish(open) {
      clearTimeout(timer);
      socket.onopen = socket.onerror = socket.onclose = null;
      if (socket.readyState <= WebSocket.OPEN) socket.close(1000);
      resolve(open);
    }
    socket.onopen = () => finish(true);
    socket.onerror = socket.onclose = () => finish(false);
  });
}

function element(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
}

// ctx (app.js): api, config({bistream}) -> session.config fields, takesBistream() -> bool, begin(rate) -> player,
// progress(player), finish(player), fail(error)
export function mount(section, ctx) {
  const input = element("textarea", { id: "live-input", rows: 3 });
  const done = element("button", { id: "live-done", type: "button", className: "secondary" }, "Speak the rest");
  const status = element("span", { id: "live-state", className: "muted" });
  const bistream = element("input", { id: "live-bistream", type: "checkbox" });
  const bistreamLabel = element("label", { className: "check" }, bistream, " Speak as the text comes (bistream)");
  section.replaceChildren(
    element("h3", {}, "Type as it speaks"),
    element("p", { className: "muted" }, `Text goes to /${PATH} as it is typed, with the choices above.`),
    input,
    element("div", { className: "row" }, done, bistreamLabel, status),
  );
  section.hidden = false;
  section.dataset.mode = "live-text";

  let socket = null;
  let opening = null;
  let created = false;
  let queue = [];
  let sent = "";
  let player = null;
  let seconds = 0;
  let sentences = 0;

  function send(message) {
    if (socket && created) socket.send(JSON.stringify(message));
    else queue.push(message);
  }

  function close() {
    if (socket) {
      socket.onclose = null; // its close event must not drop the socket of a session opened meanwhile
      socket.close(1000);
    }
    socket = null;
    created = false;
    queue = [];
  }

  function refresh() {
    bistreamLabel.hidden = !ctx.takesBistream();
    describe();
  }

  function describe() {
    input.placeholder = bistreamOn()
      ? "type here: it is spoken as it comes, one utterance until Speak the rest"
      : "type here: each sentence is spoken as soon as it is complete";
  }

  function bistreamOn() {
    return bistream.checked && !bistreamLabel.hidden;
  }

  async function open() {
    const config = await ctx.config({ bistream: bistreamOn() });
    socket = new WebSocket(socketUrl(ctx.api));
    socket.binaryType = "arraybuffer";
    socket.onopen = () => socket.send(JSON.stringify({ type: "session.config", ...config }));
    socket.onmessage = (event) => {
      if (typeof event.data !== "string") {
        if (player) {
          player.push(new Uint8Array(event.data));
          ctx.progress(player);
        }
        return;
      }
      const message = JSON.parse(event.data);
      if (message.type === "session.created") {
        created = true;
        player = ctx.begin(message.sample_rate);
        seconds = sentences = 0;
        status.textContent = "listening…";
        queue.splice(0).forEach(send);
      } else if (message.type === "audio.start") {
        section.dataset.bistream = String(message.bistream === true);
        status.textContent = message.bistream ? "speaking as the text comes…" : `speaking: ${message.sentence_text}`;
      } else if (message.type === "audio.done") {
        seconds += message.duration || 0;
        sentences += 1;
        Object.assign(section.dataset, { seconds: seconds.toFixed(3), sentences: String(sentences) });
      } else if (message.type === "session.done") {
        ctx.finish(player);
        player = null;
        close(); // the next utterance opens a session with the choices of then
        status.textContent = "done: type on for more";
      } else if (message.type === "error") {
        ctx.fail(message);
        if (!created) close();
      }
    };
    socket.onclose = () => {
      socket = null;
      created = false;
    };
  }

  input.addEventListener("input", () => {
    const text = input.value;
    const delta = text.startsWith(sent) ? text.slice(sent.length) : "";
    sent = text; // text edited before the end was already sent: only what is added goes
    if (!delta) return;
    if (!socket && !opening) opening = open().finally(() => (opening = null));
    send({ type: "input.text", text: delta });
  });

  done.addEventListener("click", () => {
    if (!socket && !opening) return;
    send({ type: "input.done" });
    input.value = "";
    sent = "";
  });

  bistream.addEventListener("change", describe);
  refresh();
  return { close, refresh };
}
