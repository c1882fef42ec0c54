"""docs/grafana-dashboard.json stays true to what /metrics exports: every metric and label
its queries name exists (names as Prometheus sees them: `_total` counters, histogram
`_bucket`/`_sum`/`_count`), counters are read only through rate()/increase() and quantiles
from buckets summed `by (le, ...)`, every exported metric has a panel, and it imports
cleanly (one `${DS_PROMETHEUS}` datasource input)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from modelpool.runtime.metrics.prometheus import Metrics

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
VARIABLES = DASHBOARD["templating"]["list"]
QUERY_VARIABLES = [v for v in VARIABLES if v["type"] != "datasource"]
VARIABLE_QUERIES = [(v["name"], v["query"]["query"]) for v in QUERY_VARIABLES]


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
    for variable in QUERY_VARIABLES:
        assert variable["datasource"] == DATASOURCE, variable["name"]


def test_a_provisioned_copy_finds_its_prometheus() -> None:
    """Grafana's file provisioning (compose.yaml's monitoring profile) leaves `${DS_PROMETHEUS}`
    as it is: a datasource variable of that name, first so the query variables can use it,
    resolves it to the Prometheus there."""
    first = VARIABLES[0]
    assert (first["name"], first["type"], first["query"]) == ("DS_PROMETHEUS", "datasource", "prometheus")
    assert [v for v in VARIABLES if v["type"] == "datasource"] == [first]


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    placed = list(panels())
    assert len({p["id"] for p in placed}) == len(placed)
    cells = [(x, y) for p in placed for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
             for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])]  # fmt: skip
    assert len(cells) == len(set(cells)), "two panels share a grid cell"
    assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in placed)


_COUNTER_SERIES = re.compile(
    r"\b([a-zA-Z_:][a-zA-Z0-9_:]*(?:_total|_bucket|_sum|_count))\b(?!\s*\()(\s*\{[^}]*\})?(\s*\[)?"
)


def misused_counters(expr: str) -> list[str]:
    """Counter series (`_total`, a histogram's `_bucket`, `_sum`, `_count`) that an
    expression reads other than as `rate(...[range])` or `increase(...[range])`: a raw
    counter is a total since the server started, which resets with it."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    misused = []
    for found in _COUNTER_SERIES.finditer(text):
        inside = re.search(r"\b(?:rate|increase)\s*\(\s*$", text[: found.start()])
        if not (inside and found.group(3)):
            misused.append(found.group(1))
    return misused


def unaggregated_quantiles(expr: str) -> list[str]:
    """Each `histogram_quantile(...)` whose buckets are not summed `by (le, ...)`: without
    `le` kept the quantile has no buckets to read; without an aggregation each replica and
    label set gets its own."""
    bad = []
    for found in re.finditer(r"histogram_quantile\s*\(\s*[^,]+,\s*", expr):
        rest = expr[found.end() :]
        grouped = re.match(r"(?:sum|max|min|avg)\s+by\s*\(([^)]*)\)", rest)
        if grouped is None or "le" not in {label.strip() for label in grouped.group(1).split(",")}:
            bad.append(rest[:60])
    return bad


def test_the_counter_and_quantile_checks_catch_what_they_should() -> None:
    assert misused_counters('sum(rate(a_total{x="y"}[5m])) / sum(increase(b_bucket[1h]))') == []
    assert misused_counters('sum(a_total{x="y"})') == ["a_total"]
    assert misused_counters("rate(a_seconds_sum) + a_count") == ["a_seconds_sum", "a_count"]
    assert misused_counters('max by (model) (a_state{x="1"}) + sum(rate(a_total[5m]))') == []
    assert unaggregated_quantiles("histogram_quantile(0.5, sum by (le, route) (rate(a_bucket[5m])))") == []
    assert unaggregated_quantiles("histogram_quantile(0.5, sum by (route, le) (rate(a_bucket[5m])))") == []
    assert len(unaggregated_quantiles("histogram_quantile(0.5, rate(a_bucket[5m]))")) == 1
    assert len(unaggregated_quantiles("histogram_quantile(0.9, sum by (model) (rate(a_bucket[5m])))")) == 1
    assert len(unaggregated_quantiles("histogram_quantile(0.9, sum by (model, left) (rate(a_bucket[5m])))")) == 1


@pytest.mark.parametrize(("title", "expr"), QUERIES, ids=[t for t, _ in QUERIES])
def test_counters_are_read_as_rates_and_quantiles_keep_their_buckets(title: str, expr: str) -> None:
    assert misused_counters(expr) == [], f"'{title}' reads a counter outside rate()/increase(): {expr}"
    assert unaggregated_quantiles(expr) == [], f"'{title}' has a histogram_quantile not summed by (le, ...): {expr}"
