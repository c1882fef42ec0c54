// The workbench shell: page switching by URL hash, the API-key dialog. Each page module
// exports mount(root) and returns a function that stops it (timers, streams), or
// {stop, route}: route() follows a new hash within the page (a sub-tab, a selected model).
import * as batches from "./batches.js";
import { api, ApiError, getKey, notice, setKey } from "./lib.js";
import * as metrics from "./metrics.js";
import * as models from "./models.js";
import * as playground from "./playground.js";

const pages = { models, playground, metrics, batches };
let shown = null; // {name, stop, route} of the mounted page

function currentPage() {
  const name = location.hash.replace(/^#/, "").split("/")[0];
  return name in pages ? name : "models";
}

/**
 * Mount the page the hash names. `focus`: the user switched pages, so the focus goes to the
 * new page's heading (a screen reader says where it is now; Tab goes on from there).
 */
function show(focus = false) {
  const name = currentPage();
  if (shown) shown.stop?.();
  const root = document.getElementById("page");
  root.replaceChildren();
  notice("");
  for (const link of document.querySelectorAll("nav a[data-page]")) {
    if (link.dataset.page === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `${name[0].toUpperCase()}${name.slice(1)} · modelpool workbench`;
  const handle = pages[name].mount(root);
  shown = typeof handle === "function" ? { name, stop: handle } : { name, ...handle };
  const heading = root.querySelector("h1");
  if (focus && heading) {
    heading.tabIndex = -1;
    heading.focus();
  }
}

/** A new hash: another page is mounted; within the same page (its nav link clicked again,
 * a sub-tab's address) the page follows it, and what runs there (a chat reply) goes on. */
function followHash() {
  if (shown && shown.name === currentPage()) shown.route?.();
  else show(true);
}

function openKeyDialog(reason) {
  const dialog = document.getElementById("key-dialog");
  if (dialog.open) return;
  if (reason) document.getElementById("key-dialog-reason").textContent = reason;
  document.getElementById("key-input").value = "";
  dialog.showModal();
}

function setUpKeyDialog() {
  const dialog = document.getElementById("key-dialog");
  dialog.addEventListener("close", () => {
    if (dialog.returnValue === "save") {
      setKey(document.getElementById("key-input").value.trim(), document.getElementById("key-remember").checked);
      show();
    } else if (dialog.returnValue === "forget") {
      setKey("", false);
      show();
    }
    updateKeyButton();
  });
  document.getElementById("key-button").addEventListener("click", () => openKeyDialog(null));
  window.addEventListener("modelpool:needkey", (event) => openKeyDialog(`The server asks for an API key: ${event.detail}`));
}

function updateKeyButton() {
  document.getElementById("key-button").textContent = getKey() ? "API key (set)" : "API key";
}

async function probeKeys() {
  // A 401 here opens the key dialog (lib.js raises the event); any other answer is fine.
  try {
    await api("/v1/models");
  } catch (error) {
    if (!(error instanceof ApiError)) notice(`The server did not answer: ${error.message}`, "error");
  }
}

setUpKeyDialog();
updateKeyButton();
window.addEventListener("hashchange", followHash);
show();
probeKeys();
