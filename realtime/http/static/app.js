// vidsentry's page: go live from this browser over WebRTC, or watch the service's cameras.
// Plain modern JavaScript served as is: no build step, no framework, nothing from another origin.

import { AlertList } from "./alerts.js";
import { Unauthorized, createApi, errorText } from "./api.js";
import { CaptionPanel } from "./captions.js";
import { ClipPanel } from "./clips.js";
import { drawBoxes } from "./overlay.js";
import { ScenePanel } from "./scene.js";
import { readSse } from "./sse.js";
import { TimelinePanel } from "./timeline.js";

const $ = (id) => document.getElementById(id);

const LIST_EVERY_MS = 2000;
const FRAME_EVERY_MS = 500; // frame.jpg is encoded at most every 0.5 s anyway
const EVENTS_RETRY_MS = 3000;
const KEEP_DETECTIONS = 50; // enough to match a frame a few seconds old to its boxes
const FPS_WINDOW_MS = 2000;
const STALE_OVERLAY_MS = 1500; // boxes older than this are cleared, not left on a moving picture
const ICE_GATHER_TIMEOUT_MS = 5000;

// The ICE servers the service is configured with (webrtc.ice_servers; none by default).
async function iceServers() {
  const response = await api("/api/webrtc/config");
  if (!response.ok) throw new Error(await errorText(response));
  const body = await response.json();
  return (body.ice_servers || []).map((server) => ({
    urls: server.urls,
    ...(server.username ? { username: server.username } : {}),
    ...(server.credential ? { credential: server.credential } : {}),
  }));
}

// Test hooks (and a handle for anyone poking at the page from the console).
const hooks = {
  streamId: null,
  state: "idle",
  boxesDrawn: 0,
  messages: 0,
  watch: { streamId: null, boxesDrawn: 0, messages: 0 },
};
window.vidsentry = hooks;

// -- API calls and the token --------------------------------------------------------------------

const { api, unlock, pageNotice } = createApi(
  { app: $("app"), panel: $("token-panel"), form: $("token-form"), input: $("token-input"),
    message: $("token-message"), notice: $("page-notice") },
  { onLocked: () => stopWatching(), onUnlocked: () => showMode(currentMode()) },
);

// -- Modes -------------------------------------------------------------------------------------

const MODES = ["live", "watch", "ask"];

function currentMode() {
  const mode = location.hash.slice(1);
  return MODES.includes(mode) ? mode : "live";
}

function showMode(mode) {
  for (const tab of document.querySelectorAll("[role=tab]")) {
    const on = tab.dataset.mode === mode;
    tab.setAttribute("aria-selected", String(on));
    $(tab.getAttribute("aria-controls")).hidden = !on;
  }
  if (document.body.dataset.auth !== "ok") return;
  if (mode === "watch") startWatching();
  else stopWatching();
}

// -- Go live ---------------------------------------------------------------------------------

const live = {
  attempt: 0, // counts Starts and Stops: an older Start that resumes after either gives up
  pc: null,
  media: null,
  session: null, // {streamId, closeToken}
  frames: 0,
  arrivals: [], // arrival times of detections messages within FPS_WINDOW_MS
  lagMs: null,
  last: null, // {body, at}
  alerts: null,
  captions: null,
  scene: null,
};

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

function setLiveState(state) {
  hooks.state = state;
  document.body.dataset.state = state;
  const pill = $("live-state");
  pill.dataset.state = state;
  pill.textContent = STATE_TEXT[state] || state;
  const busy = live.pc !== null || live.media !== null || state === "starting";
  $("start").disabled = busy;
  $("stop").disabled = !busy;
}

function liveNotice(text, kind = "error") {
  const notice = $("live-notice");
  notice.textContent = text;
  notice.dataset.kind = kind;
  notice.hidden = !text;
}

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

const AUDIO = { echoCancellation: false, noiseSuppression: false, autoGainControl: false };

