// The models page: every model's live state from the admin API (polled every 2 s), and a
// detail panel for the selected one (`#models/<id>`, written with replaceState, which fires
// no hashchange, so the page is not mounted again). A key without the admin scope gets the
// API's refusal and the read-only list from /v1/models: the page shows what the key may see.
import { api, ApiError, formatBytes, h, notice, poll } from "./lib.js";
import { detailPanel } from "./models-detail.js";

const POLL_MS = 2000;
const TICK_MS = 1000;
const COLUMNS = [
  ["model", "Model"], ["state", "State"], ["backend", "Backend"], ["tasks", "Tasks"], ["replicas", "Replicas"],
  ["in-flight", "In flight"], ["queued", "Queued"], ["memory", "Memory"], ["keep-alive", "Keep-alive"],
  ["error", "Last error"],
];
const NUMERIC = new Set(["replicas", "in-flight", "queued", "memory"]);

/** "4 min 05 s" for a countdown: whole seconds, rounded up (0 only when it is due). */
function countdown(seconds) {
  const s = Math.max(0, Math.ceil(seconds));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, "0")} min`;
}

function tags(values) {
  return values.map((value) => h("span", { class: "tag", text: value }));
}

function capabilityTags(capabilities) {
  const c = capabilities || {};
  const found = (c.modalities || []).filter((m) => m !== "text");
  if (c.tools) found.push("tools");
  if (c.thinking_modes?.length) found.push("thinking");
  if (c.remote) found.push("remote");
  return found;
}

function stateBadge(state) {
  return h("span", { class: "state", "data-state": state, text: state });
}

export function mount(root) {
  let stopped = false;
  let mode = null; // "admin" | "readonly" | "nokey"
  let selected = decodeURIComponent(location.hash.split("/")[1] || "") || null;
  let detail = null;
  const rows = new Map();
  const summary = h("p", { class: "summary muted" }, "Loading the model list…");
  const body = h("div", { class: "models-body" });
  const detailSlot = h("div", { class: "detail-slot" });
  root.append(h("div", { class: "page-head" }, h("h1", { text: "Models" }), summary), body, detailSlot);

  function select(id, focus) {
    selected = id;
    history.replaceState(null, "", `#models/${encodeURIComponent(id)}`);
    for (const [rowId, entry] of rows) {
      entry.row.classList.toggle("selected", rowId === id);
      entry.button.setAttribute("aria-pressed", String(rowId === id));
    }
    const model = rows.get(id)?.model;
    if (!model) return;
    detail = detailPanel(model, { onChanged: () => refresh() });
    detailSlot.replaceChildren(detail.element);
    if (focus) detail.heading.focus(); // the keyboard goes on into the form
  }

  function adminRow(model) {
    const button = h("button", {
      type: "button", class: "link-button", "aria-label": `Select ${model.id}`, "aria-pressed": "false",
      "aria-controls": "model-detail", text: model.id, onclick: () => select(model.id, true),
    });
    const cells = Object.fromEntries(COLUMNS.map(([key]) => [key, h("td", { "data-col": key, class: NUMERIC.has(key) ? "num" : null })]));
    cells.model.append(button);
    const row = h("tr", { "data-model": model.id }, ...Object.values(cells));
    return { row, cells, button, model, deadline: null };
  }

  function fillAdminRow(entry, model, receivedAt) {
    const { cells } = entry;
    entry.model = model;
    cells.state.replaceChildren(stateBadge(model.state));
    cells.backend.replaceChildren(h("code", { text: model.backend }));
    cells.tasks.replaceChildren(...tags(model.tasks), ...tags(capabilityTags(model.capabilities)).map((t) => {
      t.classList.add("tag-capability");
      return t;
    }));
    const live = model.replicas.filter((r) => !r.retiring).length;
    cells.replicas.textContent = `${live} / ${model.replicas_wanted}`;
    cells["in-flight"].textContent = String(model.in_flight);
    cells.queued.textContent = String(model.queued);
    const measured = model.memory.measured_bytes ? formatBytes(model.memory.measured_bytes) : "–";
    const estimate = model.memory.estimate_bytes ? `est. ${formatBytes(model.memory.estimate_bytes)}` : "";
    cells.memory.replaceChildren(h("span", { text: measured }), estimate ? h("small", { class: "muted block", text: estimate }) : "");
    entry.deadline = model.expires_in_s == null ? null : receivedAt + model.expires_in_s;
    paintKeepAlive(entry);
    cells.error.replaceChildren(model.last_error ? h("span", { class: "error-text clamp", title: model.last_error, text: model.last_error }) : "");
  }

  function paintKeepAlive(entry) {
    const { model, deadline } = entry;
    const cell = entry.cells["keep-alive"];
    if (model.keep_alive_s < 0) cell.textContent = "never";
    else if (deadline !== null) cell.textContent = countdown(deadline - performance.now() / 1000);
    else if (model.state === "ready") cell.textContent = "in use";
    else cell.textContent = `${countdown(model.keep_alive_s)} idle`;
  }

  function showAdmin(models) {
    const receivedAt = performance.now() / 1000;
    if (mode !== "admin") {
      mode = "admin";
      rows.clear();
      const head = h("tr", {}, ...COLUMNS.map(([key, title]) => h("th", { scope: "col", class: NUMERIC.has(key) ? "num" : null, text: title })));
      const table = h("table", { class: "models-table" }, h("caption", { class: "visually-hidden", text: "Models and their state" }), h("thead", {}, head), h("tbody"));
      body.replaceChildren(h("section", { class: "panel table-panel", "aria-label": "Models (admin view)" }, h("div", { class: "table-scroll" }, table)));
    }
    const tbody = body.querySelector("tbody");
    for (const model of models) {
      let entry = rows.get(model.id);
      if (!entry) {
        entry = adminRow(model);
        rows.set(model.id, entry);
        tbody.append(entry.row);
      }
      fillAdminRow(entry, model, receivedAt);
    }
    const states = models.reduce((counts, m) => ({ ...counts, [m.state]: (counts[m.state] || 0) + 1 }), {});
    const counted = models.reduce((sum, m) => sum + (m.state === "unloaded" ? 0 : m.memory.counted_bytes), 0);
    const stateText = Object.entries(states).map(([state, n]) => `${n} ${state}`).join(", ");
    summary.textContent = `${models.length} models (${stateText}) · ${formatBytes(counted)} counted · updated ${new Date().toLocaleTimeString()}`;
    if (selected && rows.has(selected)) {
      if (!detail || detail.id() !== selected) select(selected, false);
      else detail.update(rows.get(selected).model);
    }
  }

  function showReadOnly(refusal, models) {
    if (mode !== "readonly") {
      mode = "readonly";
      detailSlot.replaceChildren();
      const message = h("div", { class: "panel refusal", role: "alert" },
        h("h2", { text: "Admin view" }), h("p", { text: refusal }),
        h("p", { class: "muted", text: "Below is the read-only model list from /v1/models; loading and unloading need a key with the admin scope." }));
      const table = h("table", { class: "models-table" },
        h("thead", {}, h("tr", {}, ...["Model", "State", "Tasks", "Capabilities"].map((t) => h("th", { scope: "col", text: t })))),
        h("tbody"));
      body.replaceChildren(message, h("section", { class: "panel table-panel", "aria-label": "Models (read-only)" }, h("div", { class: "table-scroll" }, table)));
    }
    const tbody = body.querySelector("tbody");
    tbody.replaceChildren(...models.map((m) => h("tr", { "data-model": m.id },
      h("td", {}, h("strong", { text: m.id }), m.description ? h("small", { class: "muted block", text: m.description }) : ""),
      h("td", {}, stateBadge(m.state)),
      h("td", {}, ...tags(m.tasks)),
      h("td", {}, ...tags(capabilityTags(m.capabilities))))));
    summary.textContent = `${models.length} models · read-only · updated ${new Date().toLocaleTimeString()}`;
  }

  function showNoKey(message) {
    mode = "nokey";
    stopPoll();
    summary.textContent = "";
    const open = h("button", { type: "button", text: "Enter API key", onclick: () => document.getElementById("key-button").click() });
    body.replaceChildren(h("div", { class: "panel refusal", role: "alert" }, h("h2", { text: "API key needed" }), h("p", { text: message }), open));
  }

  async function refresh() {
    if (mode === "readonly") {
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
  const ticker = setInterval(() => rows.forEach(paintKeepAlive), TICK_MS);
  return () => {
    stopped = true;
    stopPoll();
    clearInterval(ticker);
  };
}
