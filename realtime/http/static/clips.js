// The clips of the selected stream: a list, and a player that draws each frame's boxes over the
// video in step with its time and shows its captions as a track. The clips plugin's card
// (realtime/service/plugins/clips.py), in Watch: it gets what it needs from the page (the
// authenticated `api` call, `drawBoxes`) instead of importing the page.

import { Unauthorized } from "./api.js";

const FRAME_SLACK_S = 0.06; // a box set belongs to the frame on screen when within this of its time

function stamp(seconds) {
  const date = new Date(seconds * 1000);
  return date.toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });
}

export class ClipPanel {
  constructor(elements, { api, drawBoxes }) {
    this.el = elements; // list, empty, box, video, overlay, info, said
    this.api = api;
    this.drawBoxes = drawBoxes;
    this.streamId = null;
    this.frames = []; // its frames' objects, by time
    this.size = null; // the video's pixel size the boxes are in
    this.opened = null;
    this.el.video.addEventListener("timeupdate", () => this.draw());
    this.el.video.addEventListener("seeked", () => this.draw());
    this.el.video.addEventListener("loadedmetadata", () => this.draw());
    if ("requestVideoFrameCallback" in HTMLVideoElement.prototype) {
      const onFrame = () => {
        this.draw();
        this.el.video.requestVideoFrameCallback(onFrame);
      };
      this.el.video.requestVideoFrameCallback(onFrame);
    }
    new ResizeObserver(() => this.draw()).observe(this.el.video);
  }

  clear() {
    this.streamId = null;
    this.el.list.replaceChildren();
    this.el.empty.hidden = false;
    this.close();
  }

  close() {
    this.el.video.pause();
    this.el.video.removeAttribute("src");
    for (const track of [...this.el.video.querySelectorAll("track")]) track.remove();
    this.frames = [];
    this.opened = null;
    this.el.box.classList.remove("on");
    this.el.box.hidden = true;
    this.el.info.textContent = "";
    this.el.said.replaceChildren();
  }

  async load(streamId) {
    if (streamId !== this.streamId) this.close();
    this.streamId = streamId;
    const response = await this.api(`/api/clips?stream=${encodeURIComponent(streamId)}`);
    if (this.streamId !== streamId) return;
    if (!response.ok) throw new Error(`clips: HTTP ${response.status}`);
    const clips = (await response.json()).clips || [];
    this.el.empty.hidden = clips.length > 0;
    this.el.list.replaceChildren(...clips.map((clip) => this.item(clip)));
  }

  item(clip) {
    const li = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "clip";
    button.dataset.clip = clip.clip_id;
    const alerts = clip.alert_ids.length;
    button.textContent = `${stamp(clip.created_at)} · ${clip.duration_s.toFixed(1)} s · ` +
      (alerts ? `${alerts} alert${alerts === 1 ? "" : "s"}` : "on request");
    button.setAttribute("aria-pressed", String(this.opened === clip.clip_id));
    button.addEventListener("click", () => this.open(clip).catch((error) => {
      this.el.info.textContent = `Could not open the clip: ${error.message}`;
    }));
    li.append(button);
    return li;
  }

  async open(clip) {
    this.close();
    this.opened = clip.clip_id;
    for (const button of this.el.list.querySelectorAll("button.clip")) {
      button.setAttribute("aria-pressed", String(button.dataset.clip === clip.clip_id));
    }
    this.el.info.textContent = "Loading the clip…";
    // Its metadata again, for fresh `play` links: a <video src> cannot send the API token, so the
    // server signs the media paths for a while; the browser then streams and seeks by Range.
    const [fresh, boxes, said] = await Promise.all([
      this.api(clip.links.self).then((r) => (r.ok ? r.json() : clip)),
      clip.links.boxes ? this.api(clip.links.boxes).then((r) => (r.ok ? r.json() : { frames: [] })) : { frames: [] },
      clip.links.events ? this.api(clip.links.events).then((r) => (r.ok ? r.json() : null)) : null,
    ]);
    if (this.opened !== clip.clip_id) return;
    this.frames = (boxes.frames || []).sort((a, b) => a.t - b.t);
    this.size = { width: clip.width, height: clip.height };
    const links = fresh.links || clip.links;
    if (links.vtt) {
      const track = document.createElement("track");
      track.kind = "captions";
      track.label = "Captions";
      track.default = true;
      track.src = links.play_vtt;
      this.el.video.append(track);
    }
    this.el.said.replaceChildren(...this.saidItems(said));
    this.el.video.src = links.play;
    this.el.box.hidden = false;
    this.el.box.classList.add("on");
    const alerts = clip.alert_ids.length;
    this.el.info.textContent = [
      `${clip.duration_s.toFixed(1)} s`,
      `${(clip.bytes / 1e6).toFixed(1)} MB`,
      `${clip.codec} ${clip.width}x${clip.height}`,
      alerts ? `${alerts} alert${alerts === 1 ? "" : "s"}` : "cut on request",
      `${this.frames.length} frames of boxes`,
    ].join(" · ");
    await this.el.video.play().catch(() => {}); // muted: allowed without a gesture
  }

