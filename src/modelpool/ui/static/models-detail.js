// The detail panel of the selected model: what it is, the load form (options generated from
// their schemas, replicas), load/unload, and its engine process's output.
import { api, ApiError, errorRegion, field, formatBytes, formatSeconds, h, isBusy, notice, setBusy } from "./lib.js";
import { optionFields } from "./models-form.js";
import { capabilityList } from "./models-table.js";

const LOG_LINES = 200;

function isEngine(model) {
  return model.capabilities?.locality === "engine_process";
}

function replicaText(model) {
  if (!model.replicas.length) return "none running";
  return model.replicas
    .map((r) => {
      const pid = r.pid ? `, pid ${r.pid}` : "";
      const retiring = r.retiring ? ", retiring" : "";
      return `#${r.index}: ${r.running} running, ${r.served} served, ${formatBytes(r.memory_bytes)}${pid}${retiring}`;
    })
    .join("; ");
}

/** The facts list; rebuilt on every poll (it holds no focusable control). */
function facts(model) {
  const rows = [
    ["Description", model.description || "–"],
    ["Backend", model.backend],
    ["Tasks", model.tasks.join(", ")],
    ["Capabilities", capabilityList(model.capabilities, true).join(" · ")],
    ["Replicas", replicaText(model)],
    ["Keep alive", model.keep_alive_s < 0 ? "never unloads when idle" : `${formatSeconds(model.keep_alive_s)} idle`],
    ["Last load", model.load_seconds == null ? "–" : `${model.load_seconds.toFixed(1)} s`],
    ["Concurrency", `${model.max_concurrency ?? model.capabilities?.engine_concurrency ?? "–"} at once, queue ${model.max_queue}`],
  ];
  if (model.aliases.length) rows.splice(1, 0, ["Aliases", model.aliases.join(", ")]);
  const list = h("dl", { class: "facts" });
  for (const [term, value] of rows) list.append(h("dt", { text: term }), h("dd", { text: value }));
  return list;
}

function logView(logs) {
  const parts = [];
  for (const process of logs.processes) {
    const title = `Replica ${process.replica}${process.pid ? ` · pid ${process.pid}` : ""}`;
    parts.push(h("h4", { text: title }), h("pre", { class: "log", text: process.lines.join("\n") || "(no output yet)" }));
  }
  if (logs.last_crash) {
    parts.push(h("h4", { class: "error-text", text: `Last crash: ${logs.last_crash.error || "unknown error"}` }));
    parts.push(h("pre", { class: "log", text: logs.last_crash.lines.join("\n") }));
  }
  if (!parts.length) parts.push(h("p", { class: "muted", text: "No engine process is running (the model is not loaded)." }));
  return parts;
}

/**
 * A panel for one model. update(model) refreshes it from a poll; the form is only rebuilt
 * when the model's options change (a load), so typing is never lost to a refresh.
 * `pending` (Map id → what is being done) is the page's: a load or unload started from an
 * earlier panel of this model still counts, and no second one starts meanwhile.
 */
