// How chat turns look: the user's message (with its image), and the assistant's reply as it
// streams — reasoning in a muted block above the answer, tool calls with their arguments
// growing, then the finish reason and token usage.
import { h } from "./lib.js";

export function userMessage(text, imageUrl) {
  return h("div", { class: "message", "data-role": "user" },
    h("span", { class: "visually-hidden", text: "You: " }),
    imageUrl ? h("img", { class: "pg-sent-image", src: imageUrl, alt: "Image sent with this message" }) : null,
    text);
}

/** One assistant reply being streamed; feed it delta fields, then finish()/stopped()/failed(). */
export class AssistantMessage {
  constructor() {
    this.text = "";
    this.calls = []; // OpenAI tool_calls, assembled from their deltas by index
    this.started = performance.now();
    this.reasoningText = h("div", { class: "pg-reasoning-text" });
    this.reasoningBlock = h("details", { class: "reasoning", open: true, hidden: true },
      h("summary", { text: "Reasoning" }), this.reasoningText);
    this.answer = h("div", { class: "pg-answer" });
    this.toolList = h("div", { class: "pg-tool-calls" });
    this.meta = h("p", { class: "pg-meta" });
    this.node = h("div", { class: "message", "data-role": "assistant", "aria-busy": "true" },
      h("span", { class: "visually-hidden", text: "Assistant: " }),
      this.reasoningBlock, this.answer, this.toolList, this.meta);
  }

  get empty() {
    return !this.text && !this.calls.length && !this.reasoningText.textContent;
  }

  /** Apply one choice's `delta` of a chat.completion.chunk. */
  delta(delta) {
    if (delta.reasoning_content) {
      this.reasoningBlock.hidden = false;
      this.reasoningText.append(delta.reasoning_content);
    }
    if (delta.content) {
      this.text += delta.content;
      this.answer.append(delta.content); // a text node per delta: no re-render of what is shown
    }
    for (const call of delta.tool_calls || []) this.toolCall(call);
  }

  toolCall(part) {
    let call = this.calls[part.index];
    if (!call) {
      const name = h("span", { class: "pg-tool-name" });
      const args = h("pre", { class: "pg-tool-args" });
      const node = h("div", { class: "tool-call" }, h("span", { class: "pg-tool-label", text: "Tool call " }), name, args);
      call = { id: part.id, type: "function", function: { name: "", arguments: "" }, view: { name, args } };
      this.calls[part.index] = call;
      this.toolList.append(node);
    }
    if (part.id) call.id = part.id;
    if (part.function?.name) {
      call.function.name += part.function.name;
      call.view.name.textContent = call.function.name;
    }
    if (part.function?.arguments) {
      call.function.arguments += part.function.arguments;
      call.view.args.append(part.function.arguments);
    }
  }

  finish(reason, usage) {
    this.end();
    const seconds = ((performance.now() - this.started) / 1000).toFixed(1);
    const parts = [h("span", {}, "finish reason: ", h("span", { class: "pg-finish", text: reason || "–" }))];
    if (usage) {
      parts.push(h("span", {
        class: "pg-usage",
        text: `${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`,
      }));
    }
    parts.push(h("span", { text: `${seconds} s` }));
    this.meta.replaceChildren(...parts);
  }

  stopped() {
    this.end();
    this.meta.replaceChildren(h("span", { class: "pg-finish", text: "stopped" }));
  }

  failed(message) {
    this.end();
    this.meta.replaceChildren(h("span", { class: "error-text", text: `failed: ${message}` }));
  }

  end() {
    this.node.removeAttribute("aria-busy");
  }

  /** The reply as a history message for the next turn. */
  toMessage() {
    const message = { role: "assistant", content: this.text };
    if (this.calls.length) {
      message.tool_calls = this.calls.filter(Boolean).map(({ id, type, function: fn }) => ({ id, type, function: fn }));
    }
    return message;
  }
}
