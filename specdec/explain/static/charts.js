/* Small SVG helpers: a frame with axes, ticks and labels, and scales for it. No library, no network. */
(function () {
  "use strict";
  const NS = "http://www.w3.org/2000/svg";

  function el(name, attrs, parent, text) {
    const node = document.createElementNS(NS, name);
    for (const key in attrs) node.setAttribute(key, attrs[key]);
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  /** Round tick steps (1, 2, 5 x 10^n) covering [0, max] with about `count` ticks. */
  function niceTicks(max, count) {
    const raw = max / (count || 5);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    const ticks = [];
    for (let t = 0; t <= max + 1e-9; t += step) ticks.push(Math.round(t / step) * step);
    if (ticks[ticks.length - 1] < max - 1e-9) ticks.push(ticks[ticks.length - 1] + step);
    return ticks;
  }

  function fmtTick(t) {
    return Number.isInteger(t) ? String(t) : t.toFixed(t * 10 === Math.round(t * 10) ? 1 : 2);
  }

  /**
   * Clear `svg` and draw a frame. opts: width, height, margin {l, r, t, b}, x {min, max, ticks, log2,
   * label}, y {max, label}. Returns {sx, sy, plot (a <g>), box} for drawing inside the frame.
   */
  function frame(svg, opts) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const m = opts.margin;
    const box = { l: m.l, r: opts.width - m.r, t: m.t, b: opts.height - m.b };
    const xf = opts.x.log2 ? Math.log2 : (v) => v;
    const x0 = xf(opts.x.min), x1 = xf(opts.x.max);
    const sx = (v) => box.l + ((xf(v) - x0) / (x1 - x0)) * (box.r - box.l);
    const yTicks = niceTicks(opts.y.max, opts.y.count || 5);
    const yMax = yTicks[yTicks.length - 1];
    const sy = (v) => box.b - (Math.min(v, yMax) / yMax) * (box.b - box.t);

    const axes = el("g", { class: "axes" }, svg);
    for (const t of yTicks) {
      el("line", { x1: box.l, x2: box.r, y1: sy(t), y2: sy(t), class: "grid" }, axes);
      el("text", { x: box.l - 8, y: sy(t) + 4, class: "tick", "text-anchor": "end" }, axes, fmtTick(t));
    }
    for (const t of opts.x.ticks) {
      el("line", { x1: sx(t), x2: sx(t), y1: box.b, y2: box.b + 5, class: "axis" }, axes);
      el("text", { x: sx(t), y: box.b + 19, class: "tick", "text-anchor": "middle" }, axes, String(t));
    }
    el("line", { x1: box.l, x2: box.r, y1: box.b, y2: box.b, class: "axis" }, axes);
    el("line", { x1: box.l, x2: box.l, y1: box.t, y2: box.b, class: "axis" }, axes);
    el("text", { x: (box.l + box.r) / 2, y: opts.height - 6, class: "axis-label", "text-anchor": "middle" },
      axes, opts.x.label);
    const midY = (box.t + box.b) / 2;
    el("text", { x: 14, y: midY, class: "axis-label", "text-anchor": "middle",
      transform: "rotate(-90 14 " + midY + ")" }, axes, opts.y.label);
    const plot = el("g", { class: "plot" }, svg);
    return { sx: sx, sy: sy, plot: plot, box: box, yMax: yMax };
  }

  /** The region below ratio 1.0: speculation there is slower than plain decoding. */
  function shadeBelowOne(f, label) {
    const y1 = f.sy(1);
    el("rect", { x: f.box.l, y: y1, width: f.box.r - f.box.l, height: f.box.b - y1, class: "slow-zone" }, f.plot);
    el("line", { x1: f.box.l, x2: f.box.r, y1: y1, y2: y1, class: "one-line" }, f.plot);
    if (f.box.b - y1 > 18) {
      el("text", { x: f.box.r - 6, y: f.box.b - 8, class: "slow-label", "text-anchor": "end" }, f.plot, label);
    }
  }

  function polyline(f, pts, cls) {
    const d = pts.map((p) => f.sx(p[0]).toFixed(1) + "," + f.sy(p[1]).toFixed(1)).join(" ");
    return el("polyline", { points: d, class: cls }, f.plot);
  }

  window.specdecCharts = { el: el, frame: frame, shadeBelowOne: shadeBelowOne, polyline: polyline,
    niceTicks: niceTicks };
})();
