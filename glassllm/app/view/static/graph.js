// The "Autograd graph" tab: a fixed expression with editable numbers; /api/graph runs forward
// and backward (glassllm/graph/examples.py) and this draws the exported graph.

import { call, clearError } from "./api.js";
import { drawGraph } from "./graph_render.js";
import { el } from "./util.js";

const $ = (id) => document.getElementById(id);
let examples = [];

function example() {
  return examples.find((e) => e.name === $("graph-example").value);
}

// One number box per element of each input (a scalar, a vector or a small matrix).
function showInputs() {
  const box = $("graph-inputs");
  box.replaceChildren();
  const ex = example();
  $("graph-formula").textContent = ex.formula;
  for (const [name, value] of Object.entries(ex.inputs)) {
    const group = el("fieldset", { class: "input" });
    group.appendChild(el("legend", {}, name));
    const rows = Array.isArray(value) ? (Array.isArray(value[0]) ? value : [value]) : [[value]];
    rows.forEach((row, r) => {
      const line = el("div", { class: "input-row" });
      row.forEach((v, c) => {
        const input = el("input", { type: "number", step: "any", value: String(v) });
        input.dataset.name = name;
        input.dataset.r = String(r);
        input.dataset.c = String(c);
        input.setAttribute("aria-label", `${name}[${r}][${c}]`);
        input.addEventListener("keydown", (e) => { if (e.key === "Enter") run(); });
        line.appendChild(input);
      });
      group.appendChild(line);
    });
    box.appendChild(group);
  }
}

function readInputs() {
  const ex = example();
  const values = {};
  for (const [name, value] of Object.entries(ex.inputs)) {
    const cells = [...document.querySelectorAll(`#graph-inputs input[data-name="${CSS.escape(name)}"]`)];
    // An empty or non-numeric box goes to the server as null: it answers which input is bad.
    const read = (input) => (input.value.trim() === "" || !Number.isFinite(Number(input.value)) ? null : Number(input.value));
    if (!Array.isArray(value)) values[name] = read(cells[0]);
    else if (!Array.isArray(value[0])) values[name] = cells.map(read);
    else values[name] = value.map((row, r) => cells.filter((c) => c.dataset.r === String(r)).map(read));
  }
  return values;
}

async function run() {
  clearError();
  const answer = await call("/api/graph", { example: example().name, inputs: readInputs() });
  if (answer) drawGraph($("graph"), answer);
}

export async function initGraph() {
  const answer = await call("/api/graph/examples");
  if (!answer) return;
  examples = answer.examples;
  $("graph-example").replaceChildren(...examples.map((e) => el("option", { value: e.name }, e.title)));
  $("graph-example").addEventListener("change", () => { showInputs(); run(); });
  $("graph-run").addEventListener("click", run);
  showInputs();
}

export function showGraph() {
  if (examples.length && !$("graph").firstChild) run();
}
