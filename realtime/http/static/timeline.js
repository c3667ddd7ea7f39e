// The Ask tab: search what every stream said and saw, or ask a question and read the answer as it
// is written, each claim citing its moments. A hit or a citation opens its clip at that moment
// (streamed from the clip's signed play link, as the clips card does), or says that no clip covers it.
// Its own module: it gets the authenticated `api` call from the page instead of importing it.

import { readSse } from "./sse.js";

function stamp(seconds) {
  return new Date(seconds * 1000).toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });
}

function marked(snippet, marks) {
  // Text nodes and <mark>s: never innerHTML, the snippet is what was said on a camera.
  const out = [];
  let last = 0;
  for (const [start, end] of marks || []) {
    out.push(document.createTextNode(snippet.slice(last, start)));
    const mark = document.createElement("mark");
    mark.textContent = snippet.slice(start, end);
    out.push(mark);
    last = end;
  }
  out.push(document.createTextNode(snippet.slice(last)));
  return out;
}

export class TimelinePanel {
  constructor(el, { api, errorText }) {
    this.el = el; // form, input, search, ask, status, answer, list, box, video, info
    this.api = api;
    this.errorText = errorText;
    this.busy = false;
    el.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.search();
    });
    el.ask.addEventListener("click", () => this.ask());
  }

  setBusy(busy, status) {
    this.busy = busy;
    this.el.search.disabled = busy;
    this.el.ask.disabled = busy;
    this.el.status.textContent = status;
  }

  async search() {
    const q = this.el.input.value.trim();
    if (!q || this.busy) return;
    this.setBusy(true, "Searching…");
    this.el.answer.hidden = true;
    try {
      const response = await this.api(`/api/search?q=${encodeURIComponent(q)}&limit=50`);
      if (!response.ok) {
        this.setBusy(false, await this.errorText(response));
        this.el.list.replaceChildren();
        return;
      }
      const body = await response.json();
      this.el.list.replaceChildren(...body.hits.map((hit) => this.item(hit, null)));
      this.setBusy(false, body.hits.length ? `${body.hits.length}${body.next ? "+" : ""} hits` : "No hits.");
    } catch (error) {
      this.setBusy(false, `Search failed: ${error.message}`);
    }
  }

  async ask() {
    const question = this.el.input.value.trim();
    if (!question || this.busy) return;
    this.setBusy(true, "Looking through the timeline…");
    this.el.list.replaceChildren();
    this.el.answer.hidden = false;
    this.el.answer.replaceChildren();
    let draft = "";
    try {
      const response = await this.api("/api/ask", {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
        body: JSON.stringify({ question }),
      });
      if (!response.ok) {
        this.setBusy(false, await this.errorText(response));
        return;
      }
      const onEvent = (kind, raw) => {
        const data = JSON.parse(raw);
        if (kind === "evidence") {
          this.el.status.textContent = `${data.evidence.length} moments found; the model is answering…`;
        } else if (kind === "delta") {
          draft += data.text;
          this.el.answer.textContent = draft;
        } else if (kind === "restart") {
          draft = "";
          this.el.answer.textContent = "";
        } else if (kind === "answer") {
          this.showAnswer(data);
          const dropped = data.dropped.filter((d) => d.citation).length;
          this.setBusy(false, data.checked
            ? `Checked: ${dropped ? `${dropped} citation${dropped === 1 ? "" : "s"} dropped` : "every citation holds"}.`
            : "The citations could not be checked (the VLM did not answer the check).");
        } else if (kind === "error") {
          this.setBusy(false, data.error);
        }
      };
      await readSse(response.body, new AbortController().signal, onEvent, () => {});
      if (this.busy) this.setBusy(false, "The answer stopped part-way.");
    } catch (error) {
      this.setBusy(false, `Asking failed: ${error.message}`);
    }
  }

  showAnswer(data) {
    // The checked answer, with each [E#] a button that opens that moment.
    const parts = [];
    const pattern = /\[(E\d+)\]/g;
    let last = 0;
    for (const match of data.answer.matchAll(pattern)) {
      parts.push(document.createTextNode(data.answer.slice(last, match.index)));
      const citation = data.citations[match[1]];
      const button = document.createElement("button");
      button.type = "button";
      button.className = "cite";
      button.textContent = match[1];
      if (citation) {
        button.title = `${citation.stream_id} · ${stamp(citation.wall)} · ${citation.kind}`;
        button.addEventListener("click", () => this.open(citation));
      }
      parts.push(button);
      last = match.index + match[0].length;
    }
    parts.push(document.createTextNode(data.answer.slice(last)));
    this.el.answer.replaceChildren(...parts);
    const cited = Object.entries(data.citations);
    this.el.list.replaceChildren(...cited.map(([label, hit]) => this.item(hit, label)));
  }

  item(hit, label) {
    const li = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "hit";
    const head = document.createElement("span");
    head.className = "hit-head";
    const at = hit.pts == null ? "" : ` · ${hit.pts.toFixed(1)} s`;
    head.textContent = `${label ? `${label} · ` : ""}${hit.stream_id} · ${hit.kind} · ${stamp(hit.wall)}${at}` +
      (hit.clip ? " · clip" : "");
    const text = document.createElement("span");
    text.className = "hit-text";
    text.append(...marked(hit.snippet, hit.marks));
    button.append(head, text);
    button.addEventListener("click", () => this.open(hit));
    li.append(button);
    return li;
  }

  close() {
    this.el.video.pause();
    this.el.video.removeAttribute("src");
    this.el.box.hidden = true;
    this.el.box.classList.remove("on");
  }

  async open(hit) {
    this.close();
    if (!hit.clip) {
      this.el.info.textContent = `No clip covers ${hit.stream_id} at ${hit.pts == null ? "this moment" :
        `${hit.pts.toFixed(1)} s`}.` + (hit.links && hit.links.frame ? " The stream is running: see it under Watch cameras." : "");
      return;
    }
    this.el.info.textContent = "Loading the clip…";
    try {
      // The clip's metadata carries a play link a <video src> can open (signed when the API needs a
      // token), so the browser streams it and seeks by Range instead of downloading it whole first.
      const response = await this.api(`/api/clips/${hit.clip.clip_id}`);
      if (!response.ok) throw new Error(await this.errorText(response));
      const clip = await response.json();
      const video = this.el.video;
      video.src = clip.links.play;
      this.el.box.hidden = false;
      this.el.box.classList.add("on");
      video.addEventListener("loadedmetadata", () => { video.currentTime = hit.clip.offset_s; }, { once: true });
      this.el.info.textContent = `${hit.stream_id} · clip ${hit.clip.clip_id.slice(0, 8)} at ${hit.clip.offset_s.toFixed(1)} s`;
      await video.play().catch(() => {});
    } catch (error) {
      this.el.info.textContent = `Could not open the clip: ${error.message}`;
    }
  }
}
