"""What `make manifests` renders is committed as it renders now: manifests/base/static.yaml, the
monitoring component's PrometheusRule and dashboard, install.yaml, and the Helm chart (templates,
values, values.schema.json, crds/, ci/kind-values.yaml), all from the kustomize install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.hacktools import hack_tool

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kustomize() -> str:
    return hack_tool("kustomize")


def test_static_manifests_are_fresh() -> None:
    checked = subprocess.run([sys.executable, str(REPO / "hack/manifests.py"), "--check"],
                             capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr


def test_install_yaml_and_the_chart_are_what_the_kustomize_install_renders(kustomize: str) -> None:
    checked = subprocess.run([sys.executable, str(REPO / "hack/manifests.py"), "--check", "--kustomize", kustomize],
                             capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr


def test_every_manifest_file_is_in_the_kustomize_base() -> None:
    static = (REPO / "manifests/base/static.yaml").read_text()
    for path in sorted((REPO / "manifests").glob("*.yaml")):
        assert f"# manifests/{path.name}\n" in static, f"manifests/{path.name} is not in the base: run `make manifests`"


def test_no_networkpolicy_of_the_component_opens_a_port_to_every_address() -> None:
    """Every ingress rule names who may come in: the webhook's HTTPS port only the API server's
    addresses (a placeholder no API server has, until the install fills it in), not every pod."""
    path = REPO / "manifests/components/networkpolicy/networkpolicy.yaml"
    policies = {d["metadata"]["name"]: d for d in yaml.safe_load_all(path.read_text()) if d}
    for name, policy in policies.items():
        for rule in policy["spec"]["ingress"]:
            assert rule.get("from"), f"NetworkPolicy {name} admits {rule.get('ports')} from every address"
    [https] = [r for r in policies["gpuslice-webhook"]["spec"]["ingress"] if {"port": "https", "protocol": "TCP"}
               in r["ports"]]
    assert https["from"] == [{"ipBlock": {"cidr": "192.0.2.1/32"}}]
