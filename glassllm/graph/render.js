// Draw an autograd graph (glassllm.graph.export_graph's JSON) as SVG: micrograd's draw_dot
// without graphviz. Self-contained (no imports): glassllm view's page imports it as a module,
// and glassllm.graph.write_html inlines it into a standalone file.
// Text goes in with textContent only.

const SVG = "http://www.w3.org/2000/svg";
const CHAR_W = 6.8; // width of one character of the 11px monospace font
const MIN_W = 120;
const LINE_H = 15;
const COL_GAP = 56;
const ROW_GAP = 18;

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

export function formatNumber(x) {
  if (typeof x === "string") return x; // "nan", "inf", "-inf"
  if (x === 0) return "0.0000";
  const a = Math.abs(x);
  return a >= 1e4 || a < 1e-3 ? x.toExponential(2) : x.toFixed(4);
}

// Lines of text for a value: a scalar, up to 4 rows of a small array, or statistics.
export function valueLines(value) {
  if (value === null || value === undefined) return ["—"];
  if (!Array.isArray(value) && typeof value === "object") {
    return [`mean ${formatNumber(value.mean)} std ${formatNumber(value.std)}`,
            `min ${formatNumber(value.min)} max ${formatNumber(value.max)}`];
  }
  if (!Array.isArray(value)) return [formatNumber(value)];
  if (value.length === 0) return ["[]"];
  if (!Array.isArray(value[0])) return [`[${value.map(formatNumber).join(", ")}]`];
  const rows = value.slice(0, 4).map((row) => {
    const flat = Array.isArray(row) ? row.flat(Infinity) : [row];
    return `[${flat.map(formatNumber).join(", ")}]`;
  });
  if (value.length > 4) rows.push("…");
  return rows;
}

// Columns left to right: an operation one column right of its latest input; a leaf or
// constant one column left of its first consumer. Rows: barycentre of the inputs' rows.
export function layout(graph) {
  const n = graph.nodes.length;
  const parents = Array.from({ length: n }, () => []);
  const children = Array.from({ length: n }, () => []);
  for (const [p, c] of graph.edges) { parents[c].push(p); children[p].push(c); }
  const col = new Array(n).fill(0);
  for (let i = 0; i < n; i++) { // nodes arrive parents first
    for (const p of parents[i]) col[i] = Math.max(col[i], col[p] + 1);
  }
  for (let i = 0; i < n; i++) {
    if (parents[i].length === 0 && children[i].length > 0) {
      col[i] = Math.max(0, Math.min(...children[i].map((c) => col[c])) - 1);
    }
  }
  const columns = [];
  for (let i = 0; i < n; i++) (columns[col[i]] ||= []).push(i);
  const row = new Array(n).fill(0);
  for (const column of columns) if (column) column.forEach((node, r) => { row[node] = r; });
  for (let sweep = 0; sweep < 4; sweep++) {
    for (const column of columns) {
      if (!column) continue;
      const key = (i) => {
        const near = parents[i].length ? parents[i] : children[i];
        return near.length ? near.reduce((s, j) => s + row[j], 0) / near.length : row[i];
      };
      const keys = new Map(column.map((i) => [i, key(i)]));
      column.sort((a, b) => keys.get(a) - keys.get(b));
      column.forEach((node, r) => { row[node] = r; });
    }
  }
  return { col, columns, parents };
}

function nodeLines(node) {
  const head = node.label ? `${node.label}  (${node.op})` : node.op;
  const shape = node.shape.length ? `shape [${node.shape.join(", ")}]` : "scalar";
  return {
    head,
    shape,
    value: valueLines(node.value),
    grad: node.grad === null ? ["— (no gradient)"] : valueLines(node.grad),
  };
}

// Module paths a node may be folded into: each recorded path and its prefixes, except a
// container of numbered children ("blocks" of "blocks.0"), which is never called itself.
function modulePaths(graph) {
  const paths = new Set();
  for (const node of graph.nodes) {
    const parts = node.module ? node.module.split(".") : [];
    for (let k = 1; k <= parts.length; k++) {
      if (k < parts.length && /^\d+$/.test(parts[k])) continue;
      paths.add(parts.slice(0, k).join("."));
    }
  }
  return paths;
}

// The box a module path is drawn in: its shortest foldable prefix not opened (null: none).
function boxOf(path, paths, opened) {
  const parts = path ? path.split(".") : [];
  for (let k = 1; k <= parts.length; k++) {
    const prefix = parts.slice(0, k).join(".");
    if (paths.has(prefix) && !opened.has(prefix)) return prefix;
  }
  return null;
}

