"""The Grafana dashboard and the alert rules in manifests/monitoring parse, and name only gpuslice
metrics in ways Prometheus can serve (the cluster tier checks that the processes serve them)."""

from __future__ import annotations

import yaml

from tests.monitoring_queries import MONITORING, expressions, selectors


def test_every_expression_parses_and_names_gpuslice_metrics() -> None:
    refs = expressions()
    assert len(refs) > 20
    for where, promql in refs:
        names = [name for name, _ in selectors(promql)]
        assert names, f"{where}: no metric in {promql}"
        assert all(n.startswith("gpuslice_") for n in names), f"{where}: {names}"


def test_alerts_say_what_to_do() -> None:
    for group in yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]
            assert rule["annotations"]["description"], rule["alert"]
