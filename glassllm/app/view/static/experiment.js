// The Experiment tab: activation patching, ablation, steering and attribution, each one POST to
// /api/experiment/* (glassllm/app/view/experiment_api.py, on glassllm.interp).

import { call, showError } from "./api.js";
import { el, percent, signedColour, state, visible, visibleAlone } from "./util.js";

const $ = (id) => document.getElementById(id);

// Run ``work`` with ``button`` disabled and "computing…" beside it (a sweep can take seconds).
async function busy(button, status, work) {
  button.disabled = true;
  status.textContent = "computing…";
  status.classList.add("computing");
  try {
    return await work();
  } finally {
    button.disabled = false;
    status.classList.remove("computing");
  }
}

// A heatmap of values[row][col] with labelled axes, a colour scale and clickable cells.
// ``colour(v)`` gives a cell's colour; ``onCell(row, col, value)`` is called on a click.
function heatmap(box, { values, rows, cols, rowTitle, colTitle, colour, legend, onCell }) {
  box.replaceChildren();
  const figure = el("div", { class: "xp-heatmap" });
  const grid = el("div", { class: "xp-grid" });
  grid.style.gridTemplateColumns = `auto repeat(${cols.length}, minmax(22px, 1fr))`;
  grid.append(el("span", { class: "xp-corner" }, ""));
  for (const label of cols) grid.append(el("span", { class: "xp-col", title: label }, visibleAlone(label)));
  values.forEach((row, r) => {
    grid.append(el("span", { class: "xp-row" }, rows[r]));
    row.forEach((value, c) => {
      const cell = el("button", { class: "xp-cell", title: `${rows[r]}, ${cols[c]}: ${value.toFixed(4)}` });
      cell.dataset.row = String(r);
      cell.dataset.col = String(c);
      cell.style.background = colour(value);
      cell.addEventListener("click", () => {
        box.querySelectorAll(".xp-cell.selected").forEach((x) => x.classList.remove("selected"));
        cell.classList.add("selected");
        onCell(r, c, value);
      });
      grid.append(cell);
    });
  });
  figure.append(el("div", { class: "xp-axis-y" }, rowTitle), grid);
  box.append(figure, el("div", { class: "xp-axis-x" }, colTitle), legend);
}

function scaleLegend(left, right, colour) {
  const bar = el("div", { class: "xp-scale" });
  for (let i = 0; i <= 20; i++) {
    const swatch = el("span", { class: "xp-swatch" });
    swatch.style.background = colour(-1 + i / 10);
    bar.append(swatch);
  }
  const box = el("div", { class: "xp-legend" });
  box.append(el("span", {}, left), bar, el("span", {}, right));
  return box;
}

function distTable(title, dist) {
  const table = el("table", { class: "xp-dist" });
  table.append(el("caption", {}, title));
  for (const t of dist) {
    const tr = el("tr");
    tr.append(el("td", { class: "tokcell" }, visibleAlone(t.text)), el("td", { class: "p" }, percent(t.p)));
    table.append(tr);
  }
  return table;
}

function continuation(title, prompt, tokens) {
  const box = el("div", { class: "xp-text" });
  box.append(el("h4", {}, title));
  const text = el("div", { class: "tokens" });
  for (const t of prompt) text.append(el("span", { class: "tok prompt" }, visible(t.text)));
  for (const t of tokens) text.append(el("span", { class: "tok gen" }, visible(t.text)));
  box.append(text);
  return box;
}

// An answer field: "#123" is token id 123, anything else the text of one token (a digit may
// be a token of its own, so a bare number stays text).
function tokenField(id) {
  const value = $(id).value;
  return /^#[0-9]+$/.test(value) ? Number(value.slice(1)) : value;
}

// ---------------------------------------------------------------- patching

// The sweep's exactness badge: patching all of layer 0's resid_pre is the clean run itself.
function fullPatch(checks) {
  const gap = checks.full_patch_gap;
  return gap === undefined ? "" : ` · all of L0 patched − clean: ${gap.toExponential(1)}`;
}

// The sweeps on screen, each {request, answer}: "activation" (measured) and "attribution"
// (its first-order estimate); the correlation between them is shown when both are of one request.
const shown = { activation: null, attribution: null };
const BOXES = { activation: ["xp-resid", "xp-heads"], attribution: ["xp-resid-atp", "xp-heads-atp"] };

function patchRequest() {
  return {
    clean: $("xp-clean").value,
    corrupted: $("xp-corrupted").value,
    answer: tokenField("xp-answer"),
    wrong: tokenField("xp-wrong"),
  };
}

function metricsLine(answer) {
  return `logit diff '${visibleAlone(answer.answer.text)}' − '${visibleAlone(answer.wrong.text)}': clean ${answer.clean_metric.toFixed(3)}, corrupted ${answer.corrupted_metric.toFixed(3)}`;
}

