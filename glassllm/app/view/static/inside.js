// The "Inside the model" tab: attention heatmaps, the logit lens and MLP neurons, all from one
// /api/inspect pass (glassllm/models/inspect.py: inspect, which records GPT.forward itself).

import { call, clearError } from "./api.js";
import { el, percent, probColour, signedColour, state, tokenSpan, visibleAlone } from "./util.js";

const $ = (id) => document.getElementById(id);
let seen = null; // the /api/inspect answer
let ids = []; // its token ids
const layers = new Map(); // layer -> [head][q][k]
let query = null;

async function layerAttention(layer) {
  if (layers.has(layer)) return layers.get(layer);
  if (seen.attention) { layers.set(layer, seen.attention[layer]); return seen.attention[layer]; }
  const answer = await call("/api/attention", { ids, layer });
  if (!answer) return null;
  layers.set(layer, answer.heads);
  return answer.heads;
}

function drawHeatmap(canvas, matrix, highlightRow = null) {
  const n = matrix.length;
  const ctx = canvas.getContext("2d");
  const cell = canvas.width / n;
  ctx.fillStyle = "#ffffff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let q = 0; q < n; q++) {
    for (let k = 0; k <= q; k++) {
      const a = matrix[q][k];
      ctx.fillStyle = `rgba(32, 78, 160, ${Math.min(1, a ** 0.7).toFixed(3)})`;
      ctx.fillRect(k * cell, q * cell, Math.ceil(cell), Math.ceil(cell));
    }
  }
  ctx.fillStyle = "rgba(0, 0, 0, 0.04)"; // the masked upper triangle
  for (let q = 0; q < n; q++) ctx.fillRect((q + 1) * cell, q * cell, canvas.width, Math.ceil(cell));
  if (highlightRow !== null) {
    ctx.strokeStyle = "#e0701b";
    ctx.lineWidth = 2;
    ctx.strokeRect(1, highlightRow * cell, canvas.width - 2, cell);
  }
}

// The main heatmap's frame: axis titles and every token as a label on both axes (keys above,
// queries at the left), laid out beside the canvas so the cells stay one canvas.
function frameHeatmap() {
  const canvas = $("attn");
  const frame = el("div", { class: "attn-frame" });
  canvas.replaceWith(frame);
  frame.append(
    el("span", { class: "axis attn-corner" }, "key →\nquery ↓"),
    el("div", { class: "attn-keys", id: "attn-keys" }),
    el("div", { class: "attn-queries", id: "attn-queries" }),
    canvas,
  );
}

function labelHeatmap(tokens) {
  const n = tokens.length;
  const every = Math.max(1, Math.ceil((n * 11) / 420)); // at most one label per 11 px
  for (const [id, axis] of [["attn-keys", "key"], ["attn-queries", "query"]]) {
    const box = $(id);
    box.style.setProperty("--n", String(n));
    box.replaceChildren(...tokens.map((token, k) => {
      const label = el("span", { class: "attn-label" }, k % every ? "" : visibleAlone(token.text));
      label.title = `${axis} ${k}: ${token.repr}`;
      return label;
    }));
  }
}

async function showAttention() {
  if (!seen) return;
  const layer = Number($("attn-layer").value);
  const head = Number($("attn-head").value);
  const heads = await layerAttention(layer);
  if (!heads) return;
  drawHeatmap($("attn"), heads[head], query);
  document.querySelectorAll("#attn-grid canvas").forEach((c) => {
    c.classList.toggle("on", Number(c.dataset.layer) === layer && Number(c.dataset.head) === head);
  });
  const strip = $("attn-strip");
  strip.querySelectorAll(".tok").forEach((span, k) => {
    const a = query === null || k > query ? 0 : heads[head][query][k];
    span.style.background = query === null ? "" : `rgba(32, 78, 160, ${Math.min(1, a ** 0.7) * 0.8})`;
    span.style.color = a > 0.45 ? "#fff" : "";
    span.classList.toggle("selected", k === query);
  });
  if (query !== null) {
    const row = heads[head][query];
    const top = row.map((a, k) => [a, k]).sort((x, y) => y[0] - x[0]).slice(0, 4);
    const parts = top.map(([a, k]) => `${seen.tokens[k].repr}@${k} ${a.toFixed(3)}`);
    $("attn-readout").textContent = `query ${query} ${seen.tokens[query].repr} attends to ${parts.join(", ")}`;
  }
}