async function openMedia() {
  try {
    return await navigator.mediaDevices.getUserMedia({ video: true, audio: AUDIO });
  } catch (error) {
    if (error.name !== "NotFoundError") throw error;
    // A camera without a microphone still goes live: no captions, boxes as usual.
    const media = await navigator.mediaDevices.getUserMedia({ video: true });
    liveNotice("No microphone found: going live with video only.", "info");
    return media;
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

async function startLive() {
  if (!navigator.mediaDevices || !window.RTCPeerConnection) {
    liveNotice("This browser cannot share a camera here (it needs HTTPS or localhost, and WebRTC).");
    return;
  }
  const attempt = ++live.attempt; // Stop, or another Start, makes this one stale
  const current = () => attempt === live.attempt;
  liveNotice("");
  resetLiveView();
  setLiveState("starting");
  let media;
  try {
    media = await openMedia();
  } catch (error) {
    if (!current()) return;
    liveNotice(mediaErrorText(error));
    setLiveState("error");
    return;
  }
  if (!current()) {
    for (const track of media.getTracks()) track.stop();
    return;
  }
  live.media = media;
  $("live-video").srcObject = media;
  $("live-box").classList.add("on");
  $("live-placeholder").hidden = true;

  let servers;
  try {
    servers = await iceServers();
  } catch (error) {
    if (!current()) return;
    stopLive("error");
    if (!(error instanceof Unauthorized)) liveNotice(`Could not reach the server: ${error.message || error}`);
    return;
  }
  if (!current()) return; // Stop (or another Start) released the media already
  const pc = (live.pc = new RTCPeerConnection({ iceServers: servers }));
  for (const track of media.getTracks()) pc.addTrack(track, media);
  const channel = pc.createDataChannel("events");
  channel.addEventListener("message", onLiveMessage);
  channel.addEventListener("close", () => {
    if (live.pc !== pc) return; // closed by Stop
    live.session = null; // the server ended it: nothing to DELETE
    liveNotice("The server ended the session.", "info");
    stopLive();
  });
  pc.addEventListener("connectionstatechange", () => {
    if (live.pc !== pc) return;
    setLiveState(pc.connectionState);
    if (pc.connectionState === "failed") {
      liveNotice("The connection to the server failed.");
      stopLive("failed");
    }
  });
  try {
    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringDone(pc);
    if (!current()) return;
    const offer = pc.localDescription;
    const response = await api("/api/webrtc/offer", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ sdp: offer.sdp, type: offer.type }),
    });
    if (!response.ok) {
      const reason = await errorText(response);
      if (!current()) return;
      liveNotice(response.status === 503 ? `The server is full: ${reason}` : `The server refused the session: ${reason}`);
      stopLive("error");
      return;
    }
    const answer = await response.json();
    if (!current()) {
      deleteSession(answer.stream_id); // stopped while the server was answering
      return;
    }
    live.session = { streamId: answer.stream_id, closeToken: answer.close_token };
    hooks.streamId = answer.stream_id;
    $("live-session").textContent = answer.stream_id;
    await pc.setRemoteDescription({ type: answer.type, sdp: answer.sdp });
  } catch (error) {
    if (!current()) return;
    if (error instanceof Unauthorized) {
      stopLive("idle");
      return; // the token form is up; Start again once it is in
    }
    liveNotice(`Could not go live: ${error.message || error}`);
    stopLive("error");
  }
}

// Bounded, so a server that does not answer cannot hold anything up.
function deleteSession(streamId) {
  return api(`/api/streams/${encodeURIComponent(streamId)}`, { method: "DELETE", signal: AbortSignal.timeout(3000) })
    .catch(() => {
      // already gone, or no token: the session ends with its connection anyway
    });
}

