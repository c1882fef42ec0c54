// The chat tab: a multi-turn conversation streamed from /v1/chat/completions. Stop aborts
// the fetch, which closes the stream; the server sees the disconnect and stops generating.
import { errorRegion, field, h, setBusy, sse } from "./lib.js";
import { imagePicker, samplingControls, toolsEditor } from "./playground-chat-options.js";
import { AssistantMessage, userMessage } from "./playground-chat-view.js";
import { modelPicker, panel } from "./playground-common.js";

export function chatSection(models) {
  const history = []; // the API messages of the turns shown, system prompt excluded
  let controller = null;

  const sampling = samplingControls();
  const tools = toolsEditor();
  const image = imagePicker();
  const picker = modelPicker("Model", models, "chat", fitModel);
  const system = h("textarea", { class: "pg-prose", rows: 3, placeholder: "You are a helpful assistant." });
  const log = h("div", { class: "chat-log pg-log", role: "log", "aria-label": "Conversation" });
  const input = h("textarea", { class: "pg-prose", rows: 3, placeholder: "Ask something…" });
  const send = h("button", { type: "button", text: "Send", onclick: () => submit() });
  const stop = h("button", { type: "button", class: "danger", text: "Stop", hidden: true, onclick: () => controller?.abort() });
  const clear = h("button", { type: "button", class: "secondary", text: "Clear", onclick: clearConversation });
  const errors = errorRegion();

  input.addEventListener("keydown", (event) => {
    // Enter sends, Shift+Enter is a new line; not while an input method composes a character.
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      submit();
    }
  });

  function fitModel(model) {
    const capabilities = model?.capabilities || {};
    image.setAvailable((capabilities.modalities || []).includes("image"));
    tools.setSupported(capabilities.tools !== false);
    sampling.setContextLength(capabilities.context_length ?? null);
  }
  fitModel(picker.current());

  function clearConversation() {
    controller?.abort();
    history.length = 0;
    log.replaceChildren();
    errors.clear();
  }

  /** Send stays focusable while a reply streams (aria-disabled; submit() refuses meanwhile). */
  function showBusy(busy) {
    send.disabled = !picker.current();
    setBusy(send, busy);
    stop.hidden = !busy;
    log.setAttribute("aria-busy", String(busy));
  }
  showBusy(false);

  function scrollDown() {
    log.scrollTop = log.scrollHeight;
  }

  async function submit() {
    if (controller) return;
    errors.clear();
    const model = picker.current();
    const text = input.value.trim();
    const imageUrl = image.current();
    if (!model) return errors.show("No chat model is configured.");
    if (!text && !imageUrl) return errors.show("Type a message first.");
    const content = imageUrl ? [{ type: "text", text }, { type: "image_url", image_url: { url: imageUrl } }] : text;
    const user = { role: "user", content };
    const prompt = system.value.trim() ? [{ role: "system", content: system.value.trim() }] : [];
    let body;
    try {
      body = { model: model.id, messages: [...prompt, ...history, user], ...sampling.values(), ...tools.values(),
               stream: true, stream_options: { include_usage: true } }; // prettier-ignore
    } catch (error) {
      return errors.show(error);
    }
    const shownUser = userMessage(text, imageUrl);
    const reply = new AssistantMessage();
    log.append(shownUser, reply.node);
    input.value = "";
    image.clear();
    scrollDown();
    controller = new AbortController();
    showBusy(true);
    let finish = null;
    let usage = null;
    // Clear during a reply removes it from the page: it must not come back in the history.
    const remember = () => reply.node.isConnected && history.push(user, reply.toMessage());
    try {
      for await (const chunk of sse("/v1/chat/completions", body, controller.signal)) {
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices || []) {
          reply.delta(choice.delta || {});
          if (choice.finish_reason) finish = choice.finish_reason;
        }
        scrollDown();
      }
      reply.finish(finish, usage);
      remember();
    } catch (error) {
      if (error.name === "AbortError") {
        reply.stopped();
        remember();
      } else if (reply.empty) {
        // Nothing came back (a 4xx): take the turn back so it can be fixed and sent again.
        shownUser.remove();
        reply.node.remove();
        input.value = text;
        errors.show(error);
      } else {
        reply.failed(error.message);
        remember();
        errors.show(error);
      }
    } finally {
      controller = null;
      showBusy(false);
    }
  }

  const conversation = panel("Conversation", "pg-chat-conversation",
    log,
    h("div", { class: "pg-composer" },
      image.element,
      field("Message", input, "Enter sends, Shift+Enter starts a new line."),
      h("div", { class: "row" }, send, stop, clear),
      errors.node));
  const settings = panel("Settings", "pg-chat-settings",
    picker.element,
    field("System prompt", system),
    sampling.element,
    tools.element);
  const element = h("div", { class: "pg-chat" }, conversation, settings);
  return { element, stop: () => controller?.abort() };
}
