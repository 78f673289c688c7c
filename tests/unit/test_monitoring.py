"""The Grafana dashboard and the alert rules in manifests/monitoring parse, and name only gpuslice
metrics in ways Prometheus can serve (the cluster tier checks that the processes serve them)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import yaml

from tests.hacktools import hack_tool
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


RUNBOOKS = MONITORING.parents[1] / "docs" / "runbooks.md"
RULE_TESTS = Path(__file__).resolve().parent / "monitoring" / "alerts.test.yaml"


def alerts() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"]
            for rule in group["rules"]]


def test_every_alert_links_its_section_of_the_runbooks() -> None:
    source = tomllib.loads((MONITORING.parents[1] / "pyproject.toml").read_text())["project"]["urls"]["Source"]
    sections = re.findall(r"^## (\S+)$", RUNBOOKS.read_text(), re.MULTILINE)
    names = [rule["alert"] for rule in alerts()]
    for rule in alerts():
        assert rule["annotations"].get("runbook_url") == \
            f"{source}/blob/main/docs/runbooks.md#{rule['alert'].lower()}", f"{rule['alert']}: its runbook_url"
        assert rule["alert"] in sections, f"docs/runbooks.md has no section `## {rule['alert']}`"
    assert sorted(sections) == sorted(names), f"docs/runbooks.md has sections for no alert: {set(sections) - set(names)}"


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_stays_quiet() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in cases:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert names - firing == set(), f"no case where these fire: {sorted(names - firing)}"
    assert names - quiet == set(), f"no case where these stay quiet: {sorted(names - quiet)}"


def test_promtool_checks_the_rules_and_runs_their_tests() -> None:
    promtool = hack_tool("promtool")
    checked = subprocess.run([promtool, "check", "rules", str(MONITORING / "alerts.yaml")], capture_output=True,
                             text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                            check=False)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout + tested.stderr
