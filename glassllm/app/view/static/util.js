// Small DOM helpers and colour scales shared by the panels. Text always goes in with
// textContent, never as HTML.

export function el(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  if (text !== null) node.textContent = text;
  return node;
}

// Probability -> colour, red (unlikely) through amber to green (certain).
export function probColour(p, alpha = 0.55) {
  const hue = Math.round(120 * Math.max(0, Math.min(1, p)) ** 0.6);
  return `hsla(${hue}, 75%, 55%, ${alpha})`;
}

// Signed activation -> colour: blue negative, white 0, orange positive; scale = max |value|.
export function signedColour(value, scale) {
  const t = scale > 0 ? Math.max(-1, Math.min(1, value / scale)) : 0;
  return t >= 0 ? `rgba(230, 120, 20, ${t.toFixed(3)})` : `rgba(40, 110, 220, ${(-t).toFixed(3)})`;
}

export function percent(p) {
  return `${(100 * p).toFixed(p >= 0.1 ? 1 : 2)}%`;
}

// A token's text made visible: a newline shows as ⏎, a tab as →, a space stays a space.
export function visible(text) {
  return text.replace(/\n/g, "⏎").replace(/\t/g, "→");
}

// The same, with a space shown as ␣ (for a token standing alone, e.g. in a table cell).
export function visibleAlone(text) {
  return visible(text).replace(/ /g, "␣");
}

// The app's shared state: the checkpoint info and the current text as token ids.
export const state = { info: null, vocab: [], ids: [], promptLength: 0 };

export function tokenSpan(token, cls) {
  const span = el("span", { class: `tok ${cls}` }, visible(token.text));
  if (token.text === "\n") span.classList.add("newline");
  return span;
}