async function drawOverview() {
  const grid = $("attn-grid");
  grid.replaceChildren();
  grid.style.gridTemplateColumns = `auto repeat(${seen.n_head}, 1fr)`;
  grid.appendChild(el("span", {}, ""));
  for (let h = 0; h < seen.n_head; h++) grid.appendChild(el("span", { class: "axis" }, `head ${h}`));
  for (let l = 0; l < seen.n_layer; l++) {
    grid.appendChild(el("span", { class: "axis" }, `layer ${l}`));
    const heads = seen.attention ? seen.attention[l] : null;
    for (let h = 0; h < seen.n_head; h++) {
      const canvas = el("canvas", { width: 72, height: 72, "data-layer": String(l), "data-head": String(h) });
      canvas.title = `layer ${l}, head ${h}`;
      canvas.addEventListener("click", () => {
        $("attn-layer").value = String(l);
        $("attn-head").value = String(h);
        showAttention();
      });
      if (heads) drawHeatmap(canvas, heads[h]);
      grid.appendChild(canvas);
    }
  }
  if (!seen.attention) {
    // Too large to send at once: fetch the layers one by one (each is cached for the heatmap).
    for (let l = 0; l < seen.n_layer; l++) {
      const heads = await layerAttention(l);
      if (!heads) return;
      grid.querySelectorAll(`canvas[data-layer="${l}"]`).forEach((c) => drawHeatmap(c, heads[Number(c.dataset.head)]));
    }
  }
}

function drawLens() {
  const table = $("lens");
  table.replaceChildren();
  const head = el("tr");
  head.appendChild(el("th", { class: "corner" }, ""));
  seen.tokens.forEach((t) => head.appendChild(el("th", { class: "tokhead" }, visibleAlone(t.text))));
  table.appendChild(head);
  seen.lens.rows.forEach((name, r) => {
    const row = el("tr");
    row.appendChild(el("th", { class: "rowname" }, name));
    seen.tokens.forEach((token, t) => {
      const topIds = seen.lens.top_ids[r][t];
      const topP = seen.lens.top_p[r][t];
      const best = state.vocab[topIds[0]] || { text: String(topIds[0]) };
      const cell = el("td", { class: "lcell" }, visibleAlone(best.text));
      cell.style.background = probColour(topP[0]);
      const next = t + 1 < seen.tokens.length ? seen.tokens[t + 1].id : null;
      if (next !== null && topIds[0] === next) cell.classList.add("hit");
      // Where this stage changed its mind: the top-1 differs from the row above.
      if (r > 0 && seen.lens.top_ids[r - 1][t][0] !== topIds[0]) cell.classList.add("changed");
      const lines = topIds.map((id, j) => `${state.vocab[id] ? state.vocab[id].repr : id} ${percent(topP[j])}`);
      const pNext = next === null ? "" : `\np(actual next ${seen.tokens[t + 1].repr}) = ${percent(seen.lens.p_next[r][t])}`;
      cell.title = `${name}, after ${token.repr} (position ${t}):\n${lines.join("\n")}${pNext}`;
      row.appendChild(cell);
    });
    table.appendChild(row);
  });
}

function drawNeurons() {
  const strip = $("mlp-strip");
  strip.replaceChildren();
  seen.tokens.forEach((token, t) => {
    const span = tokenSpan(token, "plain");
    span.addEventListener("click", () => showUnits(t));
    strip.appendChild(span);
  });
  $("mlp-active").textContent = `Fraction of units with a positive ${seen.mlp.activation} output, per layer: ${
    seen.mlp.active_fraction.map((f, l) => `layer ${l} ${percent(f)}`).join(" · ")}`;
  $("mlp-units").replaceChildren();
}

