// The Watch tab's list of streams: read every LIST_EVERY_MS while the tab is shown and drawn in the
// server's order, each with its kind, state and why it is not live. What picking one does, and what
// the selected stream's listing (or its absence) means, belong to the watch view and are passed in.

import { Unauthorized } from "./api.js";

const LIST_EVERY_MS = 2000;

export class StreamList {
  constructor(el, { api, errorText, pageNotice, onPick, onListed, onGone }) {
    this.el = el; // list, empty
    this.api = api;
    this.errorText = errorText;
    this.pageNotice = pageNotice;
    this.onPick = onPick; // a stream's button was clicked: (id)
    this.onListed = onListed; // the selected stream as just listed: (stream)
    this.onGone = onGone; // the selected stream is no longer listed
    this.timer = null;
    this.selected = null; // the watch view's stream, set by mark()
    this.items = new Map(); // stream id -> <li>
  }

  get running() {
    return this.timer !== null;
  }

  start() {
    this.refresh();
    this.timer = setInterval(() => this.refresh(), LIST_EVERY_MS);
  }

  stop() {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  async refresh() {
    let streams;
    try {
      const response = await this.api("/api/streams");
      if (!response.ok) {
        this.pageNotice(`Could not list the streams: ${await this.errorText(response)}`);
        return;
      }
      streams = (await response.json()).streams || [];
    } catch (error) {
      if (!(error instanceof Unauthorized)) this.pageNotice(`Could not list the streams: ${error.message}`);
      return;
    }
    if (this.timer === null) return; // left the mode meanwhile
    this.pageNotice("");
    this.render(streams);
  }

  item(id) {
    const li = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "stream";
    button.dataset.id = id;
    button.innerHTML =
      '<span class="line"><span class="id"></span><span class="kind"></span></span>' +
      '<span class="line"><span class="pill"></span></span><span class="reason"></span>';
    button.querySelector(".id").textContent = id;
    button.addEventListener("click", () => this.onPick(id));
    li.append(button);
    return li;
  }

  render(streams) {
    const list = this.el.list;
    const seen = new Set();
    streams.forEach((stream, index) => {
      seen.add(stream.id);
      let li = this.items.get(stream.id);
      if (!li) {
        li = this.item(stream.id);
        this.items.set(stream.id, li);
      }
      // The server's order; a node is moved only when out of place, so focus stays where it is.
      if (list.children[index] !== li) list.insertBefore(li, list.children[index] || null);
      const button = li.firstElementChild;
      button.setAttribute("aria-pressed", String(stream.id === this.selected));
      button.querySelector(".kind").textContent = stream.kind || "camera";
      const pill = button.querySelector(".pill");
      pill.dataset.state = stream.state;
      pill.textContent = stream.state;
      button.querySelector(".reason").textContent = stream.reason || "";
      if (stream.id === this.selected) this.onListed(stream);
    });
    for (const [id, li] of this.items) {
      if (!seen.has(id)) {
        li.remove();
        this.items.delete(id);
      }
    }
    this.el.empty.hidden = streams.length > 0;
    if (this.selected && !seen.has(this.selected)) this.onGone();
  }

  // The selected stream's button pressed, the others not.
  mark(id) {
    this.selected = id;
    for (const [other, li] of this.items) li.firstElementChild.setAttribute("aria-pressed", String(other === id));
  }
}
