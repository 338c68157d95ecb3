// The Sample tab: generate, see each token's probability, its alternatives, branch from one.
// Numbers come from /api/generate (glassllm/models/generation.py: explain, the function behind
// `glassllm sample --explain`) and /api/distribution.

import { call, clearError } from "./api.js";
import { el, percent, probColour, state, tokenSpan, visible } from "./util.js";

const $ = (id) => document.getElementById(id);
const history = []; // {label, result}
const conversation = []; // the chat mode's messages, {role, content}
let current = null; // the /api/generate answer on show
let dist = null; // {logits, drawn}

function options() {
  const read = (id) => Number($(id).value);
  const optional = (id) => ($(id).value.trim() === "" ? null : Number($(id).value));
  return {
    max_new_tokens: read("max-tokens"),
    temperature: read("temperature"),
    top_k: optional("top-k"),
    top_p: optional("top-p"),
    min_p: optional("min-p"),
    seed: read("seed"),
  };
}

function render(result) {
  current = result;
  const box = $("tokens");
  box.replaceChildren();
  for (const token of result.prompt) box.appendChild(tokenSpan(token, "prompt"));
  result.tokens.forEach((token, i) => {
    const span = tokenSpan(token, "gen");
    span.style.background = probColour(token.p);
    span.title = `step ${token.step}: ${token.repr} drawn with p = ${percent(token.p)}`;
    span.dataset.step = String(i + 1);
    span.tabIndex = 0;
    span.addEventListener("click", () => select(i));
    span.addEventListener("keydown", (e) => { if (e.key === "Enter") select(i); });
    box.appendChild(span);
  });
  state.ids = [...result.prompt.map((t) => t.id), ...result.tokens.map((t) => t.id)];
  state.promptLength = result.prompt.length;
  $("command").textContent = result.command
    ? `Same tokens in the terminal: ${result.command}` : `source: ${result.source}`;
  $("alts-cap").textContent = "Click a generated token";
  $("alts").replaceChildren();
  $("dist-box").hidden = true;
  renderBreadcrumb();
}

function renderBreadcrumb() {
  const crumb = $("breadcrumb");
  crumb.replaceChildren();
  history.forEach((entry, i) => {
    if (i > 0) crumb.appendChild(el("span", { class: "sep" }, "›"));
    const item = el("button", { class: entry.result === current ? "crumb on" : "crumb" }, entry.label);
    item.addEventListener("click", () => render(entry.result));
    crumb.appendChild(item);
  });
}

async function generate(body, label) {
  clearError();
  $("generate").disabled = true;
  try {
    const result = await call("/api/generate", { ...options(), ...body });
    if (!result) return;
    history.push({ label, result });
    render(result);
  } finally {
    $("generate").disabled = false;
  }
}

async function select(i) {
  const token = current.tokens[i];
  document.querySelectorAll("#tokens .tok.selected").forEach((s) => s.classList.remove("selected"));
  const span = document.querySelector(`#tokens .tok.gen[data-step="${i + 1}"]`);
  if (span) span.classList.add("selected");
  $("alts-cap").textContent = `step ${token.step}: ${token.repr} was drawn with p = ${percent(token.p)}`;
  const table = $("alts");
  table.replaceChildren(el("tr", {}, null));
  table.firstChild.append(el("th", {}, "token"), el("th", {}, "p (after T, top-k, top-p, min-p)"), el("th", {}, ""));
  for (const alt of token.top) {
    const row = el("tr", { class: alt.id === token.id ? "alt drawn" : "alt" });
    const bar = el("div", { class: "bar" });
    bar.style.width = `${Math.max(1, 100 * alt.p)}%`;
    bar.style.background = probColour(alt.p, 0.8);
    const pCell = el("td", { class: "p" });
    pCell.append(bar, el("span", {}, percent(alt.p)));
    const branch = el("button", { class: "branch" }, "branch");
    branch.title = `continue from here with ${alt.repr} instead of ${token.repr}`;
    branch.addEventListener("click", () => {
      const prefix = [...current.prompt.map((t) => t.id), ...current.tokens.slice(0, i).map((t) => t.id)];
      generate({ ids: [...prefix, alt.id] }, `branched at step ${token.step}: ${token.repr} → ${alt.repr}`);
    });
    row.append(el("td", { class: "repr" }, alt.repr), pCell, el("td", {}, null));
    row.lastChild.appendChild(branch);
    table.appendChild(row);
  }
  const prefix = [...current.prompt.map((t) => t.id), ...current.tokens.slice(0, i).map((t) => t.id)];
  const answer = await call("/api/distribution", { ids: prefix });
  if (!answer) return;
  dist = { logits: answer.logits, drawn: token.id };
  $("dist-temp").value = String(current.options.temperature);
  $("dist-topk").max = String(answer.logits.length);
  $("dist-topk").value = String(current.options.top_k ?? answer.logits.length);
  $("dist-box").hidden = false;
  drawDistribution();
}

