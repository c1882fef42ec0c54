// The models tables: the admin one (live, updated in place so a focused button survives a
// refresh, with a keep-alive countdown between polls) and the read-only one from /v1/models.
import { formatBytes, formatDuration, h } from "./lib.js";

const COLUMNS = [
  ["model", "Model"], ["state", "State"], ["backend", "Backend"], ["tasks", "Tasks"], ["replicas", "Replicas"],
  ["in-flight", "In flight"], ["queued", "Queued"], ["memory", "Memory"], ["vram", "VRAM"], ["keep-alive", "Keep-alive"],
  ["error", "Last error"],
];
const NUMERIC = new Set(["replicas", "in-flight", "queued", "memory", "vram"]);

/** "4 min 05 s" for a countdown: whole seconds, rounded up (0 only when it is due). */
export function countdown(seconds) {
  return formatDuration(seconds, { round: Math.ceil });
}

function tags(values, extraClass = "") {
  return values.map((value) => h("span", { class: `tag ${extraClass}`.trim(), text: value }));
}

/**
 * What a model takes or does beyond its tasks: input modalities, tools, thinking, remote.
 * `detailed` (the detail panel) adds structured output, the thinking modes, the context
 * length and where it runs; the table's tags keep to the short words.
 */
export function capabilityList(capabilities, detailed = false) {
  const c = capabilities || {};
  const found = [];
  const modalities = (c.modalities || []).filter((m) => m !== "text");
  if (modalities.length) found.push(...(detailed ? [`input: text, ${modalities.join(", ")}`] : modalities));
  if (c.tools) found.push("tools");
  if (detailed && c.structured_output) found.push("structured output");
  if (c.thinking_modes?.length) found.push(detailed ? `thinking (${c.thinking_modes.join(", ")})` : "thinking");
  if (detailed && c.context_length) found.push(`context ${c.context_length} tokens`);
  if (c.remote) found.push(detailed ? "remote upstream" : "remote");
  if (detailed && !c.remote) found.push(c.locality === "engine_process" ? "engine process" : "in process");
  return found;
}

export function stateBadge(state) {
  return h("span", { class: "state", "data-state": state, text: state });
}

/** The state; while the weights download, a progress bar with the bytes done and in all. */
export function stateCell(model) {
  const badge = stateBadge(model.state);
  const download = model.download;
  if (!download) return badge;
  const label = `${formatBytes(download.done_bytes)} of ${formatBytes(download.total_bytes)}`;
  return h("span", { class: "download" }, badge,
    h("progress", { max: String(download.total_bytes || 1), value: String(download.done_bytes),
      "aria-label": `Download of ${model.id}: ${label}` }),
    h("small", { class: "muted block", text: label }));
}

function tableIn(label, headings) {
  const numeric = (key) => (NUMERIC.has(key) ? "num" : null);
  const head = h("tr", {}, ...headings.map(([key, title]) =>
    h("th", { scope: "col", class: numeric(key), "data-col": key, text: title })));
  const tbody = h("tbody");
  const table = h("table", { class: "models-table" }, h("thead", {}, head), tbody);
  const element = h("section", { class: "panel table-panel", "aria-label": label }, h("div", { class: "table-scroll" }, table));
  return { element, tbody };
}

function keepAliveText(entry) {
  const { model, deadline } = entry;
  if (model.keep_alive_s < 0) return "never";
  if (deadline !== null) return countdown(deadline - performance.now() / 1000);
  return model.state === "ready" ? "in use" : `${countdown(model.keep_alive_s)} idle`;
}

const PRIORITIES = ["high", "normal", "low"];

/** The waiting requests by priority class ("2 high · 5 low"), the classes with any only. */
export function queuedByPriorityText(byPriority) {
  return PRIORITIES.filter((name) => (byPriority?.[name] || 0) > 0).map((name) => `${byPriority[name]} ${name}`).join(" · ");
}

function queuedClasses(model) {
  const text = queuedByPriorityText(model.queued_by_priority);
  return text ? h("small", { class: "muted block queued-classes", text }) : "";
}

