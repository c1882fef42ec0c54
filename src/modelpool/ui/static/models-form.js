// The load form's option fields, generated from the JSON schema of each overridable option
// (`override_options` in the admin API, taken from the backend's own pydantic Options):
// numbers get number inputs with their bounds, booleans a checkbox, enums a select, strings
// a text box, and anything else (lists, dicts like extra_args) a JSON text area.
import { field, h } from "./lib.js";

const UNSET = "";

/** The first sentence of a description: the hint stays short; the rest is in docs/configuration.md. */
function shortDescription(text) {
  if (!text) return "";
  const flat = text.replace(/\s+/g, " ").trim();
  const end = flat.search(/\.(\s|$)/);
  return end > 0 && end < 180 ? flat.slice(0, end + 1) : flat;
}

/** "integer ≥ 1 · default 1": the type and bounds, so the limits are visible before sending. */
function describeType(schema) {
  const parts = [schema.enum ? "choice" : schema.type || "JSON"];
  if (schema.minimum !== undefined) parts.push(`≥ ${schema.minimum}`);
  if (schema.exclusiveMinimum !== undefined) parts.push(`> ${schema.exclusiveMinimum}`);
  if (schema.maximum !== undefined) parts.push(`≤ ${schema.maximum}`);
  if (schema.exclusiveMaximum !== undefined) parts.push(`< ${schema.exclusiveMaximum}`);
  const empty = schema.nullable ? "empty: automatic" : null;
  const fallback = schema.default === undefined || schema.default === null ? null : `default ${JSON.stringify(schema.default)}`;
  return [parts.join(" "), fallback, empty].filter(Boolean).join(" · ");
}

function selectControl(choices, current, nullable) {
  const select = h("select");
  if (nullable) select.append(h("option", { value: UNSET, text: "(automatic)" }));
  for (const choice of choices) select.append(h("option", { value: JSON.stringify(choice), text: String(choice) }));
  select.value = current === null || current === undefined ? UNSET : JSON.stringify(current);
  return select;
}

/** One option's control and how to read it back: read() gives {value} or {error}. */
function optionControl(schema, value) {
  if (Array.isArray(schema.enum)) {
    const select = selectControl(schema.enum, value, schema.nullable);
    return { control: select, read: () => ({ value: select.value === UNSET ? null : JSON.parse(select.value) }) };
  }
  if (schema.type === "boolean" && schema.nullable) {
    const select = selectControl([true, false], value, true);
    return { control: select, read: () => ({ value: select.value === UNSET ? null : JSON.parse(select.value) }) };
  }
  if (schema.type === "boolean") {
    const box = h("input", { type: "checkbox", checked: Boolean(value) });
    return { control: box, read: () => ({ value: box.checked }) };
  }
  if (schema.type === "integer" || schema.type === "number") return numberControl(schema, value);
  if (schema.type === "string") {
    const input = h("input", { type: "text", value: value ?? "", spellcheck: "false" });
    return { control: input, read: () => ({ value: input.value === "" && schema.nullable ? null : input.value }) };
  }
  const area = h("textarea", { rows: "3", spellcheck: "false", value: JSON.stringify(value ?? null) });
  return {
    control: area,
    read: () => {
      try {
        return { value: JSON.parse(area.value) };
      } catch (error) {
        return { error: `is not valid JSON (${error.message})` };
      }
    },
  };
}

function numberControl(schema, value) {
  const integer = schema.type === "integer";
  const input = h("input", {
    type: "number", inputmode: integer ? "numeric" : "decimal", step: integer ? "1" : "any",
    min: schema.minimum, max: schema.maximum, value: value ?? "",
  });
  const read = () => {
    if (input.value === "") return schema.nullable ? { value: null } : { error: "needs a number" };
    if (!input.validity.valid) return { error: input.validationMessage || "is out of range" };
    const number = Number(input.value);
    if (schema.exclusiveMinimum !== undefined && !(number > schema.exclusiveMinimum)) {
      return { error: `must be greater than ${schema.exclusiveMinimum}` };
    }
    if (schema.exclusiveMaximum !== undefined && !(number < schema.exclusiveMaximum)) {
      return { error: `must be less than ${schema.exclusiveMaximum}` };
    }
    return { value: number };
  };
  return { control: input, read };
}

/**
 * The fields of `options` ([{name, schema, value}]) and collect(), which returns
 * {overrides, problems}: only the options whose value differs from the current one.
 */
export function optionFields(options) {
  const readers = [];
  const nodes = options.map((option) => {
    const { control, read } = optionControl(option.schema || {}, option.value);
    control.name = option.name;
    control.dataset.option = option.name;
    readers.push({ option, control, read });
    const description = shortDescription(option.schema?.description);
    const wrapper = field(option.name, control, `${description} ${describeType(option.schema || {})}`);
    // The hint in two lines: what the option does, then its type and bounds.
    wrapper.querySelector(".hint").replaceChildren(description, description ? h("br") : "",
      h("span", { class: "type-line", text: describeType(option.schema || {}) }));
    wrapper.classList.add("option-field");
    if (control.type === "checkbox") wrapper.classList.add("checkbox-field");
    return wrapper;
  });

  function collect() {
    const overrides = {};
    const problems = [];
    for (const { option, control, read } of readers) {
      const result = read();
      control.setAttribute("aria-invalid", String(Boolean(result.error)));
      if (result.error) problems.push(`${option.name} ${result.error}`);
      else if (JSON.stringify(result.value) !== JSON.stringify(option.value ?? null)) {
        overrides[option.name] = result.value;
      }
    }
    return { overrides, problems };
  }

  return { nodes, collect };
}
