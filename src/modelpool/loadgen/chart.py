"""Throughput and first-token time against concurrency, as SVG (written by hand) or PNG
(Pillow, already a dependency): two panels side by side, one point per level."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from xml.sax.saxutils import escape

from modelpool.loadgen.runner import LevelRun
from modelpool.loadgen.spec import Kind

if TYPE_CHECKING:
    from PIL import Image

WIDTH, HEIGHT = 960, 400
PANEL_W, PANEL_H = 380, 280  # the plotting area of each panel
LEFT, TOP = 80, 60  # the first panel's plotting area starts here
GAP = 480  # from one panel's left edge to the next's


class ChartError(ValueError):
    """The chart cannot be written (an unknown file type)."""


@dataclass(frozen=True)
class Panel:
    title: str
    x: list[int]
    y: list[float]  # NaN where the level measured nothing

    def ceiling(self) -> float:
        finite = [v for v in self.y if not math.isnan(v)]
        return max(finite) * 1.1 if finite and max(finite) > 0 else 1.0

    def x_pixel(self, x: int, origin_x: int) -> float:
        """x on a log₂ scale of the concurrency (a sweep usually multiplies it)."""
        low, high = math.log2(min(self.x)), math.log2(max(self.x))
        if high <= low:
            return origin_x + PANEL_W / 2
        return origin_x + (math.log2(x) - low) / (high - low) * PANEL_W

    def points(self, origin_x: int) -> list[tuple[float, float]]:
        """Pixel positions of the measured levels, y linear from 0."""
        top = self.ceiling()
        return [
            (self.x_pixel(x, origin_x), TOP + PANEL_H - y / top * PANEL_H)
            for x, y in zip(self.x, self.y, strict=True)
            if not math.isnan(y)
        ]


def panels(kind: Kind, runs: list[LevelRun]) -> tuple[Panel, Panel]:
    """Generating kinds: output tokens/s and TTFT p50; speech: req/s and time to first byte;
    the others: req/s and latency p50."""
    x = [run.summary.concurrency for run in runs]
    if kind in ("chat", "completion"):
        rate = Panel("output tokens/s", x, [r.summary.output_tokens_per_s for r in runs])
    else:
        rate = Panel("requests/s", x, [r.summary.requests_per_s for r in runs])
    if kind in ("chat", "completion"):
        wait = Panel("TTFT p50 (ms)", x, [r.summary.ttft.p50 * 1000 for r in runs])
    elif kind == "speech":
        wait = Panel("time to first audio byte p50 (ms)", x, [r.summary.ttft.p50 * 1000 for r in runs])
    else:
        wait = Panel("latency p50 (ms)", x, [r.summary.latency.p50 * 1000 for r in runs])
    return rate, wait


def write_chart(path: Path, title: str, kind: Kind, runs: list[LevelRun]) -> None:
    """`.svg` or `.png`, by the file's suffix."""
    suffix = path.suffix.lower()
    if suffix not in (".svg", ".png"):
        raise ChartError(f"chart: {path.name} must end in .svg or .png")
    pair = panels(kind, runs)
    if suffix == ".svg":
        path.write_text(_svg(title, pair), encoding="utf-8")
    else:
        _png(title, pair).save(path, format="PNG")


def _label(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def _svg(title: str, pair: tuple[Panel, Panel]) -> str:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="24" text-anchor="middle" font-size="15">{escape(title)}</text>',
    ]
    for n, panel in enumerate(pair):
        ox = LEFT + n * GAP
        bottom = TOP + PANEL_H
        parts.append(f'<text x="{ox + PANEL_W / 2}" y="{TOP - 12}" text-anchor="middle">{escape(panel.title)}</text>')
        parts.append(f'<path d="M{ox},{TOP} V{bottom} H{ox + PANEL_W}" fill="none" stroke="#444"/>')
        parts.append(f'<text x="{ox - 6}" y="{TOP + 4}" text-anchor="end">{_label(panel.ceiling())}</text>')
        parts.append(f'<text x="{ox - 6}" y="{bottom + 4}" text-anchor="end">0</text>')
        points = panel.points(ox)
        for x in panel.x:
            parts.append(f'<text x="{panel.x_pixel(x, ox):.1f}" y="{bottom + 18}" text-anchor="middle">{x}</text>')
        parts.append(f'<text x="{ox + PANEL_W / 2}" y="{bottom + 36}" text-anchor="middle">concurrency</text>')
        if points:
            line = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
            parts.append(f'<polyline points="{line}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
            parts += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="#1f77b4"/>' for px, py in points]
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _png(title: str, pair: tuple[Panel, Panel]) -> Image.Image:
    from PIL import Image, ImageDraw  # only when a PNG is asked for

    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    draw.text((WIDTH / 2, 16), title, fill="black", anchor="mt")
    for n, panel in enumerate(pair):
        ox = LEFT + n * GAP
        bottom = TOP + PANEL_H
        draw.text((ox + PANEL_W / 2, TOP - 12), panel.title, fill="black", anchor="mb")
        draw.line([(ox, TOP), (ox, bottom), (ox + PANEL_W, bottom)], fill="#444444", width=1)
        draw.text((ox - 6, TOP), _label(panel.ceiling()), fill="black", anchor="rm")
        draw.text((ox - 6, bottom), "0", fill="black", anchor="rm")
        points = panel.points(ox)
        for x in panel.x:
            draw.text((panel.x_pixel(x, ox), bottom + 6), str(x), fill="black", anchor="mt")
        draw.text((ox + PANEL_W / 2, bottom + 24), "concurrency", fill="black", anchor="mt")
        if len(points) > 1:
            draw.line(points, fill="#1f77b4", width=2)
        for px, py in points:
            draw.ellipse([px - 4, py - 4, px + 4, py + 4], fill="#1f77b4")
    return image
