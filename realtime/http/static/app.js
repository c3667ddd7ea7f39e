// vidsentry's page: go live from this browser over WebRTC, or watch the service's cameras.
// Plain modern JavaScript served as is: no build step, no framework, nothing from another origin.
// This entry module finds the page's elements and hands each mode what it needs: its elements, the
// authenticated API call, the test hooks, and a router to the cards the server declared for it
// (realtime/http/page.py renders their shells; router.js loads their modules). It names no card.

import { Unauthorized, createApi, errorText } from "./api.js";
import { LivePanel } from "./golive.js";
import { drawBoxes } from "./overlay.js";
import { mountPanels } from "./router.js";
import { TimelinePanel } from "./timeline.js";
import { WatchPanel } from "./watch.js";

const $ = (id) => document.getElementById(id);

// Test hooks (and a handle for anyone poking at the page from the console).
const hooks = {
  streamId: null,
  state: "idle",
  boxesDrawn: 0,
  messages: 0,
  watch: { streamId: null, boxesDrawn: 0, messages: 0 },
};
window.vidsentry = hooks;

// -- Modes -------------------------------------------------------------------------------------

const MODES = ["live", "watch", "ask"];

function currentMode() {
  const mode = location.hash.slice(1);
  return MODES.includes(mode) ? mode : "live";
}

// The mode's tab and panel shown, the others hidden; the watch view reads its streams only while
// it is shown, and only once the API has let the page in.
function showMode(mode, watch) {
  for (const tab of document.querySelectorAll("[role=tab]")) {
    const on = tab.dataset.mode === mode;
    tab.setAttribute("aria-selected", String(on));
    $(tab.getAttribute("aria-controls")).hidden = !on;
  }
  if (document.body.dataset.auth !== "ok") return;
  if (mode === "watch") watch.start();
  else watch.stop();
}

// -- Start-up ---------------------------------------------------------------------------------

async function boot() {
  // `watch` is made below: these run only once a request has been answered (or the token form
  // sent), by when it is.
  const { api, unlock, pageNotice } = createApi(
    { app: $("app"), panel: $("token-panel"), form: $("token-form"), input: $("token-input"),
      message: $("token-message"), notice: $("page-notice") },
    { onLocked: () => watch.stop(), onUnlocked: () => showMode(currentMode(), watch) },
  );
  const [liveRouter, watchRouter] = await Promise.all(["live", "watch"].map(
    (mode) => mountPanels($(mode), { mode, api, errorText, drawBoxes }),
  ));
  new LivePanel(
    { start: $("start"), stop: $("stop"), state: $("live-state"), notice: $("live-notice"), session: $("live-session"),
      fps: $("live-fps"), lag: $("live-lag"), box: $("live-box"), video: $("live-video"), overlay: $("live-overlay"),
      placeholder: $("live-placeholder"), language: $("live-language"), translate: $("live-translate") },
    { api, errorText, hooks, router: liveRouter },
  );
  const watch = new WatchPanel(
    { title: $("watch-title"), meta: $("watch-meta"), canvas: $("watch-canvas"), placeholder: $("watch-placeholder"),
      frame: $("watch-frame"), live: $("watch-live"), video: $("watch-video"), overlay: $("watch-overlay"),
      fallback: $("watch-fallback"), streams: { list: $("streams"), empty: $("streams-empty") } },
    { api, errorText, pageNotice, hooks, router: watchRouter },
  );
  new TimelinePanel(
    { form: $("ask-form"), input: $("ask-input"), search: $("ask-search"), ask: $("ask-ask"), status: $("ask-status"),
      answer: $("ask-answer"), list: $("ask-hits"), box: $("ask-box"), video: $("ask-video"), info: $("ask-info") },
    { api, errorText },
  );
  for (const tab of document.querySelectorAll("[role=tab]")) {
    tab.addEventListener("click", () => {
      history.replaceState(null, "", `#${tab.dataset.mode}`);
      showMode(tab.dataset.mode, watch);
    });
  }
  window.addEventListener("hashchange", () => showMode(currentMode(), watch));
  showMode(currentMode(), watch);
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
