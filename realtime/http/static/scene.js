// What the server's VLM says the scene shows, with how it came to say it (window, frames, cache,
// latency, model).

// The newest description only: each one replaces the last (the server keeps the history on NATS).
export class ScenePanel {
  constructor(text, meta, empty, { api } = {}) {
    this.text = text;
    this.meta = meta;
    this.empty = empty;
    this.api = api;
  }

  // A stream picked in Watch: the scene as it was last described, without waiting for the next
  // description (its events bring that one).
  async select(id, signal) {
    try {
      const response = await this.api(`/api/streams/${encodeURIComponent(id)}/description`, { signal });
      if (!response.ok) return;
      const { description } = await response.json();
      if (description && !signal.aborted) this.offer(description);
    } catch {
      // the events bring the next one
    }
  }

  // The description fetched on selection: only while the events have brought none (it is older).
  offer(body) {
    if (!this.text.dataset.described) this.show("descriptions", body);
  }

  show(_kind, body) {
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

const EMPTY = {
  live: "A description appears here when the server has a VLM.",
  watch: "No description yet.",
};

// The descriptions plugin's card (realtime/service/plugins/descriptions.py), in either mode.
export default function mount(card, { mode, api }) {
  card.insertAdjacentHTML("beforeend",
    `<p id="${mode}-scene" class="scene" aria-live="polite"></p><p id="${mode}-scene-meta" class="muted small"></p>`);
  const meta = card.querySelector(`#${mode}-scene-meta`);
  meta.textContent = EMPTY[mode];
  return new ScenePanel(card.querySelector("p.scene"), meta, EMPTY[mode], { api });
}