function softmax(z) {
  const max = Math.max(...z);
  const exps = z.map((v) => (v === -Infinity ? 0 : Math.exp(v - max)));
  const sum = exps.reduce((a, b) => a + b, 0);
  return exps.map((e) => e / sum);
}

// softmax(logits / T) over the top-k largest (ties at the k-th kept), then top-p (nucleus) and
// min-p (null or undefined: off), as glassllm.models.sampling.distribution (transformers' order).
export function probabilities(logits, temperature, topK, topP = null, minP = null) {
  const scaled = logits.map((z) => z / temperature);
  let kth = -Infinity;
  if (topK < scaled.length) kth = [...scaled].sort((a, b) => b - a)[topK - 1];
  let kept = scaled.map((z) => (z < kth ? -Infinity : z));
  if (topP !== null && topP < 1) { // drop the least likely while their total is <= 1 - p
    const order = kept.map((v, i) => i).sort((a, b) => kept[a] - kept[b] || a - b);
    const p = softmax(order.map((i) => kept[i]));
    let total = 0;
    const removed = new Set();
    order.forEach((id, rank) => {
      total += p[rank];
      if (total <= 1 - topP && rank < order.length - 1) removed.add(id);
    });
    kept = kept.map((z, i) => (removed.has(i) ? -Infinity : z));
  }
  if (minP) { // drop those below min_p times the most likely one's probability
    const p = softmax(kept);
    const threshold = Math.max(...p) * minP;
    kept = kept.map((z, i) => (p[i] < threshold ? -Infinity : z));
  }
  return softmax(kept);
}

function drawDistribution() {
  if (!dist) return;
  const temperature = Number($("dist-temp").value);
  const topK = Number($("dist-topk").value);
  $("dist-temp-val").textContent = temperature.toFixed(2);
  $("dist-topk-val").textContent = String(topK);
  const p = probabilities(dist.logits, temperature, topK, current.options.top_p, current.options.min_p);
  const order = p.map((v, i) => i).sort((a, b) => p[b] - p[a]).slice(0, 16);
  const box = $("dist");
  box.replaceChildren();
  for (const id of order) {
    const row = el("div", { class: id === dist.drawn ? "drow drawn" : "drow" });
    const bar = el("div", { class: "bar" });
    bar.style.width = `${Math.max(0.5, 100 * p[id])}%`;
    bar.style.background = probColour(p[id], 0.8);
    const label = state.vocab[id] ? state.vocab[id].repr : String(id);
    row.append(el("span", { class: "repr" }, label), el("div", { class: "track" }), el("span", { class: "pv" }, percent(p[id])));
    row.children[1].appendChild(bar);
    box.appendChild(row);
  }
}

// Chat mode: the prompt box holds the next user message; /api/chat (glassllm/app/view/chat_api.py)
// renders the whole conversation with the model's chat template and answers it, explained.
function renderConversation() {
  const log = $("chat-log");
  log.replaceChildren();
  for (const m of conversation) {
    log.appendChild(el("div", { class: `msg ${m.role === "user" ? "user" : "assistant"}` }, `${m.role}: ${m.content}`));
  }
  log.hidden = conversation.length === 0;
}

async function sendChat() {
  const message = $("prompt").value;
  if (!message.trim()) return;
  clearError();
  $("generate").disabled = true;
  try {
    const messages = [...conversation, { role: "user", content: message }];
    const result = await call("/api/chat", { ...options(), messages });
    if (!result) return;
    conversation.push(messages[messages.length - 1], { role: "assistant", content: result.reply });
    $("prompt").value = "";
    renderConversation();
    history.push({ label: `chat: “${visible(message).slice(0, 24)}”`, result });
    render(result);
  } finally {
    $("generate").disabled = false;
  }
}

export function initSample() {
  $("generate").addEventListener("click", () => {
    if ($("chat-mode").checked) return sendChat();
    const prompt = $("prompt").value;
    generate({ prompt }, `“${visible(prompt).slice(0, 24)}” seed ${$("seed").value}`);
  });
  $("chat-mode").addEventListener("change", () => {
    $("generate").textContent = $("chat-mode").checked ? "Send" : "Generate";
    $("chat-reset").hidden = !$("chat-mode").checked;
  });
  $("chat-reset").addEventListener("click", () => { conversation.length = 0; renderConversation(); });
  $("dist-temp").addEventListener("input", drawDistribution);
  $("dist-topk").addEventListener("input", drawDistribution);
  document.querySelectorAll(".swatch").forEach((s) => { s.style.background = probColour(Number(s.dataset.p)); });
}