function fillRow(entry, model, receivedAt) {
  const { cells } = entry;
  entry.model = model;
  cells.state.replaceChildren(stateCell(model));
  cells.backend.replaceChildren(h("code", { text: model.backend }));
  cells.tasks.replaceChildren(...tags(model.tasks), ...tags(capabilityList(model.capabilities), "tag-capability"));
  cells.replicas.textContent = `${model.replicas.filter((r) => !r.retiring).length} / ${model.replicas_wanted}`;
  cells["in-flight"].textContent = String(model.in_flight);
  cells.queued.replaceChildren(h("span", { text: String(model.queued) }), queuedClasses(model));
  const { measured_bytes: measured, estimate_bytes: estimate } = model.memory;
  cells.memory.replaceChildren(h("span", { text: measured ? formatBytes(measured) : "–" }),
    estimate ? h("small", { class: "muted block", text: `est. ${formatBytes(estimate)}` }) : "");
  // GPU memory: measured (an engine's processes through NVML, an in-process load's share), else the estimate.
  const { measured_gpu_bytes: gpu, estimate_gpu_bytes: gpuEstimate } = model.memory;
  cells.vram.replaceChildren(h("span", { text: gpu ? formatBytes(gpu) : "–" }),
    gpuEstimate ? h("small", { class: "muted block", text: `est. ${formatBytes(gpuEstimate)}` }) : "");
  // The server says how long is left; the countdown runs on locally until the next poll.
  entry.deadline = model.expires_in_s == null ? null : receivedAt + model.expires_in_s;
  cells["keep-alive"].textContent = keepAliveText(entry);
  const error = model.last_error;
  cells.error.replaceChildren(error ? h("span", { class: "error-text clamp", title: error, text: error }) : "");
}

/**
 * The admin table. update(models, gpuSeen) fills it (rows are made once per model and then
 * only changed, and dropped when the model is no longer listed; the VRAM column shows only
 * when the server sees a GPU); tick() moves the
 * countdowns; mark(id) shows which row is selected.
 */
export function adminTable(onSelect) {
  const { element, tbody } = tableIn("Models (admin view)", COLUMNS);
  const rows = new Map();

  function newRow(model) {
    const button = h("button", {
      type: "button", class: "link-button", "aria-label": `Select ${model.id}`, "aria-pressed": "false",
      "aria-controls": "model-detail", text: model.id, onclick: () => onSelect(model.id),
    });
    const cell = (key) => h("td", { "data-col": key, class: NUMERIC.has(key) ? "num" : null });
    const cells = Object.fromEntries(COLUMNS.map(([key]) => [key, cell(key)]));
    cells.model.append(button);
    const entry = { row: h("tr", { "data-model": model.id }, ...Object.values(cells)), cells, button, model, deadline: null };
    rows.set(model.id, entry);
    tbody.append(entry.row);
    return entry;
  }

  function update(models, gpuSeen = false) {
    element.querySelector("table").classList.toggle("no-gpu", !gpuSeen);
    const receivedAt = performance.now() / 1000;
    for (const model of models) fillRow(rows.get(model.id) || newRow(model), model, receivedAt);
    // A model a config reload removed is gone from the list: its row goes too.
    const listed = new Set(models.map((model) => model.id));
    for (const [id, entry] of rows) {
      if (listed.has(id)) continue;
      entry.row.remove();
      rows.delete(id);
    }
  }

  function tick() {
    for (const entry of rows.values()) entry.cells["keep-alive"].textContent = keepAliveText(entry);
  }

  function mark(id) {
    for (const [rowId, entry] of rows) {
      entry.row.classList.toggle("selected", rowId === id);
      entry.button.setAttribute("aria-pressed", String(rowId === id));
    }
  }

  return { element, update, tick, mark, model: (id) => rows.get(id)?.model };
}

/** The read-only table of /v1/models (what an inference key may see). */
export function readOnlyTable() {
  const headings = [["model", "Model"], ["state", "State"], ["tasks", "Tasks"], ["capabilities", "Capabilities"]];
  const { element, tbody } = tableIn("Models (read-only)", headings);
  function update(models) {
    tbody.replaceChildren(...models.map((m) => h("tr", { "data-model": m.id },
      h("td", {}, h("strong", { text: m.id }), m.description ? h("small", { class: "muted block", text: m.description }) : ""),
      h("td", {}, stateCell(m)),
      h("td", {}, ...tags(m.tasks)),
      h("td", {}, ...tags(capabilityList(m.capabilities), "tag-capability")))));
  }
  return { element, update };
}