// Both heatmaps of one sweep (its rows so far, while a sweep is coming in layer by layer).
function drawSweep(method, request, answer) {
  const corrupted = answer.corrupted_metric;
  const span = answer.clean_metric - corrupted;
  // Colour: the share of the clean-minus-corrupted logit difference the patch restores.
  const colour = (v) => signedColour(span === 0 ? 0 : (v - corrupted) / span, 1);
  const legend = () => scaleLegend("−1", "1: share of the logit difference restored (0 corrupted, 1 clean)", (t) => signedColour(t, 1));
  const [residBox, headsBox] = BOXES[method];
  const layers = answer.resid.layers;
  heatmap($(residBox), {
    values: answer.resid.values, rows: layers.map((l) => `L${l}`), cols: answer.resid.positions,
    rowTitle: "layer (resid_pre)", colTitle: "position (clean prompt's token)", colour, legend: legend(),
    onCell: (r, c, v) => patchCell(request, { point: "resid_pre", layer: layers[r], pos: c }, `resid_pre L${layers[r]}, position ${c} '${visibleAlone(answer.resid.positions[c])}'`, method, v),
  });
  heatmap($(headsBox), {
    values: answer.heads.values, rows: answer.heads.layers.map((l) => `L${l}`), cols: answer.heads.heads,
    rowTitle: "layer (hook_z)", colTitle: "head (every position)", colour, legend: legend(),
    onCell: (r, c, v) => patchCell(request, { point: "z", layer: answer.heads.layers[r], head: c }, `head L${answer.heads.layers[r]}H${c}`, method, v),
  });
}

// One layer's rows appended to the sweep so far.
function appendRows(sweep, part) {
  for (const key of ["resid", "heads"]) {
    sweep[key].values.push(...part[key].values);
    sweep[key].layers.push(...part[key].layers);
  }
  return sweep;
}

// The activation sweep, one layer per request: each request is a bounded piece of work, the
// heatmaps grow a row at a time and the bar counts the layers done.
async function runPatch() {
  const request = patchRequest();
  const button = $("xp-patch-run"), status = $("xp-patch-status"), bar = $("xp-patch-progress");
  button.disabled = $("xp-atp-run").disabled = true; // one sweep's status line at a time
  status.classList.add("computing");
  let total = 1, sweep = null;
  const progress = (done) => {
    bar.max = total; bar.value = done; bar.hidden = false;
    status.textContent = `computing… ${done} of ${sweep ? total : "?"} layers`;
  };
  progress(0);
  try {
    for (let layer = 0; layer < total; layer++) {
      const part = await call("/api/experiment/patch", { ...request, layer });
      if (!part) { status.textContent = sweep ? `stopped after ${layer} of ${total} layers` : ""; return; }
      if (sweep && part.checkpoint.join() !== sweep.checkpoint.join()) {
        showError("the checkpoint changed during the sweep (training saved a new one); run the sweep again");
        status.textContent = `stopped after ${layer} of ${total} layers`;
        return;
      }
      if (!sweep) $("xp-cell").replaceChildren();
      sweep = sweep ? appendRows(sweep, part) : part;
      total = part.n_layer;
      drawSweep("activation", request, sweep);
      progress(layer + 1);
    }
    shown.activation = { request, answer: sweep };
    status.textContent = metricsLine(sweep) + fullPatch(sweep.resid.checks);
    $("xp-cell").replaceChildren(el("p", { class: "muted" }, "click a cell for its value and the patched next-token distribution"));
    showCorrelation();
  } finally {
    button.disabled = $("xp-atp-run").disabled = false;
    status.classList.remove("computing");
    bar.hidden = true;
  }
}

async function runAttributionPatch() {
  const request = patchRequest();
  const answer = await busy($("xp-atp-run"), $("xp-patch-status"), () => call("/api/experiment/patch", { ...request, method: "attribution" }));
  if (!answer) { $("xp-patch-status").textContent = ""; return; }
  shown.attribution = { request, answer };
  $("xp-atp").hidden = false;
  drawSweep("attribution", request, answer);
  $("xp-patch-status").textContent = `${metricsLine(answer)} · attribution estimate: one forward and one backward per grid`;
  showCorrelation();
}

// Pearson's r of two grids' cells; null when either is constant.
function correlation(a, b) {
  const x = a.flat(), y = b.flat();
  const mean = (v) => v.reduce((s, t) => s + t, 0) / v.length;
  const mx = mean(x), my = mean(y);
  let sxy = 0, sxx = 0, syy = 0;
  x.forEach((xi, i) => { sxy += (xi - mx) * (y[i] - my); sxx += (xi - mx) ** 2; syy += (y[i] - my) ** 2; });
  return sxx > 0 && syy > 0 ? sxy / Math.sqrt(sxx * syy) : null;
}