  saidItems(said) {
    // The alerts it was cut for (their reasons) and the scene descriptions, on the clip's time:
    // a click seeks there. Text only: these are a model's and a camera's words.
    if (!said) return [];
    const lines = [];
    for (const alert of said.alerts || []) {
      if (alert.event !== "start") continue;
      const reason = alert.evidence && typeof alert.evidence.reason === "string" ? `: ${alert.evidence.reason}` : "";
      lines.push([alert.t, `alert ${alert.rule_id}${alert.class ? ` (${alert.class})` : ""}${reason}`]);
    }
    for (const description of said.descriptions || []) lines.push([description.t, description.text]);
    lines.sort((a, b) => (a[0] ?? 0) - (b[0] ?? 0));
    return lines.map(([t, text]) => {
      const li = document.createElement("li");
      const at = t == null ? "" : `${Math.max(0, t).toFixed(1)} s · `;
      li.textContent = `${at}${text}`;
      if (t != null) li.addEventListener("click", () => { this.el.video.currentTime = Math.max(0, t); });
      return li;
    });
  }

  frameAt(time) {
    // The last box set at or before the frame on screen (binary search: clips have thousands).
    let lo = 0;
    let hi = this.frames.length - 1;
    let found = null;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (this.frames[mid].t <= time + FRAME_SLACK_S) {
        found = this.frames[mid];
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    return found;
  }

  draw() {
    const { video, overlay } = this.el;
    const width = video.clientWidth;
    const height = video.clientHeight;
    if (!width || !height || !this.size) return;
    const dpr = window.devicePixelRatio || 1;
    if (overlay.width !== Math.round(width * dpr)) overlay.width = Math.round(width * dpr);
    if (overlay.height !== Math.round(height * dpr)) overlay.height = Math.round(height * dpr);
    const ctx = overlay.getContext("2d");
    ctx.clearRect(0, 0, overlay.width, overlay.height);
    const frame = this.frameAt(video.currentTime);
    const objects = frame ? frame.objects || [] : [];
    const counts = this.drawBoxes(ctx, objects, overlay.width / this.size.width, overlay.height / this.size.height,
      dpr, new Set());
    overlay.dataset.boxes = String(counts.drawn);
    overlay.dataset.time = video.currentTime.toFixed(2);
  }
}

const MARKUP = `<ul id="watch-clips" class="clips"></ul>
<p id="watch-clips-empty" class="muted small">No clips. With <code>clips.enabled</code> each alert
  leaves one: the seconds around it, with its boxes and captions.</p>
<div id="clip-box" class="media-box" hidden>
  <video id="clip-video" controls muted playsinline></video>
  <canvas id="clip-overlay" class="overlay" data-boxes="0"></canvas>
</div>
<p id="clip-info" class="muted small"></p>
<ul id="clip-said" class="said" aria-label="What the clip's alerts and descriptions say"></ul>`;

export default function mount(card, { api, drawBoxes }) {
  card.insertAdjacentHTML("beforeend", MARKUP);
  const $ = (selector) => card.querySelector(selector);
  const clips = new ClipPanel(
    { list: $("ul.clips"), empty: $("#watch-clips-empty"), box: $(".media-box"), video: $("video"),
      overlay: $("canvas.overlay"), info: $("#clip-info"), said: $("ul.said") },
    { api, drawBoxes },
  );
  return {
    show: () => clips.load(clips.streamId).catch(() => {}), // a clip was cut: list them again
    clear: () => {}, // the next selection's list replaces this one (load closes the player)
    select: (id) => clips.load(id).catch((error) => {
      if (!(error instanceof Unauthorized)) clips.el.info.textContent = `Could not list the clips: ${error.message}`;
    }),
  };
}