function stopLive(finalState = "closed") {
  const { pc, media, session } = live;
  live.attempt += 1;
  live.pc = null;
  live.media = null;
  live.session = null;
  if (media) for (const track of media.getTracks()) track.stop();
  $("live-video").srcObject = null;
  $("live-box").classList.remove("on");
  $("live-placeholder").hidden = false;
  clearOverlay();
  setLiveState(finalState);
  if (!pc) return;
  if (!session) {
    pc.close();
    return;
  }
  // DELETE first, then close: closing first would end the session by its DataChannel and make
  // the DELETE a 404.
  deleteSession(session.streamId).finally(() => pc.close());
}

function resetLiveView() {
  live.frames = 0;
  live.arrivals = [];
  live.lagMs = null;
  live.last = null;
  hooks.messages = 0;
  hooks.streamId = null;
  $("live-overlay").dataset.frames = "0";
  $("live-session").textContent = "–";
  live.alerts.clear();
  live.captions.clear();
  live.scene.clear();
  renderLiveStats();
}

function onLiveMessage(event) {
  let message;
  try {
    message = JSON.parse(event.data);
  } catch {
    return;
  }
  const { kind, body } = message || {};
  if (!body) return;
  hooks.messages += 1;
  switch (kind) {
    case "detections": {
      const now = performance.now();
      live.frames += 1;
      $("live-overlay").dataset.frames = String(live.frames);
      live.arrivals.push(now);
      if (typeof message.lag_ms === "number") {
        live.lagMs = live.lagMs === null ? message.lag_ms : live.lagMs + 0.2 * (message.lag_ms - live.lagMs);
      }
      live.last = { body, at: now };
      drawLiveOverlay();
      break;
    }
    case "alerts":
      live.alerts.update(body);
      drawLiveOverlay();
      break;
    case "partials":
      live.captions.partial(body);
      break;
    case "captions":
      live.captions.final(body);
      break;
    case "descriptions":
      live.scene.show(body);
      break;
    case "status":
      if (body.reason && (body.state === "failed" || body.state === "stopped")) liveNotice(body.reason, "info");
      break;
    default:
      break; // tracks: the boxes carry their track ids already
  }
}

function drawLiveOverlay() {
  const video = $("live-video");
  const canvas = $("live-overlay");
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
  const last = live.last;
  if (last && width > 0 && performance.now() - last.at < STALE_OVERLAY_MS) {
    const { body } = last;
    const sx = pixelsWide / body.width;
    const sy = pixelsHigh / body.height;
    counts = drawBoxes(ctx, body.objects || [], sx, sy, dpr, live.alerts.alertedTracks());
  }
  canvas.dataset.boxes = String(counts.drawn);
  canvas.dataset.alerted = String(counts.warned);
  canvas.dataset.masks = String(counts.masks);
  hooks.boxesDrawn = counts.drawn;
}

function clearOverlay() {
  live.last = null;
  drawLiveOverlay();
}

function renderLiveStats() {
  const now = performance.now();
  while (live.arrivals.length && live.arrivals[0] < now - FPS_WINDOW_MS) live.arrivals.shift();
  const running = live.pc !== null;
  $("live-fps").textContent = running && live.frames ? (live.arrivals.length / (FPS_WINDOW_MS / 1000)).toFixed(1) : "–";
  $("live-lag").textContent = running && live.lagMs !== null ? `${Math.round(live.lagMs)} ms` : "–";
  if (live.last && now - live.last.at >= STALE_OVERLAY_MS) clearOverlay();
}

window.addEventListener("pagehide", () => {
  const { session, pc } = live;
  if (session) {
    // sendBeacon cannot send headers: the session's close token is its authority.
    const body = JSON.stringify({ stream_id: session.streamId, close_token: session.closeToken });
    navigator.sendBeacon("/api/webrtc/close", new Blob([body], { type: "text/plain" }));
  }
  if (pc) pc.close();
});

// -- Watch cameras ------------------------------------------------------------------------------

const watch = {
  timer: null,
  selected: null,
  abort: null,
  items: new Map(), // stream id -> <li>
  detections: [], // the last KEEP_DETECTIONS detections bodies of the selected stream
  frames: 0,
  alerts: null,
  scene: null,
  bitmap: null,
  seq: null,
  meta: {}, // the selected stream as last listed
  clips: null, // ClipPanel
};