function showCorrelation() {
  const { activation, attribution } = shown;
  const box = $("xp-atp-corr");
  if (!activation || !attribution || JSON.stringify(activation.request) !== JSON.stringify(attribution.request)) {
    box.textContent = attribution ? "run the sweep on the same prompts to compare the estimate with it" : "";
    return;
  }
  const r = (key) => {
    const value = correlation(activation.answer[key].values, attribution.answer[key].values);
    return value === null ? "undefined (a constant grid)" : value.toFixed(3);
  };
  box.textContent = `correlation with the sweep above (Pearson r over the cells): residual ${r("resid")}, heads ${r("heads")}`;
}

async function patchCell(request, where, name, method, shownValue) {
  const box = $("xp-cell");
  box.replaceChildren(el("p", { class: "muted computing" }, "computing…"));
  const answer = await call("/api/experiment/patch_cell", { ...request, ...where });
  if (!answer) { box.replaceChildren(); return; }
  const row = el("div", { class: "xp-pair" });
  row.append(distTable("patched", answer.patched), distTable("corrupted run", answer.corrupted));
  const value = method === "attribution"
    ? `${name}: attribution estimate ${shownValue.toFixed(4)}, patched logit diff ${answer.value.toFixed(4)}`
    : `${name}: patched logit diff ${answer.value.toFixed(4)}`;
  box.replaceChildren(el("p", { class: "xp-value" }, value), row);
}

// ---------------------------------------------------------------- ablation

function buildAblationParts() {
  const config = state.info && state.info.checkpoint ? state.info.checkpoint.model_config : null;
  const box = $("xp-parts");
  if (!config || box.dataset.layers === String(config.n_layer) + "x" + config.n_head) return;
  box.dataset.layers = String(config.n_layer) + "x" + config.n_head;
  box.replaceChildren();
  for (let l = 0; l < config.n_layer; l++) {
    const row = el("div", { class: "xp-part-row" });
    row.append(el("span", { class: "xp-row" }, `L${l}`));
    for (let h = 0; h < config.n_head; h++) row.append(partBox(`H${h}`, { head: [l, h] }));
    row.append(partBox("attn", { layer: ["attn", l] }), partBox("mlp", { layer: ["mlp", l] }));
    box.append(row);
  }
}

function partBox(label, part) {
  const input = el("input", { type: "checkbox", class: "xp-part" });
  input.dataset.part = JSON.stringify(part);
  const lab = el("label", { class: "xp-toggle" });
  lab.append(input, document.createTextNode(label));
  return lab;
}

function neuronsField() {
  const text = $("xp-neurons").value.trim();
  if (!text) return [];
  return text.split(/[\s,]+/).map((item) => {
    const m = /^L(\d+)N(\d+)$/i.exec(item);
    return m ? [Number(m[1]), Number(m[2])] : item; // the server names a malformed item
  });
}

async function runAblation() {
  const heads = [], layers = [];
  document.querySelectorAll("#xp-parts input.xp-part:checked").forEach((input) => {
    const part = JSON.parse(input.dataset.part);
    if (part.head) heads.push(part.head); else layers.push(part.layer);
  });
  const request = {
    prompt: $("xp-abl-prompt").value, heads, layers, neurons: neuronsField(), how: $("xp-how").value,
    reference: $("xp-abl-ref").value,
    max_new_tokens: Number($("xp-abl-tokens").value), seed: Number($("xp-abl-seed").value),
  };
  const answer = await busy($("xp-abl-run"), $("xp-abl-status"), () => call("/api/experiment/ablate", request));
  if (!answer) { $("xp-abl-status").textContent = ""; return; }
  $("xp-abl-status").textContent = `${answer.how}-ablated ${answer.parts.join(", ")}: KL(base ‖ ablated) ${answer.kl.toFixed(4)} nats`;
  const out = $("xp-abl-out");
  const pair = el("div", { class: "xp-pair" });
  const left = el("div"), right = el("div");
  left.append(distTable("unablated", answer.base), continuation("unablated continuation", answer.prompt, answer.base_continuation));
  right.append(distTable("ablated", answer.ablated));
  if (answer.ablated_continuation) {
    right.append(continuation("ablated continuation", answer.prompt, answer.ablated_continuation));
  } else { // resample: past the prompt the reference prompt has no activation to put in
    const reference = answer.reference.map((t) => visible(t.text)).join("");
    right.append(el("p", { class: "muted xp-no-continuation" }, `resampled from '${reference}': no continuation (past the prompt the reference has no activations to put in)`));
  }
  pair.append(left, right);
  out.replaceChildren(pair);
}

