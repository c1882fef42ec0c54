// The batch endpoints evaluation harnesses use: /generate (several prompts in one call)
// and /loglikelihood (how likely each continuation is after its context).
import { api, errorRegion, field, h } from "./lib.js";
import { modelPicker, nonEmptyLines, numberField, panel, running } from "./playground-common.js";

export function scoringSection(models) {
  const calls = new AbortController(); // leaving the page cancels a call in progress
  const element = h("div", { class: "pg-scoring" }, generateForm(models, calls.signal), loglikelihoodForm(models, calls.signal));
  return { element, stop: () => calls.abort() };
}

function generateForm(models, signal) {
  const picker = modelPicker("Model", models, "completion");
  const prompts = h("textarea", { rows: 4 });
  prompts.value = "The capital of France is\nOnce upon a time,\n1, 2, 3, 4,";
  const maxTokens = numberField("Max tokens", { min: 1, step: 1, value: "16", integer: true });
  const temperature = numberField("Temperature", { min: 0, max: 2, step: 0.05, value: "0" });
  const button = h("button", { type: "submit", text: "Generate", disabled: !picker.current() });
  const results = h("div", { class: "pg-results" });
  const errors = errorRegion();

  const form = h("form", { class: "pg-form" },
    picker.element,
    field("Prompts, one per line", prompts),
    h("div", { class: "pg-fields" }, maxTokens.element, temperature.element),
    h("div", { class: "row" }, button),
    errors.node,
    results);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    running(button, results, errors, async () => {
      const lines = nonEmptyLines(prompts.value);
      if (!lines.length) throw new Error("Write at least one prompt.");
      const body = { model: picker.current().id, prompts: lines, max_tokens: maxTokens.value() };
      const chosen = temperature.value();
      if (chosen !== undefined) body.temperature = chosen;
      const answer = await api("/generate", { json: body, signal });
      const rows = lines.map((prompt, i) =>
        h("tr", {}, h("td", { class: "num", text: String(i + 1) }), h("td", { text: prompt }),
          h("td", { class: "pg-completion", text: answer.completions[i] }), h("td", { text: answer.finish_reasons[i] })));
      results.replaceChildren(
        table("Completions", ["#", "Prompt", "Completion", "Finish reason"], rows, ["#"]),
        h("p", { class: "hint", text: `${answer.usage.prompt_tokens} prompt + ${answer.usage.completion_tokens} completion tokens` }));
    });
  });
  return panel("Generate (batch)", "pg-generate-title", h("p", { class: "hint" },
    "One call to ", h("code", { text: "POST /generate" }), " for all the prompts."), form);
}

/** Lines of a textarea kept as typed (a continuation's leading space matters); trailing empty lines dropped. */
function keptLines(text) {
  const lines = text.split("\n");
  while (lines.length && lines[lines.length - 1] === "") lines.pop();
  return lines;
}

function loglikelihoodForm(models, signal) {
  const picker = modelPicker("Model", models, "scoring");
  const contexts = h("textarea", { rows: 4 });
  const continuations = h("textarea", { rows: 4 });
  contexts.value = "The capital of France is\nThe capital of France is\n2 + 2 =";
  continuations.value = " Paris\n Berlin\n 4";
  const button = h("button", { type: "submit", text: "Score", disabled: !picker.current() });
  const results = h("div", { class: "pg-results" });
  const errors = errorRegion();

  const form = h("form", { class: "pg-form" },
    picker.element,
    h("div", { class: "pg-pair-boxes" },
      field("Contexts, one per line", contexts),
      field("Continuations, one per line", continuations, "Line n of each box is a pair; a leading space counts.")),
    h("div", { class: "row" }, button),
    errors.node,
    results);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    running(button, results, errors, async () => {
      const prompts = keptLines(contexts.value);
      const endings = keptLines(continuations.value);
      if (!prompts.length) throw new Error("Write at least one context.");
      if (prompts.length !== endings.length) {
        throw new Error(`${prompts.length} contexts but ${endings.length} continuations: they pair up line by line.`);
      }
      if (endings.some((line) => !line)) throw new Error("A continuation must not be empty.");
      const body = { model: picker.current().id, prompts, continuations: endings };
      const answer = await api("/loglikelihood", { json: body, signal });
      const rows = prompts.map((prompt, i) =>
        h("tr", {}, h("td", { class: "pg-keep-space", text: prompt }), h("td", { class: "pg-keep-space", text: endings[i] }),
          h("td", { class: "num", text: answer.ll[i].toFixed(4) }), h("td", { text: answer.is_greedy[i] ? "yes" : "no" })));
      results.replaceChildren(table("Log-likelihoods", ["Context", "Continuation", "Log-likelihood", "Greedy"], rows, ["Log-likelihood"]));
    });
  });
  return panel("Score (log-likelihood)", "pg-loglikelihood-title", h("p", { class: "hint" },
    h("code", { text: "POST /loglikelihood" }), ": the summed log-probability of each continuation after its context, ",
    "and whether greedy decoding would write it."), form);
}

/** A results table; `numeric` names the columns aligned right like their numbers. */
function table(caption, headers, rows, numeric = []) {
  return h("table", { class: "pg-table" },
    h("caption", { class: "visually-hidden", text: caption }),
    h("thead", {}, h("tr", {}, headers.map((name) =>
      h("th", { scope: "col", class: numeric.includes(name) ? "num" : null, text: name })))),
    h("tbody", {}, rows));
}
