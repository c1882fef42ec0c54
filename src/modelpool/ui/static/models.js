// The models page: every model's live state from the admin API (polled every 2 s), and a
// detail panel for the selected one (`#models/<id>`, written with replaceState, which fires
// no hashchange, so the page is not mounted again). A key without the admin scope gets the
// API's refusal and the read-only list from /v1/models: the page shows what the key may see.
import { api, ApiError, formatBytes, h, poll } from "./lib.js";
import { detailPanel } from "./models-detail.js";
import { reloadControl } from "./models-reload.js";
import { adminTable, readOnlyTable } from "./models-table.js";

const POLL_MS = 2000;
const TICK_MS = 1000;

function updatedAt() {
  return `updated ${new Date().toLocaleTimeString()}`;
}

function adminSummary(models, memory) {
  const states = {};
  for (const model of models) states[model.state] = (states[model.state] || 0) + 1;
  const counted = models.reduce((sum, m) => sum + (m.state === "unloaded" ? 0 : m.memory.counted_bytes), 0);
  const stateText = Object.entries(states).map(([state, n]) => `${n} ${state}`).join(", ");
  return `${models.length} models (${stateText}) · ${memoryText(memory, counted)}${gpuText(memory)} · ${updatedAt()}`;
}

/** With a GPU seen: the GPUs' used memory (NVML, by anyone) of their total, and the GPU budget. */
function gpuText(memory) {
  const gpus = memory?.gpus || [];
  if (!gpus.length) return "";
  const used = gpus.reduce((sum, g) => sum + g.used_bytes, 0);
  const total = gpus.reduce((sum, g) => sum + g.total_bytes, 0);
  const budget = memory.budget.gpu_memory_bytes;
  const of = budget === null ? "no GPU budget" : `GPU budget ${formatBytes(budget)}`;
  return ` · VRAM ${formatBytes(used)} of ${formatBytes(total)} used on ${gpus.length} GPU${gpus.length > 1 ? "s" : ""} · ${of}`;
}

/** The process's RSS and its parts, which add up (docs/memory.md), against the budget. */
function memoryText(memory, counted) {
  const process = memory?.process;
  if (!process) return `${formatBytes(counted)} counted`;
  const budget = memory.budget.memory_bytes;
  const of = budget === null ? "no budget" : `budget ${formatBytes(budget)}`;
  return `modelpool ${formatBytes(process.rss_bytes)} (baseline ${formatBytes(process.baseline_bytes)}, `
    + `runtimes ${formatBytes(process.runtimes_bytes)}, models ${formatBytes(process.models_bytes)} measured) · ${of}`;
}

function refusalPanel(title, message, ...more) {
  return h("div", { class: "panel refusal", role: "alert" }, h("h2", { text: title }), h("p", { text: message }), ...more);
}

/** The model id in `#models/<id>`, or null; a malformed escape (`%E0%A4%A`) is no id. */
function hashModel() {
  try {
    return decodeURIComponent(location.hash.split("/")[1] || "") || null;
  } catch (_) {
    return null;
  }
}

export function mount(root) {
  let stopped = false;
  let view = null; // {kind: "admin" | "readonly", table}
  let selected = hashModel();
  let detail = null;
  // What a load or unload in progress is doing, by model id: kept here, not in the panel, so
  // a panel built again for the model (selected anew) knows and refuses a second action.
  const pending = new Map();
  const summary = h("p", { class: "summary muted" }, "Loading the model list…");
  const body = h("div", { class: "models-body" });
  const detailSlot = h("div", { class: "detail-slot" });
  root.append(h("div", { class: "page-head" }, h("h1", { text: "Models" }), summary), body, detailSlot);

  function select(id, focus) {
    const model = view?.kind === "admin" ? view.table.model(id) : null;
    if (!model) return;
    selected = id;
    history.replaceState(null, "", `#models/${encodeURIComponent(id)}`);
    view.table.mark(id);
    // A change the panel made is shown by a poll run at once (serialized with the timer's).
    detail = detailPanel(model, { pending, onChanged: () => poller.now() });
    detailSlot.replaceChildren(detail.element);
    if (focus) detail.heading.focus(); // the keyboard goes on into the form
  }

  function showAdmin(models, memory) {
    if (stopped) return; // the page was left while the list was on its way
    if (view?.kind !== "admin") {
      view = { kind: "admin", table: adminTable((id) => select(id, true)) };
      // After the table: from the heading, Tab goes on to the first model, as before.
      body.replaceChildren(view.table.element, reloadControl({ onReloaded: () => poller.now() }).element);
    }
    view.table.update(models, Boolean(memory?.gpus?.length));
    summary.textContent = adminSummary(models, memory);
    if (!selected) return;
    if (detail && !view.table.model(selected)) { // a reload removed the selected model
      detail = null;
      detailSlot.replaceChildren();
      return;
    }
    if (!detail || detail.id() !== selected) select(selected, false);
    else detail.update(view.table.model(selected));
  }

  function showReadOnly(refusal, models) {
    if (stopped) return;
    if (view?.kind !== "readonly") {
      view = { kind: "readonly", table: readOnlyTable() };
      detailSlot.replaceChildren();
      const why = "Below is the read-only model list from /v1/models; loading and unloading need a key with the admin scope.";
      body.replaceChildren(refusalPanel("Admin view", refusal, h("p", { class: "muted", text: why })), view.table.element);
    }
    view.table.update(models);
    summary.textContent = `${models.length} models · read-only · ${updatedAt()}`;
  }

  function showNoKey(message) {
    poller.stop(); // a poll would ask again every 2 s; saving a key mounts the page afresh
    view = null;
    detail = null;
    detailSlot.replaceChildren();
    summary.textContent = "";
    const openDialog = () => document.getElementById("key-button").click();
    const open = h("button", { type: "button", text: "Enter API key", onclick: openDialog });
    body.replaceChildren(refusalPanel("API key needed", message, open));
  }

  async function listing() {
    if (view?.kind === "readonly") return showReadOnly(null, (await api("/v1/models")).data);
    try {
      const [listed, memory] = await Promise.all([api("/v1/admin/models"), api("/v1/admin/memory").catch(() => null)]);
      return showAdmin(listed.data, memory);
    } catch (error) {
      if (!(error instanceof ApiError) || error.status !== 403) throw error;
      // The list every inference key may read (metadata: no rate limit, no usage counted).
      return showReadOnly(error.message, (await api("/v1/models")).data);
    }
  }

  async function refresh() {
    try {
      await listing();
    } catch (error) {
      if (stopped) return;
      // A key the server no longer takes, on either list: ask once, then wait for a new one.
      if (error instanceof ApiError && error.status === 401) return showNoKey(error.message);
      throw error;
    }
  }

  const poller = poll(() => (stopped ? null : refresh()), POLL_MS,
    { describe: (error) => `Could not refresh the models: ${error.message}` });
  const ticker = setInterval(() => view?.table.tick?.(), TICK_MS);
  return {
    stop() {
      stopped = true;
      poller.stop();
      clearInterval(ticker);
    },
    /** The nav link clicked again, or an address naming another model. */
    route() {
      const asked = hashModel();
      if (asked && asked !== selected) {
        selected = asked;
        select(asked, false);
      } else if (!asked && selected) {
        history.replaceState(null, "", `#models/${encodeURIComponent(selected)}`);
      }
    },
  };
}