// ---------------------------------------------------------------- steering

async function runSteering() {
  const request = {
    positive: $("xp-pos").value, negative: $("xp-neg").value, prompt: $("xp-steer-prompt").value,
    layer: Number($("xp-steer-layer").value), strength: Number($("xp-strength").value),
    max_new_tokens: Number($("xp-steer-tokens").value), seed: Number($("xp-steer-seed").value),
  };
  const answer = await busy($("xp-steer-run"), $("xp-steer-status"), () => call("/api/experiment/steer", request));
  if (!answer) { $("xp-steer-status").textContent = ""; return; }
  $("xp-steer-status").textContent = `${answer.name}: |direction| ${answer.norm.toFixed(3)} (typical |activation| ${answer.act_norm.toFixed(3)}), strength ${answer.strength}`;
  const pair = el("div", { class: "xp-pair" });
  pair.append(
    continuation("without steering", answer.prompt, answer.base_continuation),
    continuation(`steered (× ${answer.strength})`, answer.prompt, answer.steered_continuation),
  );
  $("xp-steer-out").replaceChildren(pair);
}

// ---------------------------------------------------------------- attribution

async function runAttribution() {
  const request = {
    prompt: $("xp-attr-prompt").value, answer: tokenField("xp-attr-answer"), wrong: tokenField("xp-attr-wrong"),
    method: $("xp-method").value,
  };
  const answer = await busy($("xp-attr-run"), $("xp-attr-status"), () => call("/api/experiment/attribute", request));
  if (!answer) { $("xp-attr-status").textContent = ""; return; }
  const dla = answer.dla;
  $("xp-attr-status").textContent = `logit diff ${dla.logit_diff.toFixed(4)} = sum of the bars + ${dla.gap.toExponential(1)}`;
  const scale = Math.max(1e-12, ...dla.values.map(Math.abs));
  const bars = el("div", { class: "xp-bars" });
  dla.labels.forEach((label, i) => {
    const v = dla.values[i];
    const row = el("div", { class: "xp-bar-row", title: `${label}: ${v.toFixed(4)}` });
    const track = el("div", { class: "xp-track" });
    const bar = el("div", { class: `xp-bar ${v < 0 ? "neg" : "pos"}` });
    bar.style.width = `${(50 * Math.abs(v)) / scale}%`;
    bar.style[v < 0 ? "right" : "left"] = "50%";
    track.append(bar);
    row.append(el("span", { class: "xp-bar-label" }, label), track, el("span", { class: "xp-bar-value" }, v.toFixed(3)));
    bars.append(row);
  });
  const sal = answer.saliency;
  const salScale = Math.max(1e-12, ...sal.values.map(Math.abs));
  const text = el("div", { class: "tokens xp-saliency" });
  answer.prompt.forEach((t, i) => {
    const span = el("span", { class: "tok", title: `${sal.values[i].toFixed(4)}` }, visible(t.text));
    span.style.background = signedColour(sal.values[i], salScale);
    text.append(span);
  });
  const gap = sal.gap === null ? "" : ` (completeness gap ${sal.gap.toExponential(1)} at ${sal.n_steps} steps)`;
  $("xp-attr-out").replaceChildren(
    el("h4", {}, `Direct logit attribution at the last token: '${visibleAlone(answer.answer.text)}' over '${visibleAlone(answer.wrong.text)}'`),
    bars,
    el("h4", {}, `Input-token saliency: ${sal.method.replace(/_/g, " ")}${gap}`),
    text,
    scaleLegend("against the answer", "for the answer", (t) => signedColour(t, 1)),
  );
}

export function showExperiment() {
  buildAblationParts();
  const config = state.info && state.info.checkpoint ? state.info.checkpoint.model_config : null;
  const select = $("xp-steer-layer");
  if (config && select.options.length !== config.n_layer) {
    select.replaceChildren(...Array.from({ length: config.n_layer }, (_, l) => el("option", { value: String(l) }, `L${l}`)));
  }
}

const BUTTONS = ["xp-patch-run", "xp-atp-run", "xp-abl-run", "xp-steer-run", "xp-attr-run"];

// Without a checkpoint (a run before its first evaluation) there is no model to experiment on.
export function setExperimentEnabled(enabled) {
  for (const id of BUTTONS) $(id).disabled = !enabled;
}

export function initExperiment() {
  $("xp-patch-run").addEventListener("click", runPatch);
  $("xp-atp-run").addEventListener("click", runAttributionPatch);
  $("xp-abl-run").addEventListener("click", runAblation);
  $("xp-steer-run").addEventListener("click", runSteering);
  $("xp-attr-run").addEventListener("click", runAttribution);
}
