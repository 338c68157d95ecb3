// glassllm view: the page's entry point. Loads the run's info, wires the tabs and the panels.

import { call, clearError } from "./api.js";
import { initExperiment, setExperimentEnabled, showExperiment } from "./experiment.js";
import { initDashboard, redrawDashboard } from "./dashboard.js";
import { initGraph, showGraph } from "./graph.js";
import { initInside } from "./inside.js";
import { initSample } from "./sample.js";
import { state } from "./util.js";

const $ = (id) => document.getElementById(id);

function showTab(name) {
  document.querySelectorAll("#tabs button").forEach((b) => b.setAttribute("aria-selected", String(b.dataset.tab === name)));
  document.querySelectorAll("section.tab").forEach((s) => { s.hidden = s.id !== `tab-${name}`; });
  if (name === "training") redrawDashboard();
  if (name === "graph") showGraph();
  if (name === "experiment") showExperiment();
}

function describe(info) {
  const c = info.checkpoint;
  if (!c) return `${info.out_dir}: no checkpoint yet (training dashboard only)`;
  const m = c.model_config;
  const loss = c.best_val_loss === null || c.best_val_loss === undefined ? "" : `, best val loss ${c.best_val_loss.toFixed(4)}`;
  const when = c.iteration === null || c.iteration === undefined ? "pretrained (Hugging Face)" : `step ${c.iteration}`;
  return `${when}${loss} · ${c.architecture ?? "GPT"} ${m.n_layer} layers × ${m.n_head} heads × ${m.n_embd} wide, context ${m.block_size}, ${(c.parameters / 1e6).toFixed(2)}M parameters · ${c.tokenizer} tokenizer, vocabulary ${m.vocab_size} · ${c.file}`;
}

async function start() {
  $("alert-close").addEventListener("click", clearError);
  document.querySelectorAll("#tabs button").forEach((b) => b.addEventListener("click", () => showTab(b.dataset.tab)));
  initSample();
  initInside();
  initDashboard();
  initGraph();
  initExperiment();
  const info = await call("/api/info");
  if (!info) { $("info").textContent = "cannot load the run"; return; }
  state.info = info;
  state.vocab = info.checkpoint ? info.checkpoint.vocab : [];
  $("info").textContent = describe(info);
  if (!info.checkpoint) {
    $("generate").disabled = true;
    $("inspect").disabled = true;
    setExperimentEnabled(false);
    showTab("training");
  }
  setInterval(followCheckpoint, 5000);
}

// A run training in another terminal rewrites its checkpoint: say so when the server reloads it.
async function followCheckpoint() {
  const brief = await call("/api/info?brief=1");
  if (!brief || !brief.checkpoint) return;
  const before = state.info && state.info.checkpoint;
  if (before && JSON.stringify(before.stamp) === JSON.stringify(brief.checkpoint.stamp)) return;
  const info = await call("/api/info");
  if (!info || !info.checkpoint) return;
  state.info = info;
  state.vocab = info.checkpoint.vocab;
  $("generate").disabled = false;
  $("inspect").disabled = false;
  setExperimentEnabled(true);
  $("info").textContent = `${describe(info)} · checkpoint updated to step ${info.checkpoint.iteration}`;
}

start();
