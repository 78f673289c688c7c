"""The PromQL of the Grafana dashboard and the alert rules in manifests/monitoring: every expression,
and the metrics and labels each one matches on."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import yaml

MONITORING = Path(__file__).resolve().parents[1] / "manifests" / "monitoring"


# Grafana's variables, as Prometheus would see them once Grafana has put in their values.
GRAFANA = {"$__rate_interval": "5m", "$__interval": "1m", "$policy": ".*", "${policy}": ".*"}


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every rule."""
    found = []
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets") or []:
            found.append((f"dashboard panel {panel['title']!r}", target["expr"]))
    for variable in dashboard["templating"]["list"]:
        if variable.get("type") == "query":
            query = variable["query"]["query"]
            metric = re.match(r"label_values\((\w+),", query)
            assert metric, f"variable {variable['name']}: {query}"
            found.append((f"dashboard variable {variable['name']}", metric.group(1)))
    for group in yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"]:
        for rule in group["rules"]:
            found.append((f"alert {rule['alert']}", rule["expr"]))
    return found


def _nodes(expr: Any) -> Iterator[Any]:
    yield expr
    for attribute in ("expr", "lhs", "rhs", "param", "vector_selector"):
        child = getattr(expr, attribute, None)
        if child is not None and not isinstance(child, str | int | float):
            yield from _nodes(child)
    for arg in getattr(expr, "args", None) or []:
        yield from _nodes(arg)


def selectors(promql: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names it is matched on) of every vector selector."""
    for variable, value in GRAFANA.items():
        promql = promql.replace(variable, value)
    found = []
    for node in _nodes(promql_parser.parse(promql)):
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            found.append((node.name, {m.name for m in node.matchers.matchers if m.name != "__name__"}))
    return found