function startWatching() {
  if (watch.timer !== null) return;
  refreshStreams();
  watch.timer = setInterval(refreshStreams, LIST_EVERY_MS);
  if (watch.selected) select(watch.selected);
}

function stopWatching() {
  if (watch.timer !== null) clearInterval(watch.timer);
  watch.timer = null;
  if (watch.abort) watch.abort.abort();
  watch.abort = null;
}

async function refreshStreams() {
  let streams;
  try {
    const response = await api("/api/streams");
    if (!response.ok) {
      pageNotice(`Could not list the streams: ${await errorText(response)}`);
      return;
    }
    streams = (await response.json()).streams || [];
  } catch (error) {
    if (!(error instanceof Unauthorized)) pageNotice(`Could not list the streams: ${error.message}`);
    return;
  }
  if (watch.timer === null) return; // left the mode meanwhile
  pageNotice("");
  renderStreams(streams);
}

function streamItem(id) {
  const li = document.createElement("li");
  const button = document.createElement("button");
  button.type = "button";
  button.className = "stream";
  button.dataset.id = id;
  button.innerHTML =
    '<span class="line"><span class="id"></span><span class="kind"></span></span>' +
    '<span class="line"><span class="pill"></span></span><span class="reason"></span>';
  button.querySelector(".id").textContent = id;
  button.addEventListener("click", () => select(id));
  li.append(button);
  return li;
}

function renderStreams(streams) {
  const list = $("streams");
  const seen = new Set();
  streams.forEach((stream, index) => {
    seen.add(stream.id);
    let li = watch.items.get(stream.id);
    if (!li) {
      li = streamItem(stream.id);
      watch.items.set(stream.id, li);
    }
    // The server's order; a node is moved only when out of place, so focus stays where it is.
    if (list.children[index] !== li) list.insertBefore(li, list.children[index] || null);
    const button = li.firstElementChild;
    button.setAttribute("aria-pressed", String(stream.id === watch.selected));
    button.querySelector(".kind").textContent = stream.kind || "camera";
    const pill = button.querySelector(".pill");
    pill.dataset.state = stream.state;
    pill.textContent = stream.state;
    button.querySelector(".reason").textContent = stream.reason || "";
    if (stream.id === watch.selected) showStreamMeta(stream);
  });
  for (const [id, li] of watch.items) {
    if (!seen.has(id)) {
      li.remove();
      watch.items.delete(id);
    }
  }
  $("streams-empty").hidden = streams.length > 0;
  if (watch.selected && !seen.has(watch.selected)) watchNote("This stream is gone.");
}

function showStreamMeta(stream) {
  watch.meta = stream;
  const parts = [stream.kind || "camera", stream.state];
  if (stream.reason) parts.push(stream.reason);
  $("watch-meta").textContent = parts.join(" · ");
}

function watchNote(text) {
  const note = $("watch-placeholder");
  note.textContent = text;
  note.hidden = !text;
  note.classList.toggle("over", $("watch-canvas").classList.contains("on"));
}

function select(id) {
  if (watch.abort) watch.abort.abort();
  const abort = (watch.abort = new AbortController());
  if (watch.selected !== id) {
    watch.selected = id;
    watch.detections = [];
    watch.frames = 0;
    watch.alerts.clear();
    watch.scene.clear();
    watch.seq = null;
    watch.meta = {};
    $("watch-meta").textContent = "";
    $("watch-frame").textContent = "";
    if (watch.bitmap) watch.bitmap.close();
    watch.bitmap = null;
    const canvas = $("watch-canvas");
    canvas.classList.remove("on");
    canvas.dataset.boxes = "0";
    canvas.dataset.alerted = "0";
    canvas.dataset.frames = "0";
  }
  hooks.watch = { streamId: id, boxesDrawn: 0, messages: 0 };
  watch.clips.load(id).catch((error) => {
    if (!(error instanceof Unauthorized)) $("clip-info").textContent = `Could not list the clips: ${error.message}`;
  });
  $("watch-title").textContent = id;
  for (const [other, li] of watch.items) li.firstElementChild.setAttribute("aria-pressed", String(other === id));
  watchNote(watch.bitmap ? "" : "Loading the latest frame…");
  readEvents(id, abort.signal);
  pollFrames(id, abort.signal);
  showLatestDescription(id, abort.signal);
}

