// The chat's settings: sampling numbers, the tools editor, and the image picker (shown only
// for models that read images).
import { field, h } from "./lib.js";
import { numberField } from "./playground-common.js";

/** Sampling inputs; values() gives only the ones filled in (the rest: server defaults). */
export function samplingControls() {
  const fields = {
    temperature: numberField("Temperature", { min: 0, max: 2, step: 0.05 }),
    top_p: numberField("Top p", { min: 0, max: 1, step: 0.05 }),
    top_k: numberField("Top k", { min: 0, step: 1, integer: true }),
    max_tokens: numberField("Max tokens", { min: 1, step: 1, integer: true }),
    seed: numberField("Seed", { min: 0, step: 1, integer: true }),
  };
  const element = h("fieldset", { class: "pg-sampling" },
    h("legend", { text: "Sampling" }),
    h("p", { class: "hint", text: "Empty fields use the server's defaults." }),
    h("div", { class: "pg-fields" }, Object.values(fields).map((item) => item.element)));
  return {
    element,
    values() {
      const chosen = {};
      for (const [name, item] of Object.entries(fields)) {
        const value = item.value();
        if (value !== undefined) chosen[name] = value;
      }
      return chosen;
    },
    /** The model's context bounds max tokens (null: unknown, no bound). */
    setContextLength(tokens) {
      fields.max_tokens.input.max = tokens ?? "";
    },
  };
}

const EXAMPLE_TOOLS = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];

/**
 * An OpenAI `tools` array typed as JSON, checked before sending, and a tool_choice select.
 * values() throws a readable Error for bad JSON, so nothing malformed reaches the server.
 */
export function toolsEditor() {
  const text = h("textarea", { rows: 5, spellcheck: "false", placeholder: '[{"type": "function", "function": {...}}]' });
  const choice = h("select", {},
    ["auto", "required", "none"].map((value) => h("option", { value, text: value })));
  const example = h("button", {
    type: "button", class: "secondary small", text: "Insert example",
    onclick: () => { text.value = JSON.stringify(EXAMPLE_TOOLS, null, 2); },
  });
  const note = h("p", { class: "hint", hidden: true, text: "This model does not take tools." });
  let supported = true;
  const element = h("fieldset", { class: "pg-tools" },
    h("legend", { text: "Tools" }),
    field("Tools (JSON)", text, "An OpenAI tools array. Leave it empty to send none."),
    h("div", { class: "row" }, field("Tool choice", choice), example),
    note);
  return {
    element,
    /** The fields to send; none for a model that takes no tools (its fields are disabled). */
    values() {
      if (!supported) return {};
      const source = text.value.trim();
      if (!source) return choice.value === "auto" ? {} : { tool_choice: choice.value };
      let tools;
      try {
        tools = JSON.parse(source);
      } catch (error) {
        throw new Error(`Tools is not valid JSON: ${error.message}`);
      }
      if (!Array.isArray(tools) || tools.some((tool) => !tool || typeof tool.function?.name !== "string")) {
        throw new Error('Tools must be a JSON array of {"type": "function", "function": {"name": ...}} objects.');
      }
      return { tools, tool_choice: choice.value };
    },
    setSupported(takesTools) {
      supported = takesTools;
      text.disabled = !supported;
      choice.disabled = !supported;
      example.disabled = !supported;
      note.hidden = supported;
    },
  };
}

/**
 * A file input for one image, read into a data URI (sent as an `image_url` part) and
 * previewed. Hidden unless the chosen model has the image modality.
 */
export function imagePicker() {
  let dataUrl = null;
  const input = h("input", { type: "file", accept: "image/*" });
  const preview = h("div", { class: "pg-image-preview" });
  const element = h("div", { class: "pg-image", hidden: true },
    field("Image", input, "Sent with your next message."), preview);

  let reading = 0; // which read is wanted: a read that ends after clear() or a newer choice is dropped

  function clear() {
    reading += 1;
    dataUrl = null;
    input.value = "";
    preview.replaceChildren();
  }

  input.addEventListener("change", () => {
    const file = input.files[0];
    if (!file) return clear();
    const reader = new FileReader();
    const mine = ++reading;
    reader.onload = () => {
      if (mine !== reading) return;
      dataUrl = reader.result;
      preview.replaceChildren(
        h("img", { src: dataUrl, alt: `Image to send: ${file.name}` }),
        h("button", { type: "button", class: "secondary small", text: "Remove image", onclick: clear }));
    };
    reader.readAsDataURL(file);
  });

  return {
    element,
    current: () => dataUrl,
    clear,
    setAvailable(available) {
      element.hidden = !available;
      if (!available) clear();
    },
  };
}
