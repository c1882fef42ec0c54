// The playground: one tab per kind of call (chat, batch generation and scoring, embeddings,
// speech), each with a model picker that lists only the models serving its task.
// `#playground/speech` opens a tab directly; switching tabs rewrites the hash with
// replaceState, which fires no hashchange, so the page is not mounted again.
import { api, h, notice } from "./lib.js";
import { chatSection } from "./playground-chat.js";
import { embeddingsSection } from "./playground-embeddings.js";
import { scoringSection } from "./playground-scoring.js";
import { speechSection } from "./playground-speech.js";

const SECTIONS = [
  { name: "chat", title: "Chat", build: chatSection },
  { name: "score", title: "Generate & score", build: scoringSection },
  { name: "embeddings", title: "Embeddings", build: embeddingsSection },
  { name: "speech", title: "Speech", build: speechSection },
];

export function mount(root) {
  const stops = [];
  let stopped = false;
  let tabs = null; // {select, current()} once the model list is in
  root.append(h("h1", { text: "Playground" }));
  const loading = h("p", { class: "muted", text: "Loading the model list…" });
  root.append(loading);
  api("/v1/models")
    .then((listing) => {
      if (stopped) return;
      loading.remove();
      tabs = buildTabs(listing.data, stops);
      root.append(tabs.element);
    })
    .catch((error) => {
      loading.textContent = "";
      notice(`Could not list the models: ${error.message}`, "error");
    });
  return {
    stop() {
      stopped = true;
      for (const stop of stops) stop();
    },
    /** `#playground/<tab>` opens that tab; the bare `#playground` (the nav link) keeps the open one. */
    route() {
      tabs?.select(askedSection() || tabs.current(), false);
    },
  };
}

/** The section named in `#playground/<name>`, or null. */
function askedSection() {
  const asked = location.hash.split("/")[1];
  return SECTIONS.some((section) => section.name === asked) ? asked : null;
}

function buildTabs(models, stops) {
  const tablist = h("div", { role: "tablist", "aria-label": "Playground sections", class: "pg-tabs" });
  const panels = h("div", { class: "pg-panels" });
  const tabs = [];
  for (const section of SECTIONS) {
    const tab = h("button", {
      type: "button", role: "tab", id: `pg-tab-${section.name}`, "aria-controls": `pg-panel-${section.name}`,
      text: section.title, onclick: () => select(section.name, false),
    });
    const built = section.build(models);
    if (built.stop) stops.push(built.stop);
    const tabpanel = h("div", { role: "tabpanel", id: `pg-panel-${section.name}`, "aria-labelledby": tab.id, tabindex: "0" },
      built.element);
    tabs.push({ section, tab, tabpanel });
    tablist.append(tab);
    panels.append(tabpanel);
  }

  let open = null;
  function select(name, focus) {
    open = name;
    for (const item of tabs) {
      const chosen = item.section.name === name;
      item.tab.setAttribute("aria-selected", String(chosen));
      item.tab.tabIndex = chosen ? 0 : -1; // roving tabindex: Tab leaves the list, arrows move in it
      item.tabpanel.hidden = !chosen;
      if (chosen && focus) item.tab.focus();
    }
    history.replaceState(null, "", `#playground/${name}`);
  }

  // The ARIA tabs pattern: arrow keys, Home and End move between tabs and select them.
  tablist.addEventListener("keydown", (event) => {
    const index = tabs.findIndex((item) => item.tab === document.activeElement);
    if (index < 0) return;
    const moves = { ArrowRight: index + 1, ArrowLeft: index - 1, Home: 0, End: tabs.length - 1 };
    if (!(event.key in moves)) return;
    event.preventDefault();
    const next = (moves[event.key] + tabs.length) % tabs.length;
    select(tabs[next].section.name, true);
  });

  select(askedSection() || "chat", false);
  return { element: h("div", { class: "pg" }, tablist, panels), select, current: () => open };
}
