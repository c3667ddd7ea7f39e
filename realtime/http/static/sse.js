// Server-sent events read with fetch: EventSource cannot send a bearer header. Shared by the
// watch view's event stream and the Ask tab's streamed answer.

const MAX_SSE_BUFFER = 1 << 20;

export async function readSse(body, signal, onEvent, onId) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  signal.addEventListener("abort", () => reader.cancel().catch(() => {}), { once: true });
  let buffer = "";
  let name = "message";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      let line = buffer.slice(0, end);
      buffer = buffer.slice(end + 1);
      if (line.endsWith("\r")) line = line.slice(0, -1);
      if (line === "") {
        if (data.length) onEvent(name, data.join("\n"));
        name = "message";
        data = [];
      } else if (!line.startsWith(":")) {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") name = value;
        else if (field === "data") data.push(value);
        else if (field === "id" && !value.includes("\0")) onId(value);
      }
    }
    if (buffer.length > MAX_SSE_BUFFER) throw new Error("an event line too long");
  }
}
