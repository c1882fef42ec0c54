// Pieces the playground sections share: model pickers filtered by task, running a call
// with its button busy, bounded number inputs whose empty value means "the server's default", line lists,
// headed panels, audio players of in-page blobs.
import { api, field, h, isBusy, setBusy } from "./lib.js";

/**
 * A labelled <select> of the models that serve `task` (from /v1/models `tasks`). A model
 * that is not loaded is listed with its state: choosing it loads it on the first call.
 * Returns {element, select, current()} — current() is the chosen model's /v1/models entry.
 */
export function modelPicker(label, models, task, onChange = () => {}) {
  const fitting = models.filter((model) => (model.tasks || []).includes(task));
  const select = h("select", { onchange: () => onChange(current()) });
  const describe = (model) => (model.state && model.state !== "ready" ? `${model.id} (${model.state})` : model.id);
  for (const model of fitting) select.append(h("option", { value: model.id, text: describe(model) }));
  // States change as calls load models: refresh the labels whenever the list is opened.
  select.addEventListener("focus", () => {
    api("/v1/models").then((listing) => {
      for (const option of select.options) {
        const fresh = listing.data.find((model) => model.id === option.value);
        if (fresh) option.textContent = describe(fresh);
      }
    }).catch(() => {}); // the labels are a hint; a failed refresh keeps the old ones
  });
  const ready = fitting.find((model) => model.state === "ready");
  if (ready) select.value = ready.id;
  if (!fitting.length) {
    select.append(h("option", { value: "", text: `no ${task} model is configured` }));
    select.disabled = true;
  }
  const current = () => fitting.find((model) => model.id === select.value) || null;
  return { element: field(label, select), select, current };
}

/**
 * A labelled number input. `value()` is undefined while it is empty (the server's default
 * applies) and throws a readable Error when it is out of bounds or not a number, so a
 * bad value is reported before anything is sent.
 */
export function numberField(label, { min, max, step = "any", value = "", hint = null, integer = false } = {}) {
  const input = h("input", { type: "number", min, max, step, value, inputmode: integer ? "numeric" : "decimal" });
  if (value === "") input.placeholder = "default";
  const element = field(label, input, hint);
  return {
    element,
    input,
    value() {
      if (input.validity.badInput) throw new Error(`${label} is not a number.`);
      if (input.value === "") return undefined;
      const number = Number(input.value);
      // Read the bounds from the input: a section may change them (max tokens ≤ context).
      const low = input.min === "" ? -Infinity : Number(input.min);
      const high = input.max === "" ? Infinity : Number(input.max);
      if (number < low) throw new Error(`${label} must be at least ${input.min}.`);
      if (number > high) throw new Error(`${label} must be at most ${input.max}.`);
      if (integer && !Number.isInteger(number)) throw new Error(`${label} must be a whole number.`);
      return number;
    },
  };
}

/** The non-empty lines of a textarea, trimmed (prompts and texts; not continuations). */
export function nonEmptyLines(text) {
  return text.split("\n").map((line) => line.trim()).filter(Boolean);
}

/**
 * Run `task` with `button` busy (aria-disabled: the focus stays on it) and `region` marked
 * busy; its errors go to `errors`. A press while it runs starts nothing. An abort (the page
 * was left) is no error to show.
 */
export async function running(button, region, errors, task) {
  if (isBusy(button)) return;
  errors.clear();
  setBusy(button, true);
  region.setAttribute("aria-busy", "true");
  try {
    await task();
  } catch (error) {
    if (error.name !== "AbortError") errors.show(error);
  } finally {
    setBusy(button, false);
    region.removeAttribute("aria-busy");
  }
}

/** A panel with a heading; `id` lets the heading name the region for screen readers. */
export function panel(title, id, ...children) {
  const heading = h("h2", { id, text: title });
  return h("section", { class: "panel", "aria-labelledby": id }, heading, ...children);
}

/** Object URLs of one player, revoked when replaced or when the page goes away. */
export function blobPlayer(label) {
  let url = null;
  const audio = h("audio", { controls: true, "aria-label": label, hidden: true });
  return {
    audio,
    show(blob) {
      if (url) URL.revokeObjectURL(url);
      url = URL.createObjectURL(blob);
      audio.src = url;
      audio.hidden = false;
      return url;
    },
    stop() {
      audio.pause();
      if (url) URL.revokeObjectURL(url);
    },
  };
}
