// The models page: every model's live state from the admin API (polled every 2 s), and a
// detail panel for the selected one (`#models/<id>`, written with replaceState, which fires
// no hashchange, so the page is not mounted again). A key without the admin scope gets the
// API's refusal and the read-only list from /v1/models: the page shows what the key may see.
import { api, ApiError, formatBytes, h, notice, poll } from "./lib.js";
import { detailPanel } from "./models-detail.js";
import { adminTable, readOnlyTable } from "./models-table.js";

const POLL_MS = 2000;
const TICK_MS = 1000;

function updatedAt() {
  return `updated ${new Date().toLocaleTimeString()}`;
}

function adminSummary(models) {
  const states = {};
  for (const model of models) states[model.state] = (states[model.state] || 0) + 1;
  const counted = models.reduce((sum, m) => sum + (m.state === "unloaded" ? 0 : m.memory.counted_bytes), 0);
  const stateText = Object.entries(states).map(([state, n]) => `${n} ${state}`).join(", ");
  return `${models.length} models (${stateText}) · ${formatBytes(counted)} counted · ${updatedAt()}`;
}

function refusalPanel(title, message, ...more) {
  return h("div", { class: "panel refusal", role: "alert" }, h("h2", { text: title }), h("p", { text: message }), ...more);
}

export function mount(root) {
  let stopped = false;
  let view = null; // {kind: "admin" | "readonly", table}
  let selected = decodeURIComponent(location.hash.split("/")[1] || "") || null;
  let detail = null;
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
    detail = detailPanel(model, { onChanged: () => refresh().catch(() => {}) });
    detailSlot.replaceChildren(detail.element);
    if (focus) detail.heading.focus(); // the keyboard goes on into the form
  }

  function showAdmin(models) {
    if (view?.kind !== "admin") {
      view = { kind: "admin", table: adminTable((id) => select(id, true)) };
      body.replaceChildren(view.table.element);
    }
    view.table.update(models);
    summary.textContent = adminSummary(models);
    if (!selected) return;
    if (!detail || detail.id() !== selected) select(selected, false);
    else detail.update(view.table.model(selected));
  }

  function showReadOnly(refusal, models) {
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
    stopPoll(); // a poll would ask again every 2 s; saving a key mounts the page afresh
    summary.textContent = "";
    const openDialog = () => document.getElementById("key-button").click();
    const open = h("button", { type: "button", text: "Enter API key", onclick: openDialog });
    body.replaceChildren(refusalPanel("API key needed", message, open));
  }

  async function refresh() {
    if (view?.kind === "readonly") {
      const listing = await api("/v1/models");
      if (!stopped) showReadOnly(null, listing.data);
      return;
    }
    try {
      const listing = await api("/v1/admin/models");
      if (!stopped) showAdmin(listing.data);
    } catch (error) {
      if (stopped || !(error instanceof ApiError)) throw error;
      if (error.status === 401) return showNoKey(error.message);
      if (error.status !== 403) throw error;
      const listing = await api("/v1/models"); // the list every inference key may read
      if (!stopped) showReadOnly(error.message, listing.data);
    }
  }

  const stopPoll = poll(refresh, POLL_MS, (error) => notice(`Could not refresh the models: ${error.message}`, "error"));
  const ticker = setInterval(() => view?.table.tick?.(), TICK_MS);
  return () => {
    stopped = true;
    stopPoll();
    clearInterval(ticker);
  };
}
