// The chimes card, in both modes: the last chime's sound and how many have come since the card was
// last cleared. It is the test-only capability's own module, served because its plugin declares it.

export default function mount(card, { mode }) {
  const text = document.createElement("p");
  text.id = `${mode}-chimes`;
  text.className = "muted small";
  text.dataset.count = "0";
  card.append(text);
  let count = 0;
  return {
    show(_kind, body) {
      count += 1;
      text.textContent = `${body.sound} at frame ${body.frame_seq}`;
      text.dataset.count = String(count);
    },
    clear() {
      count = 0;
      text.textContent = "";
      text.dataset.count = "0";
    },
  };
}
