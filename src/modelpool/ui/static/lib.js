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

/**
 * An API error: the HTTP status and the message of the error envelope (OpenAI's or
 * Anthropic's). `retryAfter`: the seconds the server asked to wait (Retry-After), or null.
 * Status 0: no HTTP answer to name (a stream cut off midway).
 */
export class ApiError extends Error {
  constructor(status, message, code = null, type = null, retryAfter = null) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
    this.type = type;
    this.retryAfter = retryAfter;
  }
}

/** Retry-After in seconds: a number of seconds or an HTTP date; null when absent or unreadable. */
function retryAfterOf(response) {
  const value = response.headers.get("Retry-After");
  if (!value) return null;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds);
  const date = Date.parse(value);
  return Number.isNaN(date) ? null : Math.max(0, (date - Date.now()) / 1000);
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
  return new ApiError(response.status, message, code, type, retryAfterOf(response));
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
 * POST `json` and yield each server-sent event's data, parsed, until `data: [DONE]`.
 * Aborting `signal` closes the connection (the server stops the work). A stream that ends
 * without `[DONE]` was cut off (the server or a proxy went away): that throws, so a partial
 * reply is never taken for a whole one. Leaving early (an error, or the caller's loop
 * stopping) cancels the reader, which closes the connection too.
 */
export async function* sse(path, json, signal) {
  const headers = authHeaders({ "Content-Type": "application/json", Accept: "text/event-stream" });
  const response = await fetch(path, { method: "POST", body: JSON.stringify(json), headers, signal });
  if (!response.ok) throw await errorFrom(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) throw new ApiError(0, "The stream ended early: the reply is cut off.", "stream_incomplete");
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
  } finally {
    reader.cancel().catch(() => {}); // already closed or aborted: nothing left to cancel
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

/**
 * Show a message in the page's live region (read out by screen readers). The same message
 * again changes nothing: rewriting the region would have it read out again.
 */
export function notice(message, kind = "info") {
  const region = document.getElementById("notice");
  if (region.textContent === message && region.dataset.kind === kind) return;
  region.textContent = message;
  region.dataset.kind = kind;
}

/** Empty the live region if it still shows `message` (a later notice is left alone). */
export function clearNotice(message) {
  const region = document.getElementById("notice");
  if (region.textContent === message) region.textContent = "";
}

const BACKOFF_MAX_MS = 30_000;

/**
 * How long a poller waits after a failed run: what a 429's (or 503's) Retry-After asks; after
 * a network error or a 5xx, twice as long at each failure in a row (`ms`, 2 `ms`, 4 `ms`, …,
 * at most 30 s), so a server that is down or overloaded is not asked every `ms`.
 */
export function retryDelay(error, ms, failures) {
  const backoff = Math.min(BACKOFF_MAX_MS, ms * 2 ** Math.max(0, failures - 1));
  const transient = !(error instanceof ApiError) || error.status >= 500 || error.status === 429;
  const asked = error instanceof ApiError && error.retryAfter !== null ? error.retryAfter * 1000 : 0;
  return Math.max(transient ? backoff : ms, asked);
}

/**
 * Run `task` soon and then every `ms` (never two at once) until stop(). A failure is shown
 * in the notice line (`describe(error)` words it) and cleared by the next success; after a
 * failure the next run waits as retryDelay() says. now() runs the task at once (after the
 * run in progress, if any), for a change the page made itself. Returns {stop, now}.
 */
export function poll(task, ms, { describe = (error) => error.message } = {}) {
  let stopped = false;
  let timer = null;
  let running = false;
  let again = false; // now() was asked during a run
  let failures = 0;
  let shown = null; // the notice this poller wrote
  const tick = async () => {
    clearTimeout(timer);
    running = true;
    let wait = ms;
    try {
      await task();
      failures = 0;
      if (shown !== null) clearNotice(shown);
      shown = null;
    } catch (error) {
      failures += 1;
      wait = retryDelay(error, ms, failures);
      if (!stopped) {
        shown = describe(error);
        notice(shown, "error");
      }
    }
    running = false;
    if (stopped) return;
    if (again && failures === 0) wait = 0;
    again = false;
    timer = setTimeout(tick, wait);
  };
  timer = setTimeout(tick, 0);
  return {
    stop() {
      stopped = true;
      clearTimeout(timer);
    },
    now() {
      if (stopped) return;
      if (running) again = true;
      else tick();
    },
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

/**
 * A duration for people: "42 s", "4 min 05 s", "1 h 02 min". Whole seconds, rounded with
 * `round` (a countdown rounds up, so it shows 0 only when due). `precise` keeps the fraction
 * under a minute ("350 ms", "2.35 s", "12.5 s"): latencies and clip lengths.
 */
export function formatDuration(seconds, { round = Math.round, precise = false } = {}) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "–";
  if (precise && seconds < 60) {
    if (seconds < 1) return `${(seconds * 1000).toFixed(seconds < 0.01 ? 1 : 0)} ms`;
    return `${seconds.toFixed(seconds < 10 ? 2 : 1)} s`;
  }
  const whole = Math.max(0, round(seconds));
  if (whole < 60) return `${whole} s`;
  const minutes = Math.floor(whole / 60);
  if (minutes < 60) return `${minutes} min ${String(whole % 60).padStart(2, "0")} s`;
  return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, "0")} min`;
}

export function formatSeconds(seconds) {
  return formatDuration(seconds);
}

/** A role=alert region for a form's errors: show(error) writes the message, clear() empties it. */
export function errorRegion() {
  const node = h("div", { role: "alert", class: "form-error" });
  return {
    node,
    show(error) {
      node.textContent = typeof error === "string" ? error : error.message;
    },
    clear() {
      node.textContent = "";
    },
  };
}

/**
 * Mark a button unable to act now, or able again. aria-disabled, not disabled: a disabled
 * button drops the keyboard focus, and whoever pressed it should still be on it when the
 * work is done. It still gets clicks and Enter: its handler asks isBusy() first.
 */
export function setBusy(button, busy) {
  button.setAttribute("aria-disabled", String(busy));
}

export function isBusy(button) {
  return button.getAttribute("aria-disabled") === "true";
}
