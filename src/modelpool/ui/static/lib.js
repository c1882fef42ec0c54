// Shared helpers of the workbench pages: API calls with the user's key, SSE streams,
// element building, polling. No framework: plain DOM, so nothing is fetched from a CDN.

const KEY_NAME = "modelpool.key";

export function getKey() {
  return sessionStorage.getItem(KEY_NAME) || localStorage.getItem(KEY_NAME) || "";
}

export function setKey(key, remember) {
  sessionStorage.removeItem(KEY_NAME);
  localStorage.removeItem(KEY_NAME);
  if (!key) return;
  (remember ? localStorage : sessionStorage).setItem(KEY_NAME, key);
}

/** An API error: the HTTP status and the message of the error envelope (OpenAI's or Anthropic's). */
export class ApiError extends Error {
  constructor(status, message, code = null, type = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.type = type;
  }
}

function authHeaders(extra = {}) {
  const key = getKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

async function errorFrom(response) {
  let message = `${response.status} ${response.statusText}`;
  let code = null;
  let type = null;
  try {
    const body = await response.json();
    const error = body.error || body;
    if (error && typeof error.message === "string") message = error.message;
    code = error.code ?? null;
    type = error.type ?? null;
  } catch (_) {
    // not JSON: keep the status line
  }
  if (response.status === 401) window.dispatchEvent(new CustomEvent("modelpool:needkey", { detail: message }));
  return new ApiError(response.status, message, code, type);
}

/**
 * Call the API. `json` is sent as a JSON body, `form` as multipart. Returns the parsed JSON,
 * or the Response itself with `raw: true` (audio). Throws ApiError for a non-2xx answer.
 */
export async function api(path, { method, json, form, signal, raw = false } = {}) {
  const init = { method: method || (json || form ? "POST" : "GET"), signal, headers: authHeaders() };
  if (json !== undefined) {
    init.body = JSON.stringify(json);
    init.headers["Content-Type"] = "application/json";
  } else if (form !== undefined) {
    init.body = form;
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await errorFrom(response);
  return raw ? response : response.json();
}

/**
 * POST `json` and yield each server-sent event's data, parsed, until `data: [DONE]` or the
 * end of the stream. Aborting `signal` closes the connection (the server stops the work).
 */
export async function* sse(path, json, signal) {
  const headers = authHeaders({ "Content-Type": "application/json", Accept: "text/event-stream" });
  const response = await fetch(path, { method: "POST", body: JSON.stringify(json), headers, signal });
  if (!response.ok) throw await errorFrom(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value.replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const event = JSON.parse(data);
      if (event && event.error) throw new ApiError(500, event.error.message || "stream failed", event.error.code);
      yield event;
    }
  }
}

/**
 * Build an element: h("button", {class: "x", onclick: f, "aria-label": "..."}, "text", child).
 * `text` sets textContent; `on*` props add listeners; other props become attributes
 * (false/null/undefined ones are left out); children are nodes or strings.
 */
export function h(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (value === false || value === null || value === undefined) continue;
    if (name === "text") node.textContent = value;
    else if (name.startsWith("on") && typeof value === "function") node.addEventListener(name.slice(2), value);
    else if (name === "value") node.value = value;
    else if (name === "checked") node.checked = Boolean(value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** A labelled form field: the label is tied to the control by id (screen readers, tests). */
let fieldCount = 0;
export function field(labelText, control, hint = null) {
  if (!control.id) control.id = `field-${++fieldCount}`;
  const children = [h("label", { for: control.id, text: labelText }), control];
  if (hint) {
    const hintId = `${control.id}-hint`;
    control.setAttribute("aria-describedby", hintId);
    children.push(h("small", { id: hintId, class: "hint", text: hint }));
  }
  return h("div", { class: "field" }, ...children);
}

/** Show a message in the page's live region (read out by screen readers). */
export function notice(message, kind = "info") {
  const region = document.getElementById("notice");
  region.textContent = message;
  region.dataset.kind = kind;
}

/**
 * Run `task` now and then every `ms` (never two at once) until the returned stop() is
 * called. Errors go to `onError` (default: the notice line) and polling goes on.
 */
export function poll(task, ms, onError = (error) => notice(error.message, "error")) {
  let stopped = false;
  let timer = null;
  const tick = async () => {
    try {
      await task();
    } catch (error) {
      if (!stopped) onError(error);
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

export function formatBytes(bytes) {
  if (bytes === null || bytes === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

export function formatSeconds(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 60) return `${Math.round(seconds)} s`;
  const minutes = Math.floor(seconds / 60);
  return minutes < 60 ? `${minutes} min ${Math.round(seconds % 60)} s` : `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}
