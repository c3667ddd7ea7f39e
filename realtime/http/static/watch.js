// Watch cameras: one selected stream at a time, its live video pulled over WHEP (whep.js) with the
// boxes of each frame drawn over that frame, and its events read as server-sent events: each handed
// to the mode's router, for the picture drawn here and for the cards below it (whatever the server
// declared). A stream whose video the service does not forward (not H.264, a browser session) or a
// player that fails falls back to the latest frame polled as a JPEG, with a line saying why. Its
// own module: it gets the authenticated `api` call, the router and the test hooks from the page
// instead of importing the page; the stream list it picks from is its own.

import { AlertBook } from "./alerts.js";
import { Unauthorized } from "./api.js";
import { drawBoxes } from "./overlay.js";
import { readSse } from "./sse.js";
import { StreamList } from "./streams.js";
import { NotOffered, WhepPlayer } from "./whep.js";

const FRAME_EVERY_MS = 500; // frame.jpg is encoded at most every 0.5 s anyway
const EVENTS_RETRY_MS = 3000;
const KEEP_DETECTIONS = 100; // enough to match a frame a few seconds old to its boxes
const SAME_FRAME_S = 0.002; // pts of one frame, through the 90 kHz RTP clock and back
const KEEP_LATENCIES = 2000;
const HOLD_MARGIN_MS = 60;

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}

export class WatchPanel {
  constructor(el, { api, errorText, pageNotice, hooks, router }) {
    this.el = el; // title, meta, canvas, placeholder, frame, streams: {list, empty}
    this.api = api;
    this.errorText = errorText;
    this.hooks = hooks;
    this.router = router; // EventRouter: the cards below the frame, and the kinds drawn here
    this.alerts = new AlertBook(); // which tracks to draw in the warning colour
    // "stream" is no kind: the SSE stream's own first event, the stream as listed.
    router.on(["stream"], (_kind, body) => this.showStreamMeta(body));
    router.on(["detections"], (_kind, body) => this.showDetections(body));
    router.on(["alerts"], (_kind, body) => {
      this.alerts.update(body);
      this.draw();
    });
    router.on(["status"], (_kind, body) => this.showStreamMeta({ ...this.meta, state: body.state, reason: body.reason }));
    this.streams = new StreamList(el.streams, {
      api,
      errorText,
      pageNotice,
      onPick: (id) => this.select(id),
      onListed: (stream) => this.showStreamMeta(stream),
      onGone: () => this.note("This stream is gone."),
    });
    this.selected = null;
    this.abort = null;
    this.detections = []; // the last KEEP_DETECTIONS detections bodies of the selected stream
    this.frames = 0;
    this.bitmap = null;
    this.seq = null;
    this.meta = {}; // the selected stream as last listed
    this.player = null; // the WHEP player while live video plays
    this.shown = new Map(); // pts -> when its frame was shown, for frames whose boxes had not come yet
    this.holdMs = 0;
  }

  start() {
    if (this.streams.running) return;
    this.streams.start();
    if (this.selected) this.select(this.selected);
  }

  stop() {
    this.streams.stop();
    if (this.abort) this.abort.abort();
    this.abort = null;
    this.stopLive();
  }

  stopLive() {
    if (this.player) this.player.stop();
    this.player = null;
    this.el.video.srcObject = null;
    this.el.live.classList.remove("on");
  }

  showStreamMeta(stream) {
    this.meta = stream;
    const parts = [stream.kind || "camera", stream.state];
    if (stream.reason) parts.push(stream.reason);
    this.el.meta.textContent = parts.join(" · ");
  }

  note(text) {
    const note = this.el.placeholder;
    note.textContent = text;
    note.hidden = !text;
    note.classList.toggle("over", this.el.canvas.classList.contains("on") || this.el.live.classList.contains("on"));
  }

  select(id) {
    if (this.abort) this.abort.abort();
    this.stopLive();
    const abort = (this.abort = new AbortController());
    if (this.selected !== id) {
      this.selected = id;
      this.detections = [];
      this.frames = 0;
      this.alerts.clear();
      this.router.clear();
      this.seq = null;
      this.meta = {};
      this.el.meta.textContent = "";
      this.el.frame.textContent = "";
      if (this.bitmap) this.bitmap.close();
      this.bitmap = null;
      const canvas = this.el.canvas;
      canvas.classList.remove("on");
      canvas.dataset.boxes = "0";
      canvas.dataset.alerted = "0";
      canvas.dataset.frames = "0";
    }
    this.hooks.watch = { streamId: id, boxesDrawn: 0, messages: 0, live: false, fallback: null, videoFrames: 0,
      matched: 0, unmatched: 0, latenciesMs: [], holdMs: 0 };
    this.shown.clear();
    this.holdMs = 0;
    this.router.select(id, abort.signal); // e.g. the clips listed, the scene as last described
    this.el.title.textContent = id;
    this.streams.mark(id);
    this.note(this.bitmap ? "" : "Loading the latest frame…");
    this.readEvents(id, abort.signal);
    this.watchLive(id, abort.signal);
  }

