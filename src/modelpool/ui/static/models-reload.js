// The models page's "Reload config" control (admin view): POST /v1/admin/reload re-reads the
// config the server started from and applies the difference (docs/configuration.md). The
// reply is summed up in words; a refusal (400 invalid_config: nothing changed; 409: the
// server was not started from a config it can re-read) shows the server's message.
import { api, errorRegion, h, isBusy, setBusy } from "./lib.js";

/** "smollm2 (options)" for a changed model: its id and the fields that changed. */
function changeText(change) {
  return `${change.id} (${change.fields.join(", ")})`;
}

/** The reload's reply in one sentence: what it added, removed, reloads, and what it left. */
export function reloadSummary(reply) {
  const parts = [];
  const listed = (label, items) => {
    if (items.length) parts.push(`${label}: ${items.join(", ")}`);
  };
  listed("added", reply.added);
  listed("removed (draining)", reply.removed);
  listed("reloading at their next idle moment", reply.reloading.map(changeText));
  listed("changed in place", reply.hot.map(changeText));
  listed("applied", reply.live);
  listed("needs a restart", reply.needs_restart);
  parts.push(`${reply.unchanged} unchanged`);
  const changed = parts.length > 1 ? "Config reloaded" : "Config reloaded: nothing changed";
  return `${changed}; ${parts.join("; ")}.`;
}

/**
 * The button and the lines under it. `onReloaded()` runs after a reload that was applied,
 * so the table shows the new models at once rather than at the next poll.
 */
export function reloadControl({ onReloaded }) {
  const button = h("button", { type: "button", class: "secondary", id: "reload-config",
    "aria-describedby": "reload-config-hint", text: "Reload config" });  // prettier-ignore
  const hint = h("small", { id: "reload-config-hint", class: "hint",
    text: "Re-read the server's config file and apply the difference" });  // prettier-ignore
  const result = h("p", { class: "reload-result muted", role: "status" });
  const errors = errorRegion();

  button.addEventListener("click", async () => {
    if (isBusy(button)) return; // one reload at a time: the server serializes them anyway
    setBusy(button, true);
    result.textContent = "Reloading the config…";
    errors.clear();
    try {
      result.textContent = reloadSummary(await api("/v1/admin/reload", { method: "POST" }));
      onReloaded();
    } catch (error) {
      result.textContent = "";
      errors.show(error);
    } finally {
      setBusy(button, false);
    }
  });
  const element = h("div", { class: "reload-config" }, h("div", { class: "row" }, button, hint), result, errors.node);
  return { element };
}