function showUnits(t) {
  document.querySelectorAll("#mlp-strip .tok").forEach((s, k) => s.classList.toggle("selected", k === t));
  const box = $("mlp-units");
  box.replaceChildren(el("p", { class: "muted" }, `Most active units at position ${t} (${seen.tokens[t].repr}):`));
  seen.mlp.top_units.forEach((units, layer) => {
    const row = el("div", { class: "unit-row" });
    row.appendChild(el("span", { class: "axis" }, `layer ${layer}`));
    units[t].forEach((unit, j) => {
      const b = el("button", { class: "unit", "data-layer": String(layer), "data-unit": String(unit) },
        `#${unit} ${seen.mlp.top_values[layer][t][j].toFixed(2)}`);
      b.addEventListener("click", () => colourByUnit(layer, unit, b));
      row.appendChild(b);
    });
    box.appendChild(row);
  });
}

async function colourByUnit(layer, index, button) {
  const answer = await call("/api/neuron", { ids, layer, index });
  if (!answer) return;
  document.querySelectorAll(".unit.on").forEach((b) => b.classList.remove("on"));
  button.classList.add("on");
  const scale = Math.max(...answer.values.map(Math.abs));
  document.querySelectorAll("#mlp-strip .tok").forEach((span, k) => {
    span.style.background = signedColour(answer.values[k], scale);
    span.title = `layer ${layer} unit ${index}: ${answer.values[k].toFixed(4)}`;
  });
  $("mlp-active").textContent = `layer ${layer}, unit ${index}: max |activation| ${scale.toFixed(3)} over the text (orange positive, blue negative)`;
}

export async function inspectCurrent() {
  clearError();
  const prompt = $("prompt").value;
  const body = state.ids.length ? { ids: state.ids } : { prompt };
  $("inspect").disabled = true;
  try {
    const answer = await call("/api/inspect", body);
    if (!answer) return;
    seen = answer;
    ids = answer.tokens.map((t) => t.id);
    layers.clear();
    query = null;
    $("inspect-summary").textContent = `${answer.tokens.length} tokens${answer.cropped ? " (cropped to the last block_size)" : ""}`;
    const badge = $("badge");
    badge.hidden = false;
    badge.textContent = `traced = forward: max |inspected − model(idx) logits| ${answer.logits_diff.toExponential(1)}, |P·V − fused attention| ${answer.attention_check.toExponential(1)}`;
    badge.classList.toggle("bad", answer.logits_diff > 1e-4 || answer.attention_check > 1e-4);
    $("attn-source").textContent = answer.sources.attention;
    $("lens-source").textContent = answer.sources.lens;
    $("mlp-source").textContent = answer.sources.mlp;
    const fill = (select, n, name) => {
      select.replaceChildren(...Array.from({ length: n }, (_, i) => el("option", { value: String(i) }, `${name} ${i}`)));
    };
    labelHeatmap(answer.tokens);
    fill($("attn-layer"), answer.n_layer, "layer");
    fill($("attn-head"), answer.n_head, "head");
    const strip = $("attn-strip");
    strip.replaceChildren();
    answer.tokens.forEach((token, k) => {
      const span = tokenSpan(token, "plain");
      span.addEventListener("click", () => { query = k; showAttention(); });
      strip.appendChild(span);
    });
    await drawOverview();
    await showAttention();
    drawLens();
    drawNeurons();
  } finally {
    $("inspect").disabled = false;
  }
}

export function initInside() {
  frameHeatmap();
  $("inspect").addEventListener("click", inspectCurrent);
  $("attn-layer").addEventListener("change", () => showAttention());
  $("attn-head").addEventListener("change", () => showAttention());
  $("attn").addEventListener("click", (event) => {
    if (!seen) return;
    const rect = event.target.getBoundingClientRect();
    query = Math.min(seen.tokens.length - 1, Math.floor(((event.clientY - rect.top) / rect.height) * seen.tokens.length));
    showAttention();
  });
}
