// Boxes, labels and masks drawn over a picture: the same look on the live video, a watched camera's
// frame and a clip.

import { maskImage } from "./masks.js";

const WARN = "#e0a23a";
const PALETTE = ["#6aaee6", "#5bbf86", "#b48ee0", "#4fc1c9", "#d98bb6", "#9fc46a", "#7f9cf5", "#e3c16f"];

function colourFor(trackId) {
  return trackId == null ? "#c9ced6" : PALETTE[Math.abs(trackId) % PALETTE.length];
}

function labelOf(object) {
  const parts = [object.class, `${Math.round(object.score * 100)}%`];
  if (object.track_id != null) parts.push(`#${object.track_id}`);
  return parts.join(" ");
}

// Fills an object's mask (frame pixels, scaled by sx, sy) inside its current box.
function drawMask(ctx, object, colour, sx, sy) {
  const image = maskImage(object.mask, colour);
  if (!image) return false;
  const [x1, y1, x2, y2] = object.box;
  ctx.save();
  ctx.beginPath();
  ctx.rect(x1 * sx, y1 * sy, (x2 - x1) * sx, (y2 - y1) * sy);
  ctx.clip();
  ctx.drawImage(image.canvas, image.x * sx, image.y * sy, image.canvas.width * sx, image.canvas.height * sy);
  ctx.restore();
  return true;
}

// Draws `objects` (boxes in frame pixels) scaled by (sx, sy); `unit` is one CSS pixel in canvas
// units, so lines and labels look the same size whatever the frame's resolution. Returns how many
// boxes were drawn, how many of them in the warning colour (tracks named by an active alert), and
// how many masks were filled in. A box the tracker predicted on a frame the model skipped
// (`predicted: true`) is dashed, so a viewer can tell measured boxes from carried-forward ones.
export function drawBoxes(ctx, objects, sx, sy, unit, alerted) {
  let warned = 0;
  let masks = 0;
  const font = 12 * unit;
  ctx.font = `600 ${font}px system-ui, sans-serif`;
  ctx.textBaseline = "top";
  for (const object of objects) {
    const [x1, y1, x2, y2] = object.box;
    const x = x1 * sx;
    const y = y1 * sy;
    const w = (x2 - x1) * sx;
    const h = (y2 - y1) * sy;
    const warn = object.track_id != null && alerted.has(object.track_id);
    const colour = warn ? WARN : colourFor(object.track_id);
    if (warn) warned += 1;
    if (object.mask && drawMask(ctx, object, colour, sx, sy)) masks += 1;
    ctx.lineWidth = (warn ? 3 : 2) * unit;
    ctx.strokeStyle = colour;
    ctx.setLineDash(object.predicted ? [6 * unit, 4 * unit] : []);
    ctx.strokeRect(x, y, w, h);
    ctx.setLineDash([]);
    const label = labelOf(object);
    const pad = 4 * unit;
    const tw = ctx.measureText(label).width + 2 * pad;
    const th = font + 2 * pad;
    // Above the box when it fits, inside it otherwise; never past the right edge.
    const ly = y - th >= 0 ? y - th : y;
    const lx = Math.max(0, Math.min(x - ctx.lineWidth / 2, ctx.canvas.width - tw));
    ctx.fillStyle = colour;
    ctx.fillRect(lx, ly, tw, th);
    ctx.fillStyle = "#0d1014";
    ctx.fillText(label, lx + pad, ly + pad);
  }
  return { drawn: objects.length, warned, masks };
}
