// Segmentation masks as the server sends them (COCO RLE), decoded into small tinted canvases that
// the overlay draws inside each object's box.

// Run lengths of a COCO RLE: a list already, or COCO's compact string (each run a difference to
// the run two before, in 5-bit groups offset by 48, as pycocotools writes it).
function rleRuns(counts) {
  if (Array.isArray(counts)) return counts;
  const runs = [];
  let p = 0;
  while (p < counts.length) {
    let x = 0;
    let k = 0;
    let more = true;
    let c = 0;
    while (more) {
      c = counts.charCodeAt(p) - 48;
      x |= (c & 0x1f) << (5 * k);
      more = (c & 0x20) !== 0;
      p += 1;
      k += 1;
    }
    if (c & 0x10) x |= -1 << (5 * k);
    if (runs.length > 2) x += runs[runs.length - 2];
    runs.push(x);
  }
  return runs;
}

const MASK_CACHE_LIMIT = 64; // decoded masks kept (a track's mask stays the same for many frames)
const maskCache = new Map();

// A mask as a small canvas covering only its set pixels, filled with `colour` at 40 % opacity;
// the runs are column-major (x = index / height). Null for an empty or malformed mask.
export function maskImage(mask, colour) {
  const key = `${colour}|${mask.size}|${mask.counts}`;
  if (maskCache.has(key)) return maskCache.get(key);
  const [h, w] = mask.size;
  const runs = rleRuns(mask.counts);
  const spans = [];
  let x0 = w;
  let y0 = h;
  let x1 = -1;
  let y1 = -1;
  let at = 0;
  for (let i = 0; i < runs.length; i += 1) {
    if (i % 2 === 1 && runs[i] > 0) {
      spans.push([at, runs[i]]);
      const first = at;
      const last = at + runs[i] - 1;
      const oneColumn = Math.floor(first / h) === Math.floor(last / h);
      x0 = Math.min(x0, Math.floor(first / h));
      x1 = Math.max(x1, Math.floor(last / h));
      y0 = Math.min(y0, oneColumn ? first % h : 0); // a run across columns spans the full height
      y1 = Math.max(y1, oneColumn ? last % h : h - 1);
    }
    at += runs[i];
  }
  let image = null;
  if (at === w * h && x1 >= 0) {
    const cw = x1 - x0 + 1;
    const ch = y1 - y0 + 1;
    const canvas = document.createElement("canvas");
    canvas.width = cw;
    canvas.height = ch;
    const ctx = canvas.getContext("2d");
    const pixels = ctx.createImageData(cw, ch);
    const [r, g, b] = [1, 3, 5].map((o) => parseInt(colour.slice(o, o + 2), 16));
    for (const [start, length] of spans) {
      for (let j = start; j < start + length; j += 1) {
        const px = Math.floor(j / h) - x0;
        const py = (j % h) - y0;
        if (py < 0 || py >= ch) continue;
        const o = (py * cw + px) * 4;
        pixels.data[o] = r;
        pixels.data[o + 1] = g;
        pixels.data[o + 2] = b;
        pixels.data[o + 3] = 102;
      }
    }
    ctx.putImageData(pixels, 0, 0);
    image = { canvas, x: x0, y: y0 };
  }
  if (maskCache.size >= MASK_CACHE_LIMIT) maskCache.delete(maskCache.keys().next().value);
  maskCache.set(key, image);
  return image;
}
