// The Training tab: loss, gradient norm, learning rate and update/weight ratios from
// log.jsonl and stats.jsonl (/api/log), polled while a run trains. Raw points are drawn as they
// are; the running mean is a separate line, never a replacement.

import { call } from "./api.js";
import { el } from "./util.js";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const POLL_MS = 4000;
const evals = [];
const stats = [];
let polling = null;

function svgEl(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

function niceTicks(lo, hi, count = 5) {
  if (!(hi > lo)) return [lo];
  const step = 10 ** Math.floor(Math.log10((hi - lo) / count));
  const err = (hi - lo) / count / step;
  const mult = err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1;
  const s = step * mult;
  const ticks = [];
  for (let t = Math.ceil(lo / s) * s; t <= hi + 1e-12; t += s) ticks.push(+t.toPrecision(12));
  return ticks;
}

const CHAR_W = 6.2; // width of one character of the charts' 11px font
const LEGEND_H = 16;

function tickText(t, logy) {
  return logy ? (10 ** t).toPrecision(2) : String(+t.toPrecision(4));
}

// Legend entries laid out in rows across the top: [{name, colour, dash, dots}] -> rows used.
function drawLegend(svg, entries, left, width) {
  const legend = svgEl("g", { class: "legend" }, svg);
  let [x, row] = [left, 0];
  for (const entry of entries) {
    const w = 22 + entry.name.length * CHAR_W + 12;
    if (x > left && x + w > left + width) { x = left; row += 1; }
    const item = svgEl("g", { class: "legend-item", transform: `translate(${x.toFixed(1)},${row * LEGEND_H})` }, legend);
    if (entry.line !== false) {
      const line = svgEl("line", { x1: 0, x2: 16, y1: 8, y2: 8, stroke: entry.colour, "stroke-width": 2 }, item);
      if (entry.dash) line.setAttribute("stroke-dasharray", entry.dash);
    } else {
      svgEl("circle", { cx: 8, cy: 8, r: 3, fill: entry.colour }, item);
    }
    svgEl("text", { x: 21, y: 12 }, item).textContent = entry.name;
    x += w;
  }
  return entries.length ? row + 1 : 0;
}

// series: [{name, points: [[x, y]], colour, width, dots, dash}]; options: {logy, guide,
// threshold: {value, name}, xTitle, yTitle, legend: entries (default: one per series)}.
// Margins grow to fit the tick labels, so none is clipped.
export function lineChart(container, series, options = {}) {
  const W = container.clientWidth || 460;
  const ty = (y) => (options.logy ? Math.log10(y) : y);
  const all = series.flatMap((s) => s.points).filter(([, y]) => y !== null && Number.isFinite(ty(y)));
  container.replaceChildren();
  const entries = options.legend || series.map((s) => ({ name: s.name, colour: s.colour, dash: s.dash, line: s.width !== 0 }));
  const threshold = options.threshold;
  if (threshold) entries.push({ name: threshold.name, colour: "#d62728", dash: "6 3" });
  if (!all.length) {
    const svg = svgEl("svg", { width: W, height: 220, class: "chart-svg" }, container);
    svgEl("text", { x: W / 2, y: 110, "text-anchor": "middle", class: "empty" }, svg).textContent = "no data yet";
    return svg;
  }
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let ys = all.map((p) => ty(p[1]));
  if (options.guide !== undefined) ys = ys.concat([options.guide]);
  if (threshold) ys = ys.concat([ty(threshold.value)]);
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const margin = (y1 - y0) * 0.05;
  y0 -= margin; y1 += margin;
  const yTicks = niceTicks(y0, y1);
  const xTicks = niceTicks(x0, x1);
  const yLabelW = Math.max(...yTicks.map((t) => tickText(t, options.logy).length)) * CHAR_W;
  const xLabelW = Math.max(...xTicks.map((t) => String(t).length)) * CHAR_W;
  const pad = { l: 22 + yLabelW + 8, r: 8 + xLabelW / 2, t: 6, b: 40 };
  // The legend's rows are known once it is laid out: draw it into a scratch group first.
  const svg = svgEl("svg", { width: W, class: "chart-svg" }, container);
  const rows = drawLegend(svg, entries, pad.l, W - pad.l - pad.r);
  svg.querySelector("g.legend").setAttribute("transform", `translate(0,${pad.t})`);
  pad.t += rows * LEGEND_H + 6;
  const H = 200 + pad.t;
  svg.setAttribute("height", H);
  const sx = (x) => pad.l + ((x - x0) / (x1 - x0)) * (W - pad.l - pad.r);
  const sy = (y) => H - pad.b - ((y - y0) / (y1 - y0)) * (H - pad.t - pad.b);
  const axes = svgEl("g", { class: "axes" }, svg);
  for (const t of yTicks) {
    svgEl("line", { x1: pad.l, x2: W - pad.r, y1: sy(t), y2: sy(t), class: "grid" }, axes);
    svgEl("text", { x: pad.l - 6, y: sy(t) + 4, "text-anchor": "end", class: "tick y" }, axes).textContent = tickText(t, options.logy);
  }
  for (const t of xTicks) {
    svgEl("text", { x: sx(t), y: H - pad.b + 15, "text-anchor": "middle", class: "tick x" }, axes).textContent = String(t);
  }
  svgEl("line", { x1: pad.l, x2: W - pad.r, y1: H - pad.b, y2: H - pad.b, class: "axis-line" }, axes);
  svgEl("line", { x1: pad.l, x2: pad.l, y1: pad.t, y2: H - pad.b, class: "axis-line" }, axes);
  svgEl("text", { x: pad.l + (W - pad.l - pad.r) / 2, y: H - 6, "text-anchor": "middle", class: "axis-title x" }, axes).textContent = options.xTitle || "step";
  const yMid = pad.t + (H - pad.t - pad.b) / 2;
  svgEl("text", { x: 12, y: yMid, "text-anchor": "middle", transform: `rotate(-90 12 ${yMid})`, class: "axis-title y" }, axes).textContent = options.yTitle || "";
  if (options.guide !== undefined) {
    svgEl("line", { x1: pad.l, x2: W - pad.r, y1: sy(options.guide), y2: sy(options.guide), class: "guide" }, svg);
  }
  if (threshold) {
    const line = svgEl("line", { x1: pad.l, x2: W - pad.r, y1: sy(ty(threshold.value)), y2: sy(ty(threshold.value)), class: "threshold" }, svg);
    svgEl("title", {}, line).textContent = threshold.name;
  }
  for (const s of series) {
    const pts = s.points.filter(([, y]) => y !== null && Number.isFinite(ty(y)));
    if (!pts.length) continue;
    if (s.width !== 0) {
      const d = pts.map(([x, y], i) => `${i ? "L" : "M"}${sx(x).toFixed(1)},${sy(ty(y)).toFixed(1)}`).join("");
      const path = svgEl("path", { d, fill: "none", stroke: s.colour, "stroke-width": s.width ?? 1.5, class: `line ${s.cls || ""}` }, svg);
      if (s.dash) path.setAttribute("stroke-dasharray", s.dash);
      svgEl("title", {}, path).textContent = s.name;
    }
    if (s.dots) {
      for (const [x, y] of pts) {
        const c = svgEl("circle", { cx: sx(x), cy: sy(ty(y)), r: s.dots, fill: s.colour, class: `dot ${s.cls || ""}` }, svg);
        svgEl("title", {}, c).textContent = `${s.name} @ ${x}: ${y}`;
      }
    }
  }
  return svg;
}

function runningMean(points, window = 10) {
  const out = [];
  let sum = 0;
  const q = [];
  for (const [x, y] of points) {
    if (y === null) continue;
    q.push(y); sum += y;
    if (q.length > window) sum -= q.shift();
    out.push([x, sum / q.length]);
  }
  return out;
}

const LAYER_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

function layerOf(name) {
  const m = /^blocks\.(\d+)\./.exec(name);
  return m ? Number(m[1]) : null;
}

function draw() {
  const smooth = $("smooth").checked;
  const logy = $("logy").checked;
  const steps = stats.filter((s) => "loss" in s); // not the last evaluation's histograms line
  const statLoss = steps.map((s) => [s.iter, s.loss]);
  const lossSeries = [
    { name: "loss per stats step", points: statLoss, colour: "#9aa7bd", width: 0.8, dots: 0 },
    { name: "train (evaluation)", points: evals.map((e) => [e.iter, e.train_loss]), colour: "#1f5fbf", dots: 3, cls: "train" },
    { name: "val (evaluation)", points: evals.map((e) => [e.iter, e.val_loss]), colour: "#d9541e", dots: 3, cls: "val" },
  ];
  if (smooth && statLoss.length > 2) lossSeries.push({ name: "running mean of 10", points: runningMean(statLoss), colour: "#333", width: 1.5, dash: "4 3" });
  lineChart($("chart-loss"), lossSeries, { logy, yTitle: logy ? "loss (log scale)" : "loss (nats / token)" });
  const grad = steps.map((s) => [s.iter, s.grad_norm]);
  const gradSeries = [
    { name: "grad norm", points: grad, colour: "#5b6b8c", width: 1, dots: 1.5 },
    { name: "clipped", points: steps.filter((s) => s.clipped).map((s) => [s.iter, s.grad_norm]), colour: "#d62728", width: 0, dots: 2.5, cls: "clipped" },
  ];
  if (smooth && grad.length > 2) gradSeries.push({ name: "running mean", points: runningMean(grad), colour: "#333", dash: "4 3" });
  const clip = steps.length ? steps[steps.length - 1].grad_clip : null;
  const threshold = clip > 0 ? { value: clip, name: `clip threshold (grad_clip ${clip})` } : undefined;
  lineChart($("chart-grad"), gradSeries, { threshold, yTitle: "global L2 norm" });
  const lr = steps.length ? steps.map((s) => [s.iter, s.lr]) : evals.map((e) => [e.iter, e.lr]);
  lineChart($("chart-lr"), [{ name: "learning rate", points: lr, colour: "#2ca02c" }], { yTitle: "learning rate" });
  const names = steps.length ? Object.keys(steps[steps.length - 1].params || {}) : [];
  const ratioSeries = names.map((name) => {
    const layer = layerOf(name);
    return {
      name,
      points: steps.map((s) => [s.iter, s.params && s.params[name] ? s.params[name][2] : null]),
      colour: layer === null ? "#888" : LAYER_COLOURS[layer % LAYER_COLOURS.length],
      width: 1,
    };
  });
  const layers = [...new Set(names.map(layerOf))];
  const legend = layers.map((layer) => ({
    name: layer === null ? "embeddings, ln_f" : `block ${layer}`,
    colour: layer === null ? "#888" : LAYER_COLOURS[layer % LAYER_COLOURS.length],
  }));
  legend.push({ name: "guide −3", colour: "#d62728", dash: "6 4" });
  lineChart($("chart-ratio"), ratioSeries, { guide: -3, legend, yTitle: "log10 update / weight" });
  $("ratio-legend").replaceChildren(); // the legend is drawn in the chart
  drawHistograms();
  const last = evals[evals.length - 1];
  $("train-status").textContent = evals.length || stats.length
    ? `${evals.length} evaluations${last ? `, last at step ${last.iter}: train ${last.train_loss.toFixed(4)}, val ${last.val_loss.toFixed(4)}` : ""}; ${steps.length} stats steps`
    : "no log yet (log.jsonl appears with the first evaluation)";
}

// One small bar chart of a [lo, hi, counts] histogram (null: nothing to draw).
function miniHistogram(hist, colour) {
  const W = 118;
  const H = 38;
  const box = el("div");
  const svg = svgEl("svg", { width: W, height: H, class: "hist" }, box);
  if (!hist) {
    svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, svg).textContent = "none";
    return box;
  }
  const [lo, hi, counts] = hist;
  const top = Math.log1p(Math.max(...counts)) || 1;
  const bw = W / counts.length;
  counts.forEach((c, i) => {
    if (!c) return;
    const h = Math.max(1, (Math.log1p(c) / top) * (H - 2));
    const bar = svgEl("rect", { x: (i * bw).toFixed(1), y: (H - h).toFixed(1), width: Math.max(1, bw - 0.5).toFixed(1), height: h.toFixed(1), fill: colour }, svg);
    const a = lo + ((hi - lo) * i) / counts.length;
    const b = lo + ((hi - lo) * (i + 1)) / counts.length;
    svgEl("title", {}, bar).textContent = `[${a.toPrecision(3)}, ${b.toPrecision(3)}): ${c}`;
  });
  if (lo < 0 && hi > 0) {
    const x = ((0 - lo) / (hi - lo)) * W;
    svgEl("line", { x1: x, x2: x, y1: 0, y2: H, class: "zero", stroke: "#999", "stroke-dasharray": "2 2" }, svg);
  }
  const range = el("div", { class: "range" });
  range.append(el("span", {}, lo.toPrecision(2)), el("span", {}, hi.toPrecision(2)));
  box.appendChild(range);
  return box;
}

