// The page's one way from an event to what shows it. Each mode (Go live, Watch cameras) has a router:
// its view hands it every event it reads, from the DataChannel or from SSE alike, and the router
// calls whoever declared that event's kind: the view itself for what it draws on its stage, and the
// cards the server declared (realtime/http/page.py: `Panel`). A kind nobody declared is skipped.
//
// A panel module default-exports `mount(card, view)`. `card` is its <section>, its title already
// in; `view` is {mode, api, errorText, drawBoxes}. It fills the card and returns the panel:
//   show(kind, body, message)  an event of a kind it declared (`message`: the DataChannel's whole
//                              message, with e.g. lag_ms; undefined from SSE)
//   clear()                    the session restarted, or another stream was selected
//   select(streamId, signal)   optional, Watch only: this stream is now shown (signal: until the next)

export class EventRouter {
  constructor() {
    this.routes = new Map(); // kind -> [show(kind, body, message)]
    this.panels = [];
  }

  on(kinds, show) {
    for (const kind of kinds) {
      if (!this.routes.has(kind)) this.routes.set(kind, []);
      this.routes.get(kind).push(show);
    }
  }

  add(panel, kinds) {
    this.panels.push(panel);
    this.on(kinds, (kind, body, message) => panel.show(kind, body, message));
  }

  dispatch(kind, body, message) {
    for (const show of this.routes.get(kind) || []) {
      try {
        show(kind, body, message);
      } catch (error) {
        console.error(`the ${kind} event could not be shown`, error); // one panel's bug costs the others nothing
      }
    }
  }

  clear() {
    for (const panel of this.panels) panel.clear();
  }

  select(streamId, signal) {
    for (const panel of this.panels) if (panel.select) panel.select(streamId, signal);
  }
}

// The mode's declared cards, each filled by its module: a router that reaches them.
export async function mountPanels(section, view) {
  const router = new EventRouter();
  const cards = [...section.querySelectorAll("section.card[data-panel]")];
  const modules = await Promise.all(cards.map((card) => import(card.dataset.module).catch((error) => error)));
  cards.forEach((card, index) => {
    const module = modules[index];
    try {
      if (module instanceof Error) throw module;
      router.add(module.default(card, view), card.dataset.kinds.split(" ").filter(Boolean));
    } catch (error) {
      console.error(`the ${card.dataset.panel} panel could not load`, error);
      const note = document.createElement("p");
      note.className = "muted small";
      note.textContent = "This panel could not load.";
      card.append(note);
    }
  });
  return router;
}
