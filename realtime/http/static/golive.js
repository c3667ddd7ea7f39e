// Go live: this browser's camera and microphone sent to the service over WebRTC, published with
// WHIP (`POST /whip/{stream}`, the path OBS and GStreamer use too), and what the service makes of
// them read back over a DataChannel: boxes drawn over the video here, every event
// handed to the mode's router for the cards beside it (captions, the scene, alerts: whatever the
// server declared). Its own module: it gets the authenticated `api` call, the router and the test
// hooks from the page instead of importing the page.

import { AlertBook } from "./alerts.js";
import { Unauthorized } from "./api.js";
import { drawBoxes } from "./overlay.js";

const FPS_WINDOW_MS = 2000;
const STALE_OVERLAY_MS = 1500; // boxes older than this are cleared, not left on a moving picture
const ICE_GATHER_TIMEOUT_MS = 5000;
const CLOSE_TOKEN_HEADER = "Vidsentry-Close-Token"; // for the pagehide beacon, which cannot DELETE

// The speaker's language and an English line, as the WHIP URL gives a session its own captions
// settings (`?captions.language=es`). Another language than English needs the multilingual model:
// a service that has not installed it refuses with the reason, shown as the notice.
export function captionsQuery(language, translate) {
  const params = new URLSearchParams();
  if (language || translate) {
    if (language !== "en" || translate) params.set("captions.model", "base");
    if (language) params.set("captions.language", language);
    if (translate) params.set("captions.translate", "en");
  }
  const query = params.toString();
  return query ? `?${query}` : "";
}