  // Live video over WHEP; the JPEG poll when the stream has none or the player fails.
  async watchLive(id, signal) {
    const player = new WhepPlayer(this.api, this.errorText);
    try {
      if (!("requestVideoFrameCallback" in HTMLVideoElement.prototype)) {
        throw new NotOffered("this browser cannot tell which frame it shows, so boxes could not be drawn on it");
      }
      await player.start(id, this.el.video, signal);
    } catch (error) {
      player.stop();
      if (signal.aborted || error instanceof Unauthorized) return;
      const why = error instanceof NotOffered ? error.message : `the player failed: ${error.message}`;
      this.hooks.watch.fallback = why;
      this.el.fallback.textContent = `No live video (${why}): showing the latest processed frame every 0.5 s.`;
      this.pollFrames(id, signal);
      return;
    }
    if (signal.aborted) {
      player.stop();
      return;
    }
    this.player = player;
    this.hooks.watch.live = true;
    this.el.fallback.textContent = "";
    this.el.canvas.classList.remove("on");
    this.el.live.classList.add("on");
    this.note("Starting the live video…");
    const video = this.el.video;
    const onFrame = (now, metadata) => {
      if (this.player !== player) return;
      this.onVideoFrame(metadata);
      video.requestVideoFrameCallback(onFrame);
    };
    video.requestVideoFrameCallback(onFrame);
  }

  // A frame the video shows: its boxes (matched by pts) drawn over it; its glass-to-glass latency
  // (the time its frame reached the service, from its detections, against when it is shown).
  onVideoFrame(metadata) {
    const watch = this.hooks.watch;
    watch.videoFrames += 1;
    this.note("");
    const pts = this.player.ptsOf(metadata);
    const shownAt = performance.timeOrigin + metadata.expectedDisplayTime;
    // Only the frame's own boxes: another frame's would sit beside the objects as they move.
    let body = null;
    if (pts !== null) {
      body = this.detectionsAt(pts, SAME_FRAME_S);
      if (body) {
        watch.matched += 1;
        this.latency(body, shownAt);
      } else {
        this.shown.set(pts, shownAt); // its boxes may still come: they say how long to hold frames
        if (this.shown.size > KEEP_DETECTIONS) this.shown.delete(this.shown.keys().next().value);
        watch.unmatched += 1;
      }
    }
    this.drawLive(body, pts);
  }

  latency(body, shownAt) {
    const captured = Date.parse(body.captured_at);
    if (!Number.isFinite(captured)) return;
    const list = this.hooks.watch.latenciesMs;
    list.push(shownAt - captured);
    if (list.length > KEEP_LATENCIES) list.shift();
  }

  // The median glass-to-glass latency of the last frames shown, in words.
  glassToGlass() {
    const recent = this.hooks.watch.latenciesMs.slice(-50).sort((a, b) => a - b);
    if (recent.length < 5) return "";
    return `${Math.round(recent[Math.floor(recent.length / 2)])} ms glass to glass`;
  }

  // The detections of the frame at `pts`, within `tolerance` seconds; the closest one.
  detectionsAt(pts, tolerance) {
    let best = null;
    for (const body of this.detections) {
      if (typeof body.pts !== "number") continue;
      const off = Math.abs(body.pts - pts);
      if (off <= tolerance && (!best || off < Math.abs(best.pts - pts))) best = body;
    }
    return best;
  }

  // Boxes that came after their frame was shown say how long frames should be held back.
  lateBoxes(body) {
    if (!this.player || typeof body.pts !== "number") return;
    for (const [pts, shownAt] of this.shown) {
      if (Math.abs(pts - body.pts) <= SAME_FRAME_S) {
        this.shown.delete(pts);
        this.latency(body, shownAt);
        const late = performance.timeOrigin + performance.now() - shownAt;
        if (late > 0 && late + HOLD_MARGIN_MS > this.holdMs) {
          this.holdMs = Math.min(2000, late + HOLD_MARGIN_MS);
          this.hooks.watch.holdMs = this.holdMs;
          this.player.holdFor(this.holdMs);
        }
        return;
      }
    }
  }

