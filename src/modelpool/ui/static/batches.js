// The batches page: the key's batches from /v1/batches (polled every 2 s) with their status,
// counts and result files, Cancel for one still running, and a form that uploads a JSONL file
// (/v1/files, purpose "batch") and starts a batch on it (docs/batch.md). Rows are made once
// per batch and then only changed, so a focused button survives a refresh.
import { api, errorRegion, field, h, isBusy, notice, poll, setBusy } from "./lib.js";

const POLL_MS = 2000;
const LISTED = 50;
const ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"];
const RUNNING = new Set(["validating", "in_progress"]); // what cancel can still stop
const COLUMNS = [["id", "Batch"], ["status", "Status"], ["endpoint", "Endpoint"], ["created", "Created"],
  ["requests", "Requests"], ["files", "Results"], ["actions", "Actions"]];  // prettier-ignore

function countsText(counts) {
  const failed = counts.failed ? `, ${counts.failed} failed` : "";
  return `${counts.completed} of ${counts.total} done${failed}`;
}

/** Fetch a file's content with the key and hand it to the browser as a download. */
async function download(fileId, name) {
  const blob = await (await api(`/v1/files/${encodeURIComponent(fileId)}/content`, { raw: true })).blob();
  const url = URL.createObjectURL(blob);
  const link = h("a", { href: url, download: name, class: "visually-hidden" });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000); // the download has its copy by then
}

function downloadButton(label, batchId, fileId, suffix) {
  return h("button", { type: "button", class: "secondary", "aria-label": `${label} of ${batchId}`, text: label,
    onclick: () => download(fileId, `${batchId}-${suffix}.jsonl`).catch((error) =>
      notice(`Could not download ${fileId}: ${error.message}`, "error")) });  // prettier-ignore
}

function batchRow(batch, onCancel) {
  const cells = Object.fromEntries(COLUMNS.map(([key]) => [key, h("td", { "data-col": key })]));
  const cancel = h("button", { type: "button", class: "danger", "aria-label": `Cancel ${batch.id}`, text: "Cancel",
    onclick: (event) => onCancel(batch.id, event.currentTarget) });  // prettier-ignore
  cells.id.append(h("code", { text: batch.id }));
  cells.endpoint.append(h("code", { text: batch.endpoint }));
  cells.created.textContent = new Date(batch.created_at * 1000).toLocaleString();
  cells.actions.append(cancel);
  return { row: h("tr", { "data-batch": batch.id }, ...Object.values(cells)), cells, cancel, files: "" };
}

function fillRow(entry, batch) {
  const { cells } = entry;
  const firstError = batch.errors?.data?.[0];
  cells.status.replaceChildren(h("span", { class: "state", "data-state": batch.status, text: batch.status }),
    firstError ? h("small", { class: "error-text block", text: `line ${firstError.line ?? "–"}: ${firstError.message}` }) : "");
  cells.requests.textContent = countsText(batch.request_counts);
  entry.cancel.hidden = !RUNNING.has(batch.status);
  // The result buttons change only when a file appears: rebuilt then, not at every poll.
  const files = `${batch.output_file_id}|${batch.error_file_id}`;
  if (files !== entry.files) {
    entry.files = files;
    cells.files.replaceChildren(
      batch.output_file_id ? downloadButton("Download output", batch.id, batch.output_file_id, "output") : "",
      batch.error_file_id ? downloadButton("Download errors", batch.id, batch.error_file_id, "errors") : "");
  }
}

/** The upload form: a JSONL file and its endpoint → a file of purpose "batch" → a batch. */
function createForm(onCreated) {
  const file = h("input", { type: "file", accept: ".jsonl,application/jsonl,application/x-ndjson,text/plain" });
  const endpoint = h("select", {}, ...ENDPOINTS.map((path) => h("option", { value: path, text: path })));
  const submit = h("button", { type: "submit", text: "Upload and start" });
  const errors = errorRegion();
  const form = h("form", { class: "panel batch-form", novalidate: true, "aria-labelledby": "batch-form-title" },
    h("h2", { id: "batch-form-title", text: "New batch" }),
    h("div", { class: "row" },
      field("Requests (JSONL)", file, "One request a line: {custom_id, method: POST, url, body}"),
      field("Endpoint", endpoint)),
    h("div", { class: "actions" }, submit), errors.node);  // prettier-ignore

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (isBusy(submit)) return;
    const chosen = file.files?.[0];
    if (!chosen) return errors.show("Choose a JSONL file of requests first.");
    setBusy(submit, true);
    errors.clear();
    try {
      const upload = new FormData();
      upload.append("purpose", "batch");
      upload.append("file", chosen, chosen.name);
      const stored = await api("/v1/files", { form: upload });
      const batch = await api("/v1/batches",
        { json: { input_file_id: stored.id, endpoint: endpoint.value, completion_window: "24h" } });
      file.value = "";
      notice(`Batch ${batch.id} created (${batch.status}).`);
      onCreated();
    } catch (error) {
      errors.show(error);
    } finally {
      setBusy(submit, false);
    }
  });
  return form;
}

export function mount(root) {
  let stopped = false;
  const rows = new Map();
  const summary = h("p", { class: "summary muted" }, "Loading the batches…");
  const head = h("tr", {}, ...COLUMNS.map(([key, title]) => h("th", { scope: "col", "data-col": key, text: title })));
  const tbody = h("tbody");
  const table = h("section", { class: "panel table-panel", "aria-label": "Batches" },
    h("div", { class: "table-scroll" }, h("table", { class: "models-table batches-table" }, h("thead", {}, head), tbody)));
  const empty = h("p", { class: "muted empty-note", text: "No batches yet." });

  async function cancel(id, button) {
    if (isBusy(button)) return;
    setBusy(button, true);
    try {
      const batch = await api(`/v1/batches/${encodeURIComponent(id)}/cancel`, { method: "POST" });
      notice(`Batch ${id} is ${batch.status}.`);
      poller.now();
    } catch (error) {
      notice(`Could not cancel ${id}: ${error.message}`, "error");
    } finally {
      setBusy(button, false);
    }
  }

  async function refresh() {
    const listed = (await api(`/v1/batches?limit=${LISTED}`)).data;
    if (stopped) return; // the page was left while the list was on its way
    for (const batch of listed) {
      if (!rows.has(batch.id)) rows.set(batch.id, batchRow(batch, cancel));
      fillRow(rows.get(batch.id), batch);
    }
    // Newest first, as listed; rows are moved only when the order changed (a move drops the focus).
    const wanted = listed.map((batch) => rows.get(batch.id).row);
    if (wanted.some((row, i) => tbody.children[i] !== row)) tbody.replaceChildren(...wanted);
    empty.hidden = listed.length > 0;
    summary.textContent = `${listed.length} batch${listed.length === 1 ? "" : "es"} · updated ${new Date().toLocaleTimeString()}`;
  }

  root.append(h("div", { class: "page-head" }, h("h1", { text: "Batches" }), summary),
    createForm(() => poller.now()), table, empty);
  const poller = poll(() => (stopped ? null : refresh()), POLL_MS,
    { describe: (error) => `Could not refresh the batches: ${error.message}` });
  return () => {
    stopped = true;
    poller.stop();
  };
}
