// The service's API as the page calls it: every request with the bearer token once one is given,
// the panel that asks for the token when the server wants one, and the page's notice line. What a
// refused or an accepted token does to the rest of the page is passed in (`onLocked`, `onUnlocked`),
// so this module imports no panel.

const TOKEN_KEY = "vidsentry.token";

export class Unauthorized extends Error {}

export async function errorText(response) {
  try {
    const body = await response.json();
    if (body && typeof body.error === "string") return body.error;
  } catch {
    // not JSON: fall through to the status line
  }
  return `${response.status} ${response.statusText}`.trim();
}

// el: app, panel, form, input, message (the token panel's), notice (the page's).
export function createApi(el, { onLocked, onUnlocked }) {
  const auth = { token: sessionStorage.getItem(TOKEN_KEY) };

  async function api(path, init = {}) {
    const used = auth.token;
    const headers = new Headers(init.headers || {});
    if (used) headers.set("Authorization", `Bearer ${used}`);
    const response = await fetch(path, { ...init, headers, cache: "no-store" });
    if (response.status === 401) {
      if (auth.token === used) { // not a late answer to a call made before a new token was given
        auth.token = null; // no more calls with a token the server refuses
        sessionStorage.removeItem(TOKEN_KEY);
        askForToken(used ? "The saved token was not accepted. Enter it again." : "");
      }
      throw new Unauthorized("the API token is needed");
    }
    return response;
  }

  function askForToken(message) {
    document.body.dataset.auth = "needed";
    onLocked(); // nothing of the streams stays on screen without a token that works
    el.app.hidden = true;
    el.panel.hidden = false;
    el.message.textContent = message;
    el.input.focus();
  }

  async function submitToken(event) {
    event.preventDefault();
    const given = el.input.value.trim();
    if (!given) return;
    let response;
    try {
      response = await fetch("/api/streams", { headers: { Authorization: `Bearer ${given}` }, cache: "no-store" });
    } catch (error) {
      el.message.textContent = `Could not reach the server: ${error.message}`;
      return;
    }
    if (response.status === 401) {
      el.message.textContent = "That token was not accepted.";
      return;
    }
    auth.token = given;
    sessionStorage.setItem(TOKEN_KEY, given);
    el.input.value = "";
    unlock();
  }

  function unlock() {
    document.body.dataset.auth = "ok";
    el.panel.hidden = true;
    el.app.hidden = false;
    onUnlocked();
  }

  function pageNotice(text) {
    el.notice.textContent = text;
    el.notice.hidden = !text;
  }

  el.form.addEventListener("submit", submitToken);
  return { api, unlock, pageNotice };
}