function drawHistograms() {
  const withHist = stats.filter((s) => s.hist);
  const select = $("hist-step");
  const chosen = select.value;
  const steps = withHist.map((s) => String(s.iter));
  if ([...select.options].map((o) => o.value).join() !== steps.join()) {
    select.replaceChildren(...withHist.map((s) => el("option", { value: String(s.iter) }, `${s.iter - 1}${"loss" in s ? "" : " (the last: weights only)"}`)));
    select.value = steps.includes(chosen) && chosen !== steps[steps.length - 2] ? chosen : steps[steps.length - 1] || "";
  }
  const record = withHist.find((s) => String(s.iter) === select.value);
  if (!record) return;
  const cells = Object.entries(record.hist).map(([name, h]) => {
    const cell = el("div", { class: "hist-cell" });
    cell.appendChild(el("div", { class: "name", title: name }, name));
    const pair = el("div", { class: "hist-pair" });
    pair.append(miniHistogram(h.w, "#3b6fc4"), miniHistogram(h.g, "#e07b1f"));
    cell.appendChild(pair);
    return cell;
  });
  const legend = el("div", { class: "legend-list hist-legend" });
  for (const [name, colour] of [["weights", "#3b6fc4"], ["gradients", "#e07b1f"]]) {
    const item = el("span", { class: "legend-item" }, name);
    item.style.borderColor = colour;
    legend.appendChild(item);
  }
  legend.appendChild(el("span", { class: "muted" }, "x: value, from the smallest to the largest (under each); y: log(1 + count)"));
  $("hists").replaceChildren(legend, ...cells);
}

async function poll() {
  const lastEval = evals.length ? evals[evals.length - 1].iter : -1;
  const lastStat = stats.length ? stats[stats.length - 1].iter : -1;
  const answer = await call(`/api/log?since=${Math.min(lastEval, lastStat)}`);
  if (!answer) return false;
  const newEvals = answer.evals.filter((e) => e.iter > lastEval);
  const newStats = answer.stats.filter((s) => s.iter > lastStat);
  evals.push(...newEvals);
  stats.push(...newStats);
  if (newEvals.length || newStats.length || !$("chart-loss").firstChild) draw();
  return true;
}

export function initDashboard() {
  $("smooth").addEventListener("change", draw);
  $("logy").addEventListener("change", draw);
  $("hist-step").addEventListener("change", drawHistograms);
  poll().then((ok) => {
    if (ok) polling = setInterval(poll, POLL_MS);
  });
}

export function redrawDashboard() {
  draw();
}

export function stopPolling() {
  if (polling !== null) clearInterval(polling);
}
