// vidsentry's page: go live from this browser over WebRTC, or watch the service's cameras.
// Plain modern JavaScript served as is: no build step, no framework, nothing from another origin.

import { AlertList } from "./alerts.js";
import { Unauthorized, createApi, errorText } from "./api.js";
import { CaptionPanel } from "./captions.js";
import { ClipPanel } from "./clips.js";
import { LivePanel } from "./golive.js";
import { drawBoxes } from "./overlay.js";
import { ScenePanel } from "./scene.js";
import { readSse } from "./sse.js";
import { TimelinePanel } from "./timeline.js";

const $ = (id) => document.getElementById(id);

const LIST_EVERY_MS = 2000;
const FRAME_EVERY_MS = 500; // frame.jpg is encoded at most every 0.5 s anyway
const EVENTS_RETRY_MS = 3000;
const KEEP_DETECTIONS = 50; // enough to match a frame a few seconds old to its boxes

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
  new LivePanel(
    { start: $("start"), stop: $("stop"), state: $("live-state"), notice: $("live-notice"), session: $("live-session"),
      fps: $("live-fps"), lag: $("live-lag"), box: $("live-box"), video: $("live-video"), overlay: $("live-overlay"),
      placeholder: $("live-placeholder") },
    { api, errorText, hooks, alerts: new AlertList($("live-alerts")),
      captions: new CaptionPanel($("captions"), $("captions-empty")),
      scene: new ScenePanel($("live-scene"), $("live-scene-meta"), $("live-scene-meta").textContent) },
  );
  watch.alerts = new AlertList($("watch-alerts"));
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
  for (const tab of document.querySelectorAll("[role=tab]")) {
    tab.addEventListener("click", () => {
      history.replaceState(null, "", `#${tab.dataset.mode}`);
      showMode(tab.dataset.mode);
    });
  }
  window.addEventListener("hashchange", () => showMode(currentMode()));
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