// ``graph`` with each module not in ``opened`` folded into one node (op "module"), its
// output's shape, value and gradient shown; edges between boxes listed once; parents first.
export function foldModules(graph, opened = new Set()) {
  const paths = modulePaths(graph);
  const keyOf = graph.nodes.map((node) => {
    const box = boxOf(node.module, paths, opened);
    return box === null ? `n${node.id}` : `m${box}`;
  });
  const groups = new Map(); // key -> {members, path}
  graph.nodes.forEach((node, i) => {
    if (!groups.has(keyOf[i])) groups.set(keyOf[i], { members: [], path: keyOf[i][0] === "m" ? keyOf[i].slice(1) : null });
    groups.get(keyOf[i]).members.push(i);
  });
  const keys = [...groups.keys()];
  const index = new Map(keys.map((k, i) => [k, i]));
  const leaving = new Set(graph.edges.filter(([p, c]) => keyOf[p] !== keyOf[c]).map(([p]) => p));
  const seen = new Set();
  const edges = [];
  for (const [p, c] of graph.edges) {
    const [a, b] = [index.get(keyOf[p]), index.get(keyOf[c])];
    const folded = keyOf[p][0] === "m" || keyOf[c][0] === "m";
    if (a === b || (folded && seen.has(`${a},${b}`))) continue;
    seen.add(`${a},${b}`);
    edges.push([a, b]);
  }
  // Parents first again (Kahn's algorithm, ties in the original order).
  const indegree = keys.map(() => 0);
  const out = keys.map(() => []);
  for (const [a, b] of edges) { indegree[b]++; out[a].push(b); }
  const order = [];
  const ready = keys.map((_, i) => i).filter((i) => indegree[i] === 0);
  while (ready.length) {
    ready.sort((x, y) => x - y);
    const i = ready.shift();
    order.push(i);
    for (const j of out[i]) if (--indegree[j] === 0) ready.push(j);
  }
  const position = new Map(order.map((i, k) => [i, k]));
  const nodes = order.map((i, k) => {
    const { members, path } = groups.get(keys[i]);
    if (path === null) return { ...graph.nodes[members[0]], id: k, source: members[0] };
    const exits = members.filter((m) => leaving.has(m) || m === graph.root);
    const output = graph.nodes[exits.length ? exits[exits.length - 1] : members[members.length - 1]];
    return { ...output, id: k, label: path, op: `module, ${members.length} nodes`, module: path,
             folded: true };
  });
  return { nodes, edges: edges.map(([a, b]) => [position.get(a), position.get(b)]),
           root: position.get(index.get(keyOf[graph.root])) };
}

// Draw ``graph`` into ``container``; a graph recorded with modules (glassllm.graph
// .record_modules) starts with each module folded: click a box to open it, click one of
// an opened module's nodes to fold it again. Returns the <svg>.
export function drawGraph(container, graph, opened = new Set()) {
  if (!graph.nodes.some((node) => node.module)) return drawFlat(container, graph);
  const svg = drawFlat(container, foldModules(graph, opened));
  const shown = foldModules(graph, opened).nodes;
  svg.querySelectorAll("g.node").forEach((g) => {
    const node = shown[Number(g.dataset.id)];
    if (!node.module) return;
    g.style.cursor = "pointer";
    g.addEventListener("click", () => {
      const next = new Set(opened);
      if (node.folded) next.add(node.module);
      else {
        const inner = [...opened].filter((p) => node.module === p || node.module.startsWith(`${p}.`));
        const close = inner.sort((a, b) => b.length - a.length)[0];
        for (const p of opened) if (p === close || p.startsWith(`${close}.`)) next.delete(p);
      }
      drawGraph(container, graph, next);
    });
  });
  return svg;
}

function drawFlat(container, graph) {
  const { col, columns } = layout(graph);
  const lines = graph.nodes.map(nodeLines);
  const heights = lines.map((l) => (2 + l.value.length + l.grad.length) * LINE_H + 12);
  const widths = lines.map((l) => {
    const longest = Math.max(l.head.length, l.shape.length, ...l.value.map((v) => v.length + 5),
                             ...l.grad.map((v) => v.length + 5));
    return Math.max(MIN_W, Math.ceil(longest * CHAR_W) + 18);
  });
  // Each column as wide as its widest node; columns left to right.
  const colX = [];
  let left = 10;
  columns.forEach((column, c) => {
    colX[c] = left;
    left += (column ? Math.max(...column.map((i) => widths[i])) : MIN_W) + COL_GAP;
  });
  const x = (i) => colX[col[i]];
  const y = new Array(graph.nodes.length).fill(0);
  let height = 0;
  for (const column of columns) {
    if (!column) continue;
    let top = 10;
    for (const i of column) { y[i] = top; top += heights[i] + ROW_GAP; }
    height = Math.max(height, top);
  }
  const width = left - COL_GAP + 10;
  const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "graph" });
  const edges = el("g", { class: "edges" }, svg);
  for (const [p, c] of graph.edges) {
    const x1 = x(p) + widths[p], y1 = y[p] + LINE_H + 4, x2 = x(c), y2 = y[c] + LINE_H + 4;
    const mid = (x1 + x2) / 2;
    el("path", { d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`, class: "edge" }, edges);
  }
  graph.nodes.forEach((node, i) => {
    const kind = node.folded ? "module" : node.op === "leaf" ? "leaf" : node.op === "const" ? "const" : "op";
    const g = el("g", { class: `node ${kind}${i === graph.root ? " root" : ""}`,
                        transform: `translate(${x(i)},${y[i]})`, "data-id": i }, svg);
    el("rect", { width: widths[i], height: heights[i], rx: 6 }, g);
    const l = lines[i];
    const rows = [["head", l.head], ["shape", l.shape],
                  ...l.value.map((v, k) => ["value", `${k ? "     " : "data "}${v}`]),
                  ...l.grad.map((v, k) => ["grad", `${k ? "     " : "grad "}${v}`])];
    rows.forEach(([cls, content], r) => {
      const t = el("text", { class: cls, x: 8, y: 4 + (r + 1) * LINE_H }, g);
      t.textContent = content;
    });
    // A <title> gives the full numbers on hover.
    const title = el("title", {}, g);
    const where = node.module ? `${node.folded ? "click to open" : `in ${node.module}`}\n` : "";
    title.textContent = `${where}${l.head}\n${l.shape}\ndata ${JSON.stringify(node.value)}\ngrad ${JSON.stringify(node.grad)}`;
  });
  container.replaceChildren(svg);
  return svg;
}