  drawLive(body, pts) {
    const video = this.el.video;
    const canvas = this.el.overlay;
    const width = video.videoWidth;
    const height = video.videoHeight;
    if (!width || !height) return;
    if (canvas.width !== width) canvas.width = width;
    if (canvas.height !== height) canvas.height = height;
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, width, height);
    let counts = { drawn: 0, warned: 0, masks: 0 };
    if (body) {
      const unit = width / (video.clientWidth || width);
      counts = drawBoxes(ctx, body.objects || [], width / body.width, height / body.height, unit,
        this.alerts.alertedTracks());
    }
    canvas.dataset.boxes = String(counts.drawn);
    canvas.dataset.frames = String(this.hooks.watch.videoFrames);
    this.hooks.watch.boxesDrawn = counts.drawn;
    const active = this.alerts.activeCount();
    this.el.frame.textContent = [
      "live video",
      pts === null ? "waiting for the frame clock" : `pts ${pts.toFixed(2)} s`,
      body ? `${counts.drawn} box${counts.drawn === 1 ? "" : "es"}` : "no boxes for this frame (yet)",
      body && body.inference === "predicted" ? "predicted by the tracker (dashed)" : "",
      this.holdMs ? `held ${Math.round(this.holdMs)} ms for the boxes` : "",
      this.glassToGlass(),
      active ? `${active} active alert${active === 1 ? "" : "s"}` : "",
    ].filter(Boolean).join(" · ");
  }

  async readEvents(id, signal) {
    let lastId = null; // as EventSource does: a reconnect resumes after the last event seen
    while (!signal.aborted) {
      try {
        const headers = { Accept: "text/event-stream" };
        if (lastId) headers["Last-Event-ID"] = lastId;
        const response = await this.api(`/api/streams/${encodeURIComponent(id)}/events`, { signal, headers });
        if (response.ok) {
          await readSse(response.body, signal, (name, data) => this.onEvent(name, data), (value) => (lastId = value));
        } else if (response.status === 404) {
          return; // the frame poll says the stream is gone
        } else {
          this.note(`Events unavailable: ${await this.errorText(response)}`);
        }
      } catch (error) {
        if (signal.aborted || error instanceof Unauthorized) return;
      }
      await sleep(EVENTS_RETRY_MS, signal);
    }
  }

  onEvent(name, data) {
    let body;
    try {
      body = JSON.parse(data);
    } catch {
      return;
    }
    this.hooks.watch.messages += 1;
    this.router.dispatch(name, body);
  }

  showDetections(body) {
    this.frames += 1;
    this.el.canvas.dataset.frames = String(this.frames);
    this.detections.push(body);
    if (this.detections.length > KEEP_DETECTIONS) this.detections.shift();
    if (this.player) {
      this.lateBoxes(body);
      return;
    }
    // The JPEG can arrive before its frame's event: redraw once the boxes that match it are in.
    if (body.frame_seq === this.seq) this.draw();
  }

  async pollFrames(id, signal) {
    const path = `/api/streams/${encodeURIComponent(id)}/frame.jpg`;
    while (!signal.aborted) {
      const started = performance.now();
      try {
        const response = await this.api(path, { signal });
        if (response.ok) {
          const seq = Number(response.headers.get("X-Frame-Seq"));
          const bitmap = await createImageBitmap(await response.blob());
          if (signal.aborted) {
            bitmap.close();
            return;
          }
          if (this.bitmap) this.bitmap.close();
          this.bitmap = bitmap;
          this.seq = seq;
          this.note("");
          this.draw();
        } else {
          const reason = await this.errorText(response);
          if (reason === "unknown stream") this.note("This stream is gone.");
          else if (reason === "no frame yet") this.note("Waiting for the first processed frame…");
          else this.note(`No frame: ${reason}`);
        }
      } catch (error) {
        if (signal.aborted || error instanceof Unauthorized) return;
        this.note(`Could not load the frame: ${error.message}`);
      }
      await sleep(Math.max(0, FRAME_EVERY_MS - (performance.now() - started)), signal);
    }
  }

  // The detections of the frame shown: the event with the same frame_seq, else the newest.
  detectionsFor(seq) {
    for (let i = this.detections.length - 1; i >= 0; i -= 1) {
      if (this.detections[i].frame_seq === seq) return this.detections[i];
    }
    return this.detections[this.detections.length - 1] || null;
  }

  draw() {
    if (this.player) return; // the live video draws its own boxes, frame by frame
    const bitmap = this.bitmap;
    if (!bitmap) return;
    const canvas = this.el.canvas;
    if (canvas.width !== bitmap.width) canvas.width = bitmap.width;
    if (canvas.height !== bitmap.height) canvas.height = bitmap.height;
    canvas.classList.add("on");
    const ctx = canvas.getContext("2d");
    ctx.drawImage(bitmap, 0, 0);
    const body = this.detectionsFor(this.seq);
    let counts = { drawn: 0, warned: 0, masks: 0 };
    if (body) {
      const shown = canvas.clientWidth || bitmap.width;
      const unit = bitmap.width / shown;
      counts = drawBoxes(ctx, body.objects || [], bitmap.width / body.width, bitmap.height / body.height, unit,
        this.alerts.alertedTracks());
    }
    const drawn = counts.drawn;
    canvas.dataset.boxes = String(drawn);
    canvas.dataset.alerted = String(counts.warned);
    canvas.dataset.masks = String(counts.masks);
    this.hooks.watch.boxesDrawn = drawn;
    const matched = body && body.frame_seq === this.seq ? "" : " (boxes of a nearby frame)";
    const tracked = body ? (body.objects || []).filter((o) => o.track_id != null).length : 0;
    const active = this.alerts.activeCount();
    this.el.frame.textContent = [
      `frame ${this.seq}`,
      `${drawn} box${drawn === 1 ? "" : "es"}${matched}`,
      body && body.inference === "predicted" ? "predicted by the tracker (dashed)" : "",
      `${tracked} tracked`,
      active ? `${active} active alert${active === 1 ? "" : "s"}` : "",
    ].filter(Boolean).join(" · ");
  }
}
