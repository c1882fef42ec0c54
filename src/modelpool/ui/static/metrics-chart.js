// A small SVG line chart (no library: the page loads nothing from elsewhere): a time axis,
// a value axis with units, one line per series, gaps where a series has no value. The
// latest values are written next to the chart and are its accessible name.
import { h } from "./lib.js";

const SVG = "http://www.w3.org/2000/svg";
const HEIGHT = 190;
const MARGIN = { top: 22, right: 14, bottom: 24, left: 64 };

function svg(tag, attributes = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  if (text !== null) node.textContent = text;
  return node;
}

/**
 * A "nice" top for the value axis (1, 2, 2.5 or 5 × 10^n) and its tick step, about 4 ticks.
 * `base` 1024 makes the steps nice in the binary unit the values are written in (MiB, GiB);
 * `integer` keeps steps whole (counts of requests).
 */
export function niceScale(maximum, { base = 1, integer = false } = {}) {
  if (!(maximum > 0)) return { top: integer ? 4 : 1, step: integer ? 1 : 0.25 };
  const unit = base > 1 ? base ** Math.max(0, Math.floor(Math.log(maximum) / Math.log(base))) : 1;
  const rough = maximum / unit / 4;
  const power = 10 ** Math.floor(Math.log10(rough));
  let step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => s >= rough);
  if (integer) step = Math.max(1, Math.ceil(step));
  step *= unit;
  return { top: Math.ceil(maximum / step) * step, step };
}

function timeStep(rangeS) {
  return [15, 30, 60, 120, 180, 300, 600].find((step) => rangeS / step <= 6) || 900;
}

/** A time axis label: hours and minutes, and seconds when the ticks are under a minute apart. */
function clock(t, step) {
  const parts = step < 60 ? { hour: "2-digit", minute: "2-digit", second: "2-digit" } : { hour: "2-digit", minute: "2-digit" };
  return new Date(t * 1000).toLocaleTimeString([], parts);
}

/** Polyline segments of one series: a gap where the value is null or samples are missing. */
function segments(points, key, maxGapS) {
  const runs = [];
  let run = [];
  let last = null;
  for (const point of points) {
    const value = point[key];
    const broken = value === null || value === undefined || (last !== null && point.t - last > maxGapS);
    if (broken && run.length) {
      runs.push(run);
      run = [];
    }
    if (value !== null && value !== undefined) run.push([point.t, value]);
    last = point.t;
  }
  if (run.length) runs.push(run);
  return runs;
}

/**
 * A chart panel. `series`: [{key, label}] (drawn in order, the first solid, the rest dashed),
 * `format(value)` writes a value with its unit, `axis` names the unit on the value axis,
 * `describe(point)` writes the latest values; `base` and `integer` go to niceScale. Call
 * update(points, rangeS, intervalS).
 */
export function lineChart({ id, title, axis, series, format, describe, base = 1, integer = false }) {
  const latest = h("p", { class: "latest", id: `${id}-latest`, text: "–" });
  const picture = svg("svg", { role: "img", class: "chart", height: HEIGHT, "aria-label": `${title}: no data yet` });
  const legend = h("ul", { class: "legend", "aria-hidden": "true" },
    ...series.map((s, i) => h("li", {}, h("span", { class: `swatch series-${i}` }), s.label)));
  const element = h("section", { id, class: "panel chart-panel", "aria-labelledby": `${id}-title` },
    h("div", { class: "chart-head" }, h("h2", { id: `${id}-title`, text: title }), latest),
    picture, legend);
  let last = { points: [], rangeS: 300, intervalS: 2 };

  function draw() {
    const { points, rangeS, intervalS } = last;
    const width = Math.max(280, picture.clientWidth || picture.parentElement?.clientWidth || 600);
    picture.setAttribute("viewBox", `0 0 ${width} ${HEIGHT}`);
    picture.replaceChildren();
    const plotW = width - MARGIN.left - MARGIN.right;
    const plotH = HEIGHT - MARGIN.top - MARGIN.bottom;
    const end = points.length ? points[points.length - 1].t : Date.now() / 1000;
    const start = end - rangeS;
    const shown = points.filter((p) => p.t >= start);
    const values = shown.flatMap((p) => series.map((s) => p[s.key])).filter((v) => typeof v === "number");
    const { top, step } = niceScale(Math.max(0, ...values), { base, integer });
    const x = (t) => MARGIN.left + ((t - start) / rangeS) * plotW;
    const y = (v) => MARGIN.top + plotH - (v / top) * plotH;

    const grid = svg("g", { class: "grid" });
    for (let i = 0; i * step <= top + step / 2; i += 1) {
      const v = i * step; // multiplied, not summed: no drift like 0.30000000000000004
      grid.append(svg("line", { x1: MARGIN.left, x2: width - MARGIN.right, y1: y(v), y2: y(v) }));
      grid.append(svg("text", { x: MARGIN.left - 6, y: y(v) + 4, "text-anchor": "end", class: "tick" }, format(v)));
    }
    const tStep = timeStep(rangeS);
    for (let t = Math.ceil(start / tStep) * tStep; t <= end; t += tStep) {
      grid.append(svg("line", { x1: x(t), x2: x(t), y1: MARGIN.top, y2: MARGIN.top + plotH, class: "vertical" }));
      grid.append(svg("text", { x: x(t), y: HEIGHT - 6, "text-anchor": "middle", class: "tick" }, clock(t, tStep)));
    }
    grid.append(svg("text", { x: 4, y: 11, class: "axis-title" }, axis));
    grid.append(svg("line", { x1: MARGIN.left, x2: MARGIN.left, y1: MARGIN.top, y2: MARGIN.top + plotH, class: "axis" }));
    grid.append(svg("line", { x1: MARGIN.left, x2: width - MARGIN.right, y1: y(0), y2: y(0), class: "axis" }));
    picture.append(grid);

    series.forEach((s, i) => {
      for (const run of segments(shown, s.key, intervalS * 2.5)) {
        const path = run.map(([t, v], j) => `${j ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`).join("");
        picture.append(svg("path", { d: path, class: `line series-${i}` }));
        if (run.length === 1) { // a lone sample between gaps: a dot, or it would not show
          picture.append(svg("circle", { cx: x(run[0][0]), cy: y(run[0][1]), r: 2.5, class: `dot series-${i}` }));
        }
      }
    });
    if (!shown.length) {
      const middle = { x: MARGIN.left + plotW / 2, y: MARGIN.top + plotH / 2, "text-anchor": "middle", class: "empty" };
      picture.append(svg("text", middle, `Waiting for the first sample (every ${intervalS} s)…`));
    }
  }

  function update(points, rangeS, intervalS) {
    last = { points, rangeS, intervalS };
    const point = points[points.length - 1];
    const text = point ? describe(point) : "no data yet";
    latest.textContent = text;
    picture.setAttribute("aria-label", `${title}, last ${Math.round(rangeS / 60)} minutes. Latest: ${text}`);
    draw();
  }

  return { element, update, redraw: draw };
}
