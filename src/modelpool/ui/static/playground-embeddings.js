// The embeddings tab: a few texts → /v1/embeddings → their cosine similarities as a heat
// map. The numbers are written in the cells and the rows and columns are named, so the map
// reads without colour; the colour is set through the CSSOM (the CSP forbids style markup).
import { api, errorRegion, field, h } from "./lib.js";
import { modelPicker, nonEmptyLines, panel, running } from "./playground-common.js";

const SAMPLE = [
  "A cat sleeps on the warm windowsill.",
  "The kitten naps in the sunshine.",
  "Stock markets fell sharply on Monday.",
  "Investors sold shares as prices dropped.",
];
const MAX_TEXTS = 12;

export function cosine(a, b) {
  let dot = 0;
  let normA = 0;
  let normB = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i] * b[i];
    normA += a[i] * a[i];
    normB += b[i] * b[i];
  }
  return dot / Math.sqrt(normA * normB);
}

/** Colour of a similarity: white at ≤ 0 to the accent blue at 1, with text that stays readable. */
function paint(cell, value) {
  const strength = Math.max(0, Math.min(1, value));
  const lightness = 97 - strength * 55;
  cell.style.backgroundColor = `hsl(215, 70%, ${lightness}%)`;
  // Where white and black text stay at least 4.5:1 on this blue (WCAG AA), both ways.
  cell.style.color = lightness < 51 ? "#ffffff" : "#000000";
}

function heatMap(texts, vectors) {
  const header = h("tr", {}, h("td", { class: "pg-corner" }),
    texts.map((text, j) => h("th", { scope: "col", class: "num", title: text, text: String(j + 1) })));
  const rows = texts.map((text, i) => h("tr", {},
    h("th", { scope: "row", class: "pg-row-text", title: text }, h("span", { class: "pg-index", text: `${i + 1}` }), text),
    vectors.map((vector, j) => {
      const value = cosine(vectors[i], vector);
      const cell = h("td", { class: "pg-cell", text: value.toFixed(3) });
      paint(cell, value);
      return cell;
    })));
  return h("table", { class: "heatmap pg-heatmap" },
    h("caption", { text: "Cosine similarity of each pair of texts (1 = same direction)" }),
    h("thead", {}, header), h("tbody", {}, rows));
}

function legend() {
  return h("div", { class: "pg-legend", "aria-hidden": "true" },
    h("span", { text: "0" }), h("span", { class: "pg-legend-bar" }), h("span", { text: "1" }));
}

export function embeddingsSection(models) {
  const picker = modelPicker("Model", models, "embedding");
  const texts = h("textarea", { class: "pg-prose", rows: 5 });
  texts.value = SAMPLE.join("\n");
  const button = h("button", { type: "submit", text: "Compare", disabled: !picker.current() });
  const results = h("div", { class: "pg-results" },
    h("p", { class: "muted", text: "Compare the texts to see how alike each pair is." }));
  const errors = errorRegion();
  const calls = new AbortController(); // leaving the page cancels a call in progress
  const form = h("form", { class: "pg-form" },
    picker.element,
    field("Texts, one per line", texts, `Two to ${MAX_TEXTS} texts.`),
    h("div", { class: "row" }, button),
    errors.node);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    running(button, results, errors, async () => {
      const lines = nonEmptyLines(texts.value);
      if (lines.length < 2 || lines.length > MAX_TEXTS) throw new Error(`Write two to ${MAX_TEXTS} texts, one per line.`);
      const answer = await api("/v1/embeddings", { json: { model: picker.current().id, input: lines }, signal: calls.signal });
      const vectors = [...answer.data].sort((a, b) => a.index - b.index).map((item) => item.embedding);
      results.replaceChildren(heatMap(lines, vectors), legend(),
        h("p", { class: "hint", text: `${vectors[0].length} dimensions · ${answer.usage.prompt_tokens} tokens` }));
    });
  });
  const element = h("div", { class: "pg-embeddings" },
    panel("Texts", "pg-embeddings-input", form),
    panel("Similarity", "pg-embeddings-map", results));
  return { element, stop: () => calls.abort() };
}
