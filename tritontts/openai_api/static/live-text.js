// Hook for typing text in as it is spoken, over the WebSocket endpoint /v1/audio/speech/stream.
// The endpoint is another piece of work: this page shows the mode only where the server has it, found from
// /v1/models (a model card with "text_streaming": true) or, failing that, by a WebSocket that opens.
export const PATH = "v1/audio/speech/stream";

export async function available(models, api) {
  if (models.some((model) => model.text_streaming === true)) return true;
  return probe(api);
}

export function probe(api, timeoutMs = 1500) {
  const url = new URL(PATH, api);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return new Promise((resolve) => {
    let socket;
    try {
      socket = new WebSocket(url);
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

export function mount(section) {
  // The client of the endpoint's protocol goes here once the endpoint exists.
  section.hidden = false;
  section.dataset.mode = "live-text";
  const title = document.createElement("h3");
  title.textContent = "Type as it speaks";
  const note = document.createElement("p");
  note.className = "muted";
  note.textContent = `This server takes text as it is written over /${PATH}; this page does not speak through it yet.`;
  section.replaceChildren(title, note);
}
