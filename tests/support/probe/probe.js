// The test-only probe capability's card, in both modes: the last probe event's text, and how many
// have come since the card was last cleared.

export default function mount(card, { mode }) {
  const text = document.createElement("p");
  text.id = `${mode}-probe`;
  text.className = "probe muted small";
  text.dataset.count = "0";
  card.append(text);
  let count = 0;
  return {
    show(_kind, body) {
      count += 1;
      text.textContent = body.text;
      text.dataset.count = String(count);
    },
    clear() {
      count = 0;
      text.textContent = "";
      text.dataset.count = "0";
    },
  };
}