// A stream id of the shape the service gives browser sessions: the WHIP URL names the stream.
function sessionStreamId() {
  const bytes = crypto.getRandomValues(new Uint8Array(4));
  return `webrtc-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

const STATE_TEXT = {
  idle: "idle",
  starting: "starting…",
  new: "connecting…",
  connecting: "connecting…",
  connected: "live",
  disconnected: "interrupted",
  failed: "failed",
  closed: "stopped",
  error: "not started",
};

const AUDIO = { echoCancellation: false, noiseSuppression: false, autoGainControl: false };

function mediaErrorText(error) {
  switch (error && error.name) {
    case "NotAllowedError":
    case "SecurityError":
      return "Camera and microphone access was denied. Allow it in the browser's site settings, then press Start again.";
    case "NotFoundError":
    case "OverconstrainedError":
      return "No camera was found. Connect one, then press Start again.";
    case "NotReadableError":
      return "The camera is in use by another application or could not be opened.";
    default:
      return `Could not open the camera: ${(error && error.message) || error}`;
  }
}

function iceGatheringDone(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      if (pc.iceGatheringState !== "complete") return;
      pc.removeEventListener("icegatheringstatechange", done);
      resolve();
    };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, ICE_GATHER_TIMEOUT_MS); // send what was gathered rather than hang
  });
}

export class LivePanel {
  constructor(el, { api, errorText, hooks, router }) {
    this.el = el; // start, stop, state, notice, session, fps, lag, box, video, overlay, placeholder, language, translate
    this.api = api;
    this.errorText = errorText;
    this.hooks = hooks;
    this.router = router; // EventRouter: the cards beside the video, and the kinds drawn here
    this.alerts = new AlertBook(); // which tracks to draw in the warning colour
    router.on(["detections"], (_kind, body, message) => this.showDetections(body, message));
    router.on(["alerts"], (_kind, body) => {
      this.alerts.update(body);
      this.drawOverlay();
    });
    router.on(["status"], (_kind, body) => {
      if (body.reason && (body.state === "failed" || body.state === "stopped")) this.notice(body.reason, "info");
    });
    this.attempt = 0; // counts Starts and Stops: an older Start that resumes after either gives up
    this.pc = null;
    this.media = null;
    this.session = null; // {streamId, closeToken, location}: location is the WHIP resource
    this.frames = 0;
    this.arrivals = []; // arrival times of detections messages within FPS_WINDOW_MS
    this.lagMs = null;
    this.last = null; // {body, at}
    el.start.addEventListener("click", () => this.start());
    el.stop.addEventListener("click", () => this.stop());
    new ResizeObserver(() => this.drawOverlay()).observe(el.video);
    setInterval(() => this.renderStats(), 500);
    window.addEventListener("pagehide", () => {
      const { session, pc } = this;
      if (session) {
        // sendBeacon cannot send headers: the session's close token is its authority.
        const body = JSON.stringify({ stream_id: session.streamId, close_token: session.closeToken });
        navigator.sendBeacon("/api/webrtc/close", new Blob([body], { type: "text/plain" }));
      }
      if (pc) pc.close();
    });
    this.setState("idle");
  }

  setState(state) {
    this.hooks.state = state;
    document.body.dataset.state = state;
    const pill = this.el.state;
    pill.dataset.state = state;
    pill.textContent = STATE_TEXT[state] || state;
    const busy = this.pc !== null || this.media !== null || state === "starting";
    this.el.start.disabled = busy;
    this.el.stop.disabled = !busy;
    for (const choice of [this.el.language, this.el.translate]) if (choice) choice.disabled = busy;
  }

  notice(text, kind = "error") {
    const notice = this.el.notice;
    notice.textContent = text;
    notice.dataset.kind = kind;
    notice.hidden = !text;
  }

  // The ICE servers the service is configured with (webrtc.ice_servers; none by default).
  async iceServers() {
    const response = await this.api("/api/webrtc/config");
    if (!response.ok) throw new Error(await this.errorText(response));
    const body = await response.json();
    return (body.ice_servers || []).map((server) => ({
      urls: server.urls,
      ...(server.username ? { username: server.username } : {}),
      ...(server.credential ? { credential: server.credential } : {}),
    }));
  }

  async openMedia() {
    try {
      return await navigator.mediaDevices.getUserMedia({ video: true, audio: AUDIO });
    } catch (error) {
      if (error.name !== "NotFoundError") throw error;
      // A camera without a microphone still goes live: no captions, boxes as usual.
      const media = await navigator.mediaDevices.getUserMedia({ video: true });
      this.notice("No microphone found: going live with video only.", "info");
      return media;
    }
  }

  async start() {
    if (!navigator.mediaDevices || !window.RTCPeerConnection) {
      this.notice("This browser cannot share a camera here (it needs HTTPS or localhost, and WebRTC).");
      return;
    }
    const attempt = ++this.attempt; // Stop, or another Start, makes this one stale
    const current = () => attempt === this.attempt;
    this.notice("");
    this.reset();
    this.setState("starting");
    let media;
    try {
      media = await this.openMedia();
    } catch (error) {
      if (!current()) return;
      this.notice(mediaErrorText(error));
      this.setState("error");
      return;
    }
    if (!current()) {
      for (const track of media.getTracks()) track.stop();
      return;
    }
    this.media = media;
    this.el.video.srcObject = media;
    this.el.box.classList.add("on");
    this.el.placeholder.hidden = true;

    let servers;
    try {
      servers = await this.iceServers();
    } catch (error) {
      if (!current()) return;
      this.stop("error");
      if (!(error instanceof Unauthorized)) this.notice(`Could not reach the server: ${error.message || error}`);
      return;
    }
    if (!current()) return; // Stop (or another Start) released the media already
    const pc = (this.pc = new RTCPeerConnection({ iceServers: servers }));
    for (const track of media.getTracks()) pc.addTrack(track, media);
    const channel = pc.createDataChannel("events");
    channel.addEventListener("message", (event) => this.onMessage(event));
    channel.addEventListener("close", () => {
      if (this.pc !== pc) return; // closed by Stop
      this.session = null; // the server ended it: nothing to DELETE
      this.notice("The server ended the session.", "info");
      this.stop();
    });
    pc.addEventListener("connectionstatechange", () => {
      if (this.pc !== pc) return;
      this.setState(pc.connectionState);
      if (pc.connectionState === "failed") {
        this.notice("The connection to the server failed.");
        this.stop("failed");
      }
    });
    try {
      await pc.setLocalDescription(await pc.createOffer());
      await iceGatheringDone(pc);
      if (!current()) return;
      const streamId = sessionStreamId();
      const query = captionsQuery(this.el.language && this.el.language.value, this.el.translate && this.el.translate.checked);
      const response = await this.api(`/whip/${streamId}${query}`, {
        method: "POST",
        headers: { "Content-Type": "application/sdp" },
        body: pc.localDescription.sdp,
      });
      if (!response.ok) {
        const reason = await this.errorText(response);
        if (!current()) return;
        this.notice(response.status === 503 ? `The server is full: ${reason}` : `The server refused the session: ${reason}`);
        this.stop("error");
        return;
      }
      const location = response.headers.get("Location");
      const answer = await response.text();
      if (!current()) {
        this.deleteSession(location); // stopped while the server was answering
        return;
      }
      this.session = { streamId, closeToken: response.headers.get(CLOSE_TOKEN_HEADER), location };
      this.hooks.streamId = streamId;
      this.el.session.textContent = streamId;
      await pc.setRemoteDescription({ type: "answer", sdp: answer });
    } catch (error) {
      if (!current()) return;
      if (error instanceof Unauthorized) {
        this.stop("idle");
        return; // the token form is up; Start again once it is in
      }
      this.notice(`Could not go live: ${error.message || error}`);
      this.stop("error");
    }
  }

  // WHIP's end of a session: DELETE on its resource. Bounded, so a server that does not answer
  // cannot hold anything up.
  deleteSession(location) {
    if (!location) return Promise.resolve(); // a 201 without Location: nothing to DELETE
    return this.api(location, { method: "DELETE", signal: AbortSignal.timeout(3000) })
      .catch(() => {
        // already gone, or no token: the session ends with its connection anyway
      });
  }

  stop(finalState = "closed") {
    const { pc, media, session } = this;
    this.attempt += 1;
    this.pc = null;
    this.media = null;
    this.session = null;
    if (media) for (const track of media.getTracks()) track.stop();
    this.el.video.srcObject = null;
    this.el.box.classList.remove("on");
    this.el.placeholder.hidden = false;
    this.clearOverlay();
    this.setState(finalState);
    if (!pc) return;
    if (!session) {
      pc.close();
      return;
    }
    // DELETE first, then close: closing first would end the session by its DataChannel and make
    // the DELETE a 404.
    this.deleteSession(session.location).finally(() => pc.close());
  }

  reset() {
    this.frames = 0;
    this.arrivals = [];
    this.lagMs = null;
    this.last = null;
    this.hooks.messages = 0;
    this.hooks.streamId = null;
    this.el.overlay.dataset.frames = "0";
    this.el.session.textContent = "–";
    this.alerts.clear();
    this.router.clear();
    this.renderStats();
  }

  onMessage(event) {
    let message;
    try {
      message = JSON.parse(event.data);
    } catch {
      return;
    }
    const { kind, body } = message || {};
    if (!body) return;
    this.hooks.messages += 1;
    this.router.dispatch(kind, body, message); // tracks: none; the boxes carry their track ids already
  }

  showDetections(body, message) {
    const now = performance.now();
    this.frames += 1;
    this.el.overlay.dataset.frames = String(this.frames);
    this.arrivals.push(now);
    if (typeof message.lag_ms === "number") {
      this.lagMs = this.lagMs === null ? message.lag_ms : this.lagMs + 0.2 * (message.lag_ms - this.lagMs);
    }
    this.last = { body, at: now };
    this.drawOverlay();
  }

  drawOverlay() {
    const video = this.el.video;
    const canvas = this.el.overlay;
    // The canvas covers the video's box exactly (CSS); its pixels follow the displayed size.
    const width = video.clientWidth;
    const height = video.clientHeight;
    const dpr = window.devicePixelRatio || 1;
    const pixelsWide = Math.round(width * dpr);
    const pixelsHigh = Math.round(height * dpr);
    if (canvas.width !== pixelsWide || canvas.height !== pixelsHigh) {
      canvas.width = pixelsWide;
      canvas.height = pixelsHigh;
    }
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    let counts = { drawn: 0, warned: 0, masks: 0 };
    const last = this.last;
    if (last && width > 0 && performance.now() - last.at < STALE_OVERLAY_MS) {
      const { body } = last;
      const sx = pixelsWide / body.width;
      const sy = pixelsHigh / body.height;
      counts = drawBoxes(ctx, body.objects || [], sx, sy, dpr, this.alerts.alertedTracks());
    }
    canvas.dataset.boxes = String(counts.drawn);
    canvas.dataset.alerted = String(counts.warned);
    canvas.dataset.masks = String(counts.masks);
    this.hooks.boxesDrawn = counts.drawn;
  }

  clearOverlay() {
    this.last = null;
    this.drawOverlay();
  }

  renderStats() {
    const now = performance.now();
    while (this.arrivals.length && this.arrivals[0] < now - FPS_WINDOW_MS) this.arrivals.shift();
    const running = this.pc !== null;
    this.el.fps.textContent = running && this.frames ? (this.arrivals.length / (FPS_WINDOW_MS / 1000)).toFixed(1) : "–";
    this.el.lag.textContent = running && this.lagMs !== null ? `${Math.round(this.lagMs)} ms` : "–";
    if (this.last && now - this.last.at >= STALE_OVERLAY_MS) this.clearOverlay();
  }
}
