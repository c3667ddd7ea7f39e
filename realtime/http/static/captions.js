// Live captions as the server transcribes the session's speech: settled words, and the tentative
// words after them that a later decode may still change or withdraw. Once an utterance ends, its
// transcript (decoded whole) replaces its settled words. Each caption carries the language it was
// heard in (as the element's lang, and a tag when it is not English); with captions.translate the
// English text of a transcript follows it as a second line.

const KEEP_CAPTION_LINES = 200;

// Finals arrive a few words at a time (each as soon as two decodes agree on it), so the panel is
// running text: one line per sentence, each final a span, the tentative tail dimmed after it.
const SENTENCE_END = /[.?!]["')\]]*$/;

export class CaptionPanel {
  constructor(list, empty) {
    this.list = list;
    this.empty = empty; // the note shown while there are none
    this.spans = new Map(); // segment_id -> <span>
    this.line = null; // the <li> new spans go to
    this.utterances = new Map(); // utterance_id -> the transcript's <span>, for its translation
  }

  show(kind, body) {
    if (kind === "partials") this.partial(body);
    else if (kind === "captions") this.final(body);
    else if (kind === "transcript") this.transcript(body);
    else if (kind === "translations") this.translation(body);
  }

  // The language a caption was heard in: the element's lang, and a tag beside a non-English one.
  language(span, body) {
    const lang = typeof body.language === "string" ? body.language : "";
    if (!lang) return;
    span.lang = lang;
    span.dataset.language = lang;
    span.title = span.title || `heard as ${lang}`;
  }

  partial(body) {
    const key = String(body.segment_id);
    let span = this.spans.get(key);
    if (span && span.dataset.final) return; // a final is never replaced by a late partial
    if (span && Number(span.dataset.revision) > Number(body.revision)) return;
    if (!body.text) { // withdrawn: the final decode did not confirm it
      if (span) this.drop(key, span);
      return;
    }
    span = span || this.add(key, false);
    span.className = "caption partial";
    span.dataset.revision = String(body.revision ?? 0);
    span.textContent = body.text;
    this.language(span, body);
  }

  final(body) {
    const key = String(body.segment_id);
    const span = this.spans.get(key) || this.add(key, true);
    span.className = "caption final";
    span.dataset.final = "1";
    span.textContent = body.text;
    this.language(span, body);
    if (SENTENCE_END.test(body.text)) this.breakAfter(span);
  }

  // An utterance decoded whole once it ended: its text takes the place of the finals it names
  // (in the first of them; the others go), so what stays on screen is what is kept.
  transcript(body) {
    const spans = (body.replaces || []).map((id) => this.spans.get(String(id))).filter(Boolean);
    if (!spans.length) return; // those finals have scrolled away
    const [first, ...rest] = spans;
    for (const span of rest) this.drop(span.dataset.segment, span);
    first.className = "caption final transcript";
    first.textContent = body.text;
    this.language(first, body);
    if (body.changed) first.title = "corrected once the utterance ended";
    if (body.utterance_id) {
      this.utterances.set(String(body.utterance_id), first);
      while (this.utterances.size > KEEP_CAPTION_LINES) this.utterances.delete(this.utterances.keys().next().value);
    }
    for (const line of [...this.list.children]) {
      if (line !== this.line && !line.firstElementChild) line.remove(); // emptied by the replacement
    }
  }

  // The English text of a transcript, as a second line under it (textContent: never markup).
  translation(body) {
    const said = this.utterances.get(String(body.utterance_id));
    if (!said || !body.text) return;
    const line = document.createElement("span");
    line.className = "caption translation";
    line.lang = body.language || "en";
    line.dataset.segment = `translation-${body.utterance_id}`;
    line.textContent = body.text;
    said.after(line); // a block (app.css): the line under the transcript
    this.follow();
  }

  add(key, final) {
    if (!this.line) this.newLine();
    const span = document.createElement("span");
    span.dataset.segment = key;
    // Finals come in order: one goes before any partial of a later segment.
    const firstPartial = final ? this.line.querySelector(".caption.partial") : null;
    this.line.insertBefore(span, firstPartial);
    this.spans.set(key, span);
    this.empty.hidden = true;
    this.follow();
    return span;
  }

  breakAfter(span) {
    const rest = [];
    for (let next = span.nextElementSibling; next; next = next.nextElementSibling) rest.push(next);
    this.newLine();
    this.line.append(...rest);
  }

  newLine() {
    const line = document.createElement("li");
    this.list.append(line);
    this.line = line;
    while (this.list.children.length > KEEP_CAPTION_LINES) {
      const oldest = this.list.firstElementChild;
      for (const span of oldest.querySelectorAll("span")) this.spans.delete(span.dataset.segment);
      oldest.remove();
    }
  }

  drop(key, span) {
    this.spans.delete(key);
    span.remove();
  }

  follow() {
    const list = this.list;
    if (list.scrollHeight - list.scrollTop - list.clientHeight < 48) {
      requestAnimationFrame(() => (list.scrollTop = list.scrollHeight));
    }
  }

  clear() {
    this.list.replaceChildren();
    this.spans.clear();
    this.line = null;
    this.empty.hidden = false;
  }
}

// The captions plugin's card (realtime/service/plugins/captions.py): beside Go live's video, and
// under the frame in Watch cameras. Ids are per mode, as both cards are in one document.
export default function mount(card, view) {
  const id = view && view.mode === "watch" ? "watch-captions" : "captions";
  card.insertAdjacentHTML("beforeend",
    `<ol id="${id}" class="captions" aria-live="polite"></ol>` +
    `<p id="${id}-empty" class="muted small">Captions appear here as the server transcribes speech.</p>`);
  return new CaptionPanel(card.querySelector("ol.captions"), card.querySelector(`#${id}-empty`));
}
