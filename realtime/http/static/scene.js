// What the server's VLM says the scene shows, with how it came to say it (window, frames, cache,
// latency, model).

// The newest description only: each one replaces the last (the server keeps the history on NATS).
export class ScenePanel {
  constructor(text, meta, empty) {
    this.text = text;
    this.meta = meta;
    this.empty = empty;
  }

  // The description fetched on selection: only while the events have brought none (it is older).
  offer(body) {
    if (!this.text.dataset.described) this.show(body);
  }

  show(body) {
    if (!body || typeof body.text !== "string") return;
    this.text.textContent = body.text;
    const parts = [];
    if (typeof body.window_end_pts === "number") parts.push(`at ${body.window_end_pts.toFixed(1)} s`);
    if (body.frames) parts.push(`${body.frames} frame${body.frames === 1 ? "" : "s"}`);
    if (body.epoch) parts.push(`window ${body.epoch}`);
    if (body.prompt_tokens) parts.push(`${Math.round((100 * (body.cached_tokens || 0)) / body.prompt_tokens)}% cached`);
    if (typeof body.latency_ms === "number") parts.push(`${Math.round(body.latency_ms)} ms`);
    if (body.model) parts.push(body.model);
    this.meta.textContent = parts.join(" · ");
    this.text.dataset.described = "1";
  }

  clear() {
    this.text.textContent = "";
    delete this.text.dataset.described;
    this.meta.textContent = this.empty;
  }
}
