// The alerts of the live session or the watched stream: newest first, active ones marked. A view's
// stage keeps its own book of them too, for which tracks to draw in the warning colour.

const KEEP_ALERTS = 20;

// The alerts as their events leave them, by alert_id, oldest first, at most KEEP_ALERTS.
export class AlertBook {
  constructor() {
    this.alerts = new Map(); // alert_id -> {body, active, at}
  }

  update(body) {
    const known = this.alerts.get(body.alert_id);
    const entry = { body: known && body.event === "end" ? { ...known.body, ...body } : body, active: body.event !== "end", at: new Date() };
    this.alerts.delete(body.alert_id);
    this.alerts.set(body.alert_id, entry);
    while (this.alerts.size > KEEP_ALERTS) {
      const oldest = [...this.alerts].find(([, e]) => !e.active) || [...this.alerts][0];
      this.alerts.delete(oldest[0]);
    }
  }

  clear() {
    this.alerts.clear();
  }

  // Track ids named by alerts still active: their boxes are drawn in the warning colour.
  alertedTracks() {
    const ids = new Set();
    for (const { body, active } of this.alerts.values()) {
      if (active) for (const id of body.track_ids || []) ids.add(id);
    }
    return ids;
  }

  activeCount() {
    return [...this.alerts.values()].filter((a) => a.active).length;
  }
}

export class AlertList {
  constructor(list) {
    this.list = list;
    this.book = new AlertBook();
  }

  show(_kind, body) {
    this.book.update(body);
    this.render();
  }

  clear() {
    this.book.clear();
    this.render();
  }

  render() {
    const items = [...this.book.alerts.values()].reverse().map(({ body, active, at }) => {
      const li = document.createElement("li");
      li.className = `alert ${active ? "active" : "ended"} severity-${body.severity || "info"}`;
      const what = document.createElement("div");
      what.className = "what";
      what.textContent = `${body.rule_id}${body.class ? ` · ${body.class}` : ""}`;
      const when = document.createElement("div");
      when.className = "when";
      const tracks = (body.track_ids || []).map((id) => `#${id}`).join(" ");
      when.textContent = [active ? "active" : "ended", body.severity, tracks, at.toLocaleTimeString()]
        .filter(Boolean)
        .join(" · ");
      li.append(what, when);
      return li;
    });
    this.list.replaceChildren(...items);
  }
}

// The core's Alerts card (realtime/http/page.py: CORE_PANELS), in either mode.
export default function mount(card, { mode }) {
  card.insertAdjacentHTML("beforeend",
    `<ul id="${mode}-alerts" class="alerts"></ul><p class="muted small empty-note">No alerts.</p>`);
  return new AlertList(card.querySelector("ul.alerts"));
}