export function detailPanel(initial, { pending, onChanged }) {
  let model = initial;
  let formKey = "";
  let logsAsked = false;
  let shownLogs = "";
  const busy = () => pending.has(model.id);
  const headingId = `detail-${model.id}`;
  const heading = h("h2", { id: headingId, tabindex: "-1", text: model.id });
  const state = h("span", { class: "state" });
  const factBox = h("div", { class: "facts-box" });
  const errors = errorRegion();
  const progress = h("p", { class: "muted progress", role: "status" });
  const optionBox = h("fieldset", { class: "options" });
  const replicas = h("input", { type: "number", min: "1", step: "1", inputmode: "numeric" });
  const loadButton = h("button", { type: "submit", text: "Load" });
  const drainButton = h("button", { type: "button", class: "secondary", text: "Unload (drain)" });
  const forceButton = h("button", { type: "button", class: "danger", text: "Unload (force)" });
  let collect = () => ({ overrides: {}, problems: [] });

  const form = h("form", { class: "load-form", novalidate: true, "aria-labelledby": `${headingId}-form` },
    h("h3", { id: `${headingId}-form`, text: "Load" }),
    optionBox,
    field("Replicas", replicas, `1 to ${model.replica_max}`),
    h("div", { class: "actions" }, loadButton, drainButton, forceButton),
    errors.node, progress);
  const adapterBox = h("div", { class: "adapters" });
  const logBox = h("div", { class: "logs", "aria-live": "off" });
  const configured = h("div", { class: "configured" });
  const element = h("section", { id: "model-detail", class: "panel detail", "aria-labelledby": headingId },
    h("div", { class: "detail-head" }, heading, state),
    h("div", { class: "detail-grid" },
      h("div", {}, factBox, form, adapterBox),
      h("div", {}, h("h3", { text: "Configured options" }), configured, h("h3", { text: "Engine logs" }), logBox)));

  function buildForm() {
    const options = model.override_options || [];
    const built = optionFields(options);
    collect = built.collect;
    const legend = h("legend", { text: options.length ? "Options for this load" : "No options can be overridden" });
    optionBox.replaceChildren(legend, ...built.nodes);
    replicas.max = String(model.replica_max);
    replicas.value = String(model.replicas_wanted);
    const hint = replicas.parentElement?.querySelector(".hint");
    if (hint) hint.textContent = `1 to ${model.replica_max}; now ${model.replicas_wanted}`;
    formKey = JSON.stringify([options, model.replicas_wanted, model.replica_max]);
  }

  /** The buttons and the progress line, from the page's pending actions and the state. */
  function paintButtons() {
    const idle = model.state === "unloaded";
    setBusy(loadButton, busy());
    setBusy(drainButton, busy() || idle);
    setBusy(forceButton, busy() || idle);
    progress.textContent = pending.get(model.id) || "";
    paintAdapters();
  }

  async function act(label, request) {
    const id = model.id;
    pending.set(id, `${label} ${id}…`);
    errors.clear();
    paintButtons();
    try {
      const status = await request();
      if (element.isConnected) {
        update(status);
        buildForm();
      }
      notice(`${id} is ${status.state}.`);
    } catch (error) {
      const where = error instanceof ApiError && error.status === 400 ? " (nothing was changed)" : "";
      // The panel may have been closed meanwhile (another model selected): then the notice line says it.
      if (element.isConnected) errors.show(`${error.message}${where}`);
      else notice(`${label} ${id} failed: ${error.message}${where}`, "error");
    } finally {
      pending.delete(id);
      paintButtons();
      onChanged();
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (busy()) return;
    const { overrides, problems } = collect();
    const wanted = Number(replicas.value);
    if (!Number.isInteger(wanted) || wanted < 1 || wanted > model.replica_max) {
      problems.push(`Replicas must be a whole number from 1 to ${model.replica_max}`);
    }
    if (problems.length) {
      errors.show(`${problems.join("; ")}.`);
      return;
    }
    const body = { overrides };
    if (wanted !== model.replicas_wanted) body.replicas = wanted;
    act("Loading", () => api(`/v1/admin/models/${encodeURIComponent(model.id)}/load`, { json: body }));
  });
  const unload = (drain) => (event) => {
    if (isBusy(event.currentTarget)) return;
    act(drain ? "Unloading (draining)" : "Unloading (forced)",
      () => api(`/v1/admin/models/${encodeURIComponent(model.id)}/unload`, { json: { drain } }));
  };
  drainButton.addEventListener("click", unload(true));
  forceButton.addEventListener("click", unload(false));

  /** The model's LoRA adapters (docs/lora.md), each loaded or not, with the button that flips it. */
  function paintAdapters() {
    const names = model.adapters || [];
    if (!names.length) {
      adapterBox.replaceChildren();
      return;
    }
    const held = new Set(model.adapters_loaded || []);
    const rows = names.map((name) => {
      const loaded = held.has(name);
      const verb = loaded ? "unload" : "load";
      const button = h("button", { type: "button", class: "secondary", text: `${loaded ? "Unload" : "Load"} ${name}` });
      setBusy(button, busy() || model.state !== "ready");
      button.addEventListener("click", (event) => {
        if (isBusy(event.currentTarget)) return;
        const path = `/v1/admin/models/${encodeURIComponent(model.id)}/adapters/${encodeURIComponent(name)}/${verb}`;
        act(`${loaded ? "Unloading" : "Loading"} adapter ${name} of`, () => api(path, { method: "POST" }));
      });
      return h("li", { "data-adapter": name },
        h("span", { text: `${model.id}:${name} — ${loaded ? "loaded" : "not loaded"}` }), " ", button);
    });
    adapterBox.replaceChildren(h("h3", { text: "LoRA adapters" }), h("ul", { class: "adapter-list" }, ...rows));
  }

  async function refreshLogs() {
    if (!isEngine(model)) {
      logBox.replaceChildren(h("p", { class: "muted" },
        `No engine process: ${model.id} runs inside modelpool (backend ${model.backend}); its output is in modelpool's own log.`));
      return;
    }
    if (logsAsked) return; // one request at a time
    logsAsked = true;
    try {
      const logs = await api(`/v1/admin/models/${encodeURIComponent(model.id)}/logs?lines=${LOG_LINES}`);
      const seen = JSON.stringify(logs);
      if (seen === shownLogs) return; // unchanged: leave the reader's scroll position alone
      shownLogs = seen;
      logBox.replaceChildren(...logView(logs));
      for (const pre of logBox.querySelectorAll("pre")) pre.scrollTop = pre.scrollHeight; // newest lines in view
    } catch (error) {
      logBox.replaceChildren(h("p", { class: "error-text", text: `Could not read the logs: ${error.message}` }));
    } finally {
      logsAsked = false;
    }
  }

  function update(next) {
    model = next;
    state.dataset.state = model.state;
    state.textContent = model.state;
    paintButtons();
    factBox.replaceChildren(facts(model));
    const options = Object.keys(model.options || {}).length;
    configured.replaceChildren(options
      ? h("pre", { class: "options-json", text: JSON.stringify(model.options, null, 2) })
      : h("p", { class: "muted", text: "None set: the backend's defaults apply." }));
    if (model.last_error) factBox.append(h("p", { class: "error-text", text: `Last error: ${model.last_error}` }));
    const key = JSON.stringify([model.override_options || [], model.replicas_wanted, model.replica_max]);
    if (key !== formKey && !busy()) buildForm();
    refreshLogs();
  }

  update(model);
  return { element, heading, update, id: () => model.id };
}
