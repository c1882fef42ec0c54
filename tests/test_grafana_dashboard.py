"""docs/grafana-dashboard.json stays true to what /metrics exports: every metric and label
its queries name exists (names as Prometheus sees them: `_total` counters, histogram
`_bucket`/`_sum`/`_count`), every exported metric has a panel, and it imports cleanly
(one `${DS_PROMETHEUS}` datasource input)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from modelpool.runtime.metrics import Metrics

DASHBOARD = json.loads((Path(__file__).resolve().parents[1] / "docs" / "grafana-dashboard.json").read_text())
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
_SUFFIXES: dict[type[MetricWrapperBase], tuple[str, ...]] = {
    Counter: ("_total",),
    Gauge: ("",),
    Histogram: ("_bucket", "_sum", "_count"),
}


def exported() -> dict[str, tuple[str, frozenset[str]]]:
    """Sample name → (its metric's name, its label names), for every metric of a fresh pool."""
    names = {}
    for metric in vars(Metrics()).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        family = metric._name  # prometheus_client keeps no public name or label list on the metric
        labels = frozenset(metric._labelnames)
        for suffix in _SUFFIXES[type(metric)]:
            names[family + suffix] = (family, labels | {"le"} if suffix == "_bucket" else labels)
    return names


EXPORTED = exported()


def panels() -> Iterator[dict[str, Any]]:
    for panel in DASHBOARD["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


QUERIES = [(p["title"], t["expr"]) for p in panels() for t in p.get("targets", [])]
VARIABLE_QUERIES = [(v["name"], v["query"]["query"]) for v in DASHBOARD["templating"]["list"]]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left once strings, label
    matchers, ranges, groupings, function calls and operators are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    words = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(?!\s*\()", text))
    return words - {"and", "or", "unless", "bool", "offset"}


def selected_labels(expr: str) -> Iterator[tuple[str, str]]:
    """(metric, label) for each label a selector matches on."""
    for metric, matchers in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr):
        for label in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers):
            yield metric, label


def grouping_labels(expr: str) -> set[str]:
    groups = re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
    return {label.strip() for group in groups for label in group.split(",") if label.strip()}


def test_the_lexer_finds_names_and_only_names() -> None:
    expr = 'histogram_quantile(0.99, sum by (le, route) (rate(a_bucket{model=~"$m"}[$__rate_interval]))) / b or c'
    assert metric_names(expr) == {"a_bucket", "b", "c"}
    assert metric_names('sum(rate(made_up_total{x="rate(y)"}[5m]))') == {"made_up_total"}


@pytest.mark.parametrize(("title", "expr"), QUERIES + VARIABLE_QUERIES, ids=[t for t, _ in QUERIES + VARIABLE_QUERIES])
def test_every_query_names_only_metrics_and_labels_the_server_exports(title: str, expr: str) -> None:
    names = metric_names(expr)
    if expr.startswith("label_values("):
        names = set(re.findall(r"^label_values\((\w+)", expr))  # a variable's values: (metric, label)
    assert names, f"'{title}' selects no metric: {expr}"
    assert names <= EXPORTED.keys(), f"'{title}' names metrics /metrics does not export: {names - EXPORTED.keys()}"
    for metric, label in selected_labels(expr):
        assert label in EXPORTED[metric][1], f"'{title}': {metric} has no label '{label}'"
    known = set().union(*(EXPORTED[name][1] for name in names))
    unknown = grouping_labels(expr) - known
    assert not unknown, f"'{title}' groups by labels its metrics lack: {unknown}"


def test_every_exported_metric_has_a_panel() -> None:
    shown = {EXPORTED[name][0] for _, expr in QUERIES for name in metric_names(expr) if name in EXPORTED}
    families = {family for family, _ in EXPORTED.values()}
    assert families - shown == set(), "add a panel to docs/grafana-dashboard.json for these metrics"


def test_it_imports_with_one_prometheus_datasource_input() -> None:
    [given] = DASHBOARD["__inputs"]
    assert (given["name"], given["type"], given["pluginId"]) == ("DS_PROMETHEUS", "datasource", "prometheus")
    for panel in panels():
        assert panel.get("datasource", DATASOURCE) == DATASOURCE, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"] == DATASOURCE, panel["title"]
    for variable in DASHBOARD["templating"]["list"]:
        assert variable["datasource"] == DATASOURCE, variable["name"]


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    placed = list(panels())
    assert len({p["id"] for p in placed}) == len(placed)
    cells = [(x, y) for p in placed for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
             for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])]  # fmt: skip
    assert len(cells) == len(set(cells)), "two panels share a grid cell"
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in placed)
