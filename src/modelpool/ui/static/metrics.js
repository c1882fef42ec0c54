// The metrics page: the server's own metrics over the last minutes, from /metrics/history
// (a point every 2 s, sampled by the server from its Prometheus registry and the pool's
// statuses). The page keeps its copy and asks only for points newer than its last one.
import { api, field, formatBytes, formatDuration, h, poll } from "./lib.js";
import { lineChart } from "./metrics-chart.js";

const POLL_MS = 2000;
const KEEP_S = 15 * 60;
const RANGES = [[60, "1 minute"], [300, "5 minutes"], [900, "15 minutes"]];

function rate(value) {
  if (value === 0) return "0";
  return value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2);
}

/** A latency ("350 ms", "2.35 s"); the axis's zero is a plain "0". */
function seconds(value) {
  return value === 0 ? "0" : formatDuration(value, { precise: true });
}

function count(value) {
  return Number.isInteger(value) ? String(value) : value.toFixed(1);
}

const CHARTS = [
  {
    id: "chart-requests", title: "Request rate", axis: "requests / s", format: rate,
    series: [
      { key: "requests_per_s", label: "requests / s" },
      { key: "errors_per_s", label: "errors / s (status ≥ 400)" },
    ],
    describe: (p) => `${rate(p.requests_per_s)} requests/s, ${rate(p.errors_per_s)} errors/s`,
  },
  {
    id: "chart-latency", title: "Latency", axis: "seconds", format: seconds,
    series: [{ key: "latency_p50_s", label: "p50" }, { key: "latency_p99_s", label: "p99" }],
    describe: (p) => (p.latency_p50_s === null ? "no request finished in the last interval"
      : `p50 ${seconds(p.latency_p50_s)}, p99 ${seconds(p.latency_p99_s)}`),
  },
  {
    id: "chart-tokens", title: "Tokens per second", axis: "tokens / s", format: rate,
    series: [
      { key: "input_tokens_per_s", label: "input tokens / s" },
      { key: "output_tokens_per_s", label: "output tokens / s" },
    ],
    describe: (p) => `${rate(p.input_tokens_per_s)} in/s, ${rate(p.output_tokens_per_s)} out/s`,
  },
  {
    id: "chart-queue", title: "Queue depth and in flight", axis: "requests", format: count, integer: true,
    series: [{ key: "queued", label: "queued" }, { key: "in_flight", label: "in flight" }],
    describe: (p) => `${p.queued} queued, ${p.in_flight} in flight`,
  },
  {
    // The models' measured shares and the runtimes are parts of the process's RSS (they add
    // up: docs/memory.md); "counted" is what the budget holds for models (estimates while loading).
    id: "chart-memory", title: "Memory", axis: "bytes", format: formatBytes, base: 1024,
    series: [
      { key: "process_rss_bytes", label: "modelpool's RSS" },
      { key: "runtimes_bytes", label: "runtimes (torch, onnxruntime, …), once each" },
      { key: "memory_measured_bytes", label: "models, measured" },
      { key: "memory_counted_bytes", label: "models, counted by the budget" },
    ],
    describe: (p) => `RSS ${formatBytes(p.process_rss_bytes)}: runtimes ${formatBytes(p.runtimes_bytes)}, `
      + `${p.loaded_models} models ${formatBytes(p.memory_measured_bytes)} measured `
      + `(${formatBytes(p.memory_counted_bytes)} counted by the budget)`,
  },
];

export function mount(root) {
  let stopped = false;
  let points = [];
  let intervalS = 2;
  const rangeSelect = h("select", {}, ...RANGES.map(([value, label]) => h("option", { value, text: label })));
  rangeSelect.value = "300";
  const status = h("p", { class: "muted summary", text: "Reading the server's metrics…" });
  const charts = CHARTS.map((spec) => lineChart(spec));
  root.append(
    h("div", { class: "page-head metrics-head" },
      h("h1", { text: "Metrics" }), status, h("div", { class: "range" }, field("Time range", rangeSelect))),
    h("p", { class: "muted intro" },
      "Requests that name a model (inference routes; the admin API and polling are left out), ",
      "sampled by the server every 2 s. ",
      "Latency is measured from request received to response finished. Raw counters: ",
      h("a", { href: "/metrics", text: "/metrics" }), "."),
    h("div", { class: "charts" }, ...charts.map((chart) => chart.element)));

  const render = () => {
    const range = Number(rangeSelect.value);
    for (const chart of charts) chart.update(points, range, intervalS);
  };
  rangeSelect.addEventListener("change", render);

  async function refresh() {
    const since = points.length ? `?since=${points[points.length - 1].t}` : "";
    const history = await api(`/metrics/history${since}`);
    if (stopped) return;
    intervalS = history.interval_s;
    points = points.concat(history.points);
    const newest = points.length ? points[points.length - 1].t : 0;
    points = points.filter((point) => point.t > newest - KEEP_S);
    status.textContent = points.length
      ? `${points.length} samples · last at ${new Date(newest * 1000).toLocaleTimeString()}`
      : "Waiting for the first sample…";
    render();
  }

  const poller = poll(refresh, POLL_MS, { describe: (error) => `Could not read the metrics: ${error.message}` });
  // Charts are drawn at their pixel width (crisp text): draw again when it changes.
  const resized = new ResizeObserver(() => charts.forEach((chart) => chart.redraw()));
  for (const chart of charts) resized.observe(chart.element);
  return () => {
    stopped = true;
    poller.stop();
    resized.disconnect();
  };
}