// The scene as it was last described, without waiting for the next description.
async function showLatestDescription(id, signal) {
  try {
    const response = await api(`/api/streams/${encodeURIComponent(id)}/description`, { signal });
    if (!response.ok) return;
    const { description } = await response.json();
    if (description && !signal.aborted && watch.selected === id) watch.scene.offer(description);
  } catch {
    // the events bring the next one
  }
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}


async function readEvents(id, signal) {
  let lastId = null; // as EventSource does: a reconnect resumes after the last event seen
  while (!signal.aborted) {
    try {
      const headers = { Accept: "text/event-stream" };
      if (lastId) headers["Last-Event-ID"] = lastId;
      const response = await api(`/api/streams/${encodeURIComponent(id)}/events`, { signal, headers });
      if (response.ok) {
        await readSse(response.body, signal, (name, data) => onWatchEvent(name, data), (value) => (lastId = value));
      } else if (response.status === 404) {
        return; // the frame poll says the stream is gone
      } else {
        watchNote(`Events unavailable: ${await errorText(response)}`);
      }
    } catch (error) {
      if (signal.aborted || error instanceof Unauthorized) return;
    }
    await sleep(EVENTS_RETRY_MS, signal);
  }
}

function onWatchEvent(name, data) {
  let body;
  try {
    body = JSON.parse(data);
  } catch {
    return;
  }
  hooks.watch.messages += 1;
  switch (name) {
    case "stream":
      showStreamMeta(body);
      break;
    case "detections":
      watch.frames += 1;
      $("watch-canvas").dataset.frames = String(watch.frames);
      watch.detections.push(body);
      if (watch.detections.length > KEEP_DETECTIONS) watch.detections.shift();
      // The JPEG can arrive before its frame's event: redraw once the boxes that match it are in.
      if (body.frame_seq === watch.seq) drawWatch();
      break;
    case "alerts":
      watch.alerts.update(body);
      drawWatch();
      break;
    case "descriptions":
      watch.scene.show(body);
      break;
    case "clips":
      watch.clips.load(watch.selected).catch(() => {});
      break;
    case "status":
      showStreamMeta({ ...watch.meta, state: body.state, reason: body.reason });
      break;
    default:
      break;
  }
}

async function pollFrames(id, signal) {
  const path = `/api/streams/${encodeURIComponent(id)}/frame.jpg`;
  while (!signal.aborted) {
    const started = performance.now();
    try {
      const response = await api(path, { signal });
      if (response.ok) {
        const seq = Number(response.headers.get("X-Frame-Seq"));
        const bitmap = await createImageBitmap(await response.blob());
        if (signal.aborted) {
          bitmap.close();
          return;
        }
        if (watch.bitmap) watch.bitmap.close();
        watch.bitmap = bitmap;
        watch.seq = seq;
        watchNote("");
        drawWatch();
      } else {
        const reason = await errorText(response);
        if (reason === "unknown stream") watchNote("This stream is gone.");
        else if (reason === "no frame yet") watchNote("Waiting for the first processed frame…");
        else watchNote(`No frame: ${reason}`);
      }
    } catch (error) {
      if (signal.aborted || error instanceof Unauthorized) return;
      watchNote(`Could not load the frame: ${error.message}`);
    }
    await sleep(Math.max(0, FRAME_EVERY_MS - (performance.now() - started)), signal);
  }
}

// The detections of the frame shown: the event with the same frame_seq, else the newest.
function detectionsFor(seq) {
  for (let i = watch.detections.length - 1; i >= 0; i -= 1) {
    if (watch.detections[i].frame_seq === seq) return watch.detections[i];
  }
  return watch.detections[watch.detections.length - 1] || null;
}

function drawWatch() {
  const bitmap = watch.bitmap;
  if (!bitmap) return;
  const canvas = $("watch-canvas");
  if (canvas.width !== bitmap.width) canvas.width = bitmap.width;
  if (canvas.height !== bitmap.height) canvas.height = bitmap.height;
  canvas.classList.add("on");
  const ctx = canvas.getContext("2d");
  ctx.drawImage(bitmap, 0, 0);
  const body = detectionsFor(watch.seq);
  let counts = { drawn: 0, warned: 0, masks: 0 };
  if (body) {
    const shown = canvas.clientWidth || bitmap.width;
    const unit = bitmap.width / shown;
    counts = drawBoxes(ctx, body.objects || [], bitmap.width / body.width, bitmap.height / body.height, unit,
      watch.alerts.alertedTracks());
  }
  const drawn = counts.drawn;
  canvas.dataset.boxes = String(drawn);
  canvas.dataset.alerted = String(counts.warned);
  canvas.dataset.masks = String(counts.masks);
  hooks.watch.boxesDrawn = drawn;
  const matched = body && body.frame_seq === watch.seq ? "" : " (boxes of a nearby frame)";
  const tracked = body ? (body.objects || []).filter((o) => o.track_id != null).length : 0;
  const active = [...watch.alerts.alerts.values()].filter((a) => a.active).length;
  $("watch-frame").textContent = [
    `frame ${watch.seq}`,
    `${drawn} box${drawn === 1 ? "" : "es"}${matched}`,
    body && body.inference === "predicted" ? "predicted by the tracker (dashed)" : "",
    `${tracked} tracked`,
    active ? `${active} active alert${active === 1 ? "" : "s"}` : "",
  ].filter(Boolean).join(" · ");
}

// -- Start-up ---------------------------------------------------------------------------------

async function boot() {
  live.alerts = new AlertList($("live-alerts"));
  live.captions = new CaptionPanel($("captions"), $("captions-empty"));
  watch.alerts = new AlertList($("watch-alerts"));
  live.scene = new ScenePanel($("live-scene"), $("live-scene-meta"), $("live-scene-meta").textContent);
  watch.scene = new ScenePanel($("watch-scene"), $("watch-scene-meta"), $("watch-scene-meta").textContent);
  watch.clips = new ClipPanel(
    { list: $("watch-clips"), empty: $("watch-clips-empty"), box: $("clip-box"), video: $("clip-video"),
      overlay: $("clip-overlay"), info: $("clip-info"), said: $("clip-said") },
    { api, drawBoxes },
  );
  new TimelinePanel(
    { form: $("ask-form"), input: $("ask-input"), search: $("ask-search"), ask: $("ask-ask"), status: $("ask-status"),
      answer: $("ask-answer"), list: $("ask-hits"), box: $("ask-box"), video: $("ask-video"), info: $("ask-info") },
    { api, errorText },
  );
  $("start").addEventListener("click", startLive);
  $("stop").addEventListener("click", () => stopLive());
  for (const tab of document.querySelectorAll("[role=tab]")) {
    tab.addEventListener("click", () => {
      history.replaceState(null, "", `#${tab.dataset.mode}`);
      showMode(tab.dataset.mode);
    });
  }
  window.addEventListener("hashchange", () => showMode(currentMode()));
  new ResizeObserver(() => drawLiveOverlay()).observe($("live-video"));
  setInterval(renderLiveStats, 500);
  setLiveState("idle");
  showMode(currentMode());
  // One call decides whether the token is needed before anything of the streams is shown.
  try {
    const response = await api("/api/streams");
    if (!response.ok) pageNotice(`The server answered: ${await errorText(response)}`);
    unlock();
  } catch (error) {
    if (!(error instanceof Unauthorized)) pageNotice(`Could not reach the server: ${error.message}`);
  }
}

boot();
