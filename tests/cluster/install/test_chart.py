"""The Helm chart installs what kustomize installs: ``helm template`` with the default values is the
nvidia overlay, with ci/kind-values.yaml the kind overlay, and with the monitoring, NetworkPolicy
and webhook client authentication values on, the nvidia overlay with those components, with
webhook.certManager.enabled the cert-manager overlay, object for object (less the Namespace, which
is the release's, the pre-delete hook, which only the chart has, and Helm's standard labels and the
CRDs' keep policy, which only the chart adds). Everything the chart can
render, the Prometheus Operator's kinds included (their CRDs installed from its Go module), passes a
server-side dry-run against the real apiserver; a value the chart does not know is refused."""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.install.render import path_of, refused_by_dry_run, render
from tests.cluster.kubeutil import wait_for
from tests.hacktools import hack_tool

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts/gpuslice"
EVERYTHING_ON = ["--set", "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,"
                 "metrics.dashboard.enabled=true,networkPolicy.enabled=true,"
                 "webhook.clientAuth.caConfigMap=gpuslice-webhook-client-ca"]
COMPONENTS = ("monitoring", "networkpolicy", "webhook-client-auth")


@pytest.fixture(scope="module")
def helm() -> str:
    return hack_tool("helm")


def template(helm: str, *args: str) -> list[dict[str, Any]]:
    done = subprocess.run([helm, "template", "gpuslice", str(CHART), "--namespace", "gpuslice-system",
                           "--include-crds", *args], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"helm template {' '.join(args)} failed:\n{done.stderr}"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


# What only the chart puts on its objects: Helm's standard labels, and the CRDs' keep policy.
CHART_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
                "app.kubernetes.io/version")


def without_chart_metadata(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` less what only the chart adds, after checking that the chart did add it."""
    doc = copy.deepcopy(doc)
    metas = [doc["metadata"]]
    if doc["kind"] in ("Deployment", "DaemonSet"):
        metas.append(doc["spec"]["template"]["metadata"])
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    added = dict(zip(CHART_LABELS, (f"gpuslice-{chart['version']}", "Helm", "gpuslice", chart["appVersion"]),
                     strict=True))
    for meta in metas:
        labels = meta["labels"]
        assert all(label in labels for label in CHART_LABELS), f"{doc['kind']} {doc['metadata']['name']}: {labels}"
        # An object's own label wins (the admission policies are app.kubernetes.io/managed-by: gpuslice).
        meta["labels"] = {k: v for k, v in labels.items() if added.get(k) != v}
        if not meta["labels"]:
            del meta["labels"]  # an object of the overlay's own with no labels (cert-manager's)
    if doc["kind"] == "CustomResourceDefinition":
        annotations = doc["metadata"]["annotations"]
        assert annotations.pop("helm.sh/resource-policy") == "keep", "helm uninstall must never delete the CRDs"
        if not annotations:
            del doc["metadata"]["annotations"]
    return doc


def by_object(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    return {(d["apiVersion"], d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
            for d in objects}


def with_components(kustomize: str, *components: str) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(dir=REPO, prefix=".test-") as work:
        (Path(work) / "kustomization.yaml").write_text(yaml.safe_dump({
            "resources": [os.path.relpath(REPO / "manifests/overlays/nvidia", work)],
            "components": [os.path.relpath(REPO / "manifests/components" / c, work) for c in components]}))
        return render(kustomize, str(Path(work).relative_to(REPO)))


@pytest.mark.parametrize("case", ["nvidia", "kind", "components", "cert-manager"])
def test_the_chart_renders_what_kustomize_installs(helm: str, kustomize: str, case: str) -> None:
    if case == "nvidia":
        wanted, chart = render(kustomize, "manifests/overlays/nvidia"), template(helm)
    elif case == "cert-manager":
        wanted = render(kustomize, "manifests/overlays/cert-manager")
        chart = template(helm, "--set", "webhook.certManager.enabled=true")
    elif case == "kind":
        wanted = render(kustomize, "manifests/overlays/kind")
        chart = template(helm, "-f", str(CHART / "ci/kind-values.yaml"))
    else:
        wanted, chart = with_components(kustomize, *COMPONENTS), template(helm, *EVERYTHING_ON)
    kustomized = by_object([d for d in wanted if d["kind"] != "Namespace"])
    helmed = by_object([without_chart_metadata(d) for d in chart
                        if "helm.sh/hook" not in d["metadata"].get("annotations", {})])
    assert sorted(helmed) == sorted(kustomized), "the chart and kustomize install different objects"
    differ = [key for key in kustomized if helmed[key] != kustomized[key]]
    assert differ == [], f"{case}: the chart renders these differently from kustomize: {differ}"


def test_helm_lint_passes_and_a_value_the_chart_does_not_know_is_refused(helm: str) -> None:
    for values in ([], ["-f", str(CHART / "ci/kind-values.yaml")]):
        linted = subprocess.run([helm, "lint", "--strict", "--namespace", "gpuslice-system", str(CHART), *values],
                                capture_output=True, text=True, check=False)
        assert linted.returncode == 0, linted.stdout + linted.stderr
    typo = subprocess.run([helm, "template", "gpuslice", str(CHART), "-n", "gpuslice-system", "--set",
                           "agent.nodeSelectors.x=y"], capture_output=True, text=True, check=False)
    assert typo.returncode != 0
    assert "additional properties 'nodeSelectors' not allowed" in typo.stderr, typo.stderr
    elsewhere = subprocess.run([helm, "template", "gpuslice", str(CHART), "-n", "gpu-ops"], capture_output=True,
                               text=True, check=False)
    assert elsewhere.returncode == 0, elsewhere.stderr  # any namespace (docs/install.md, "Another namespace")
    assert "namespace: gpu-ops" in elsewhere.stdout
    bad = subprocess.run([helm, "template", "gpuslice", str(CHART), "-n", "gpu-ops", "--set", "namespaceOverride=Bad_Name"],
                         capture_output=True, text=True, check=False)
    assert bad.returncode != 0, "namespaceOverride must be a namespace's name"


def crds_of(directory: str) -> list[dict[str, Any]]:
    return [yaml.safe_load(path.read_text()) for path in sorted(Path(directory).glob("*.yaml"))]


@pytest.fixture(scope="module")
async def monitoring_crds(kube: KubeClient) -> AsyncIterator[list[str]]:
    """The Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule CRDs, from its module."""
    names = []
    for crd in crds_of(hack_tool("monitoring-crds")):
        await kube.apply(path_of(crd), crd, field_manager="gpuslice-tests")
        names.append(crd["metadata"]["name"])

    async def established() -> bool:
        for name in names:
            crd = await kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            if not any(c["type"] == "Established" and c["status"] == "True"
                       for c in (crd.get("status") or {}).get("conditions") or []):  # null while new
                return False
        return True

    await wait_for(established, within=60, what="the Prometheus Operator's CRDs to be served")
    yield names
    for name in names:
        with contextlib.suppress(KubeError):
            await kube.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")


async def test_everything_the_chart_renders_passes_a_server_side_dry_run(
    kube: KubeClient, helm: str, monitoring_crds: list[str],
) -> None:
    objects = template(helm, *EVERYTHING_ON, "--set", "nvidiaDriverRoot=/run/nvidia/driver",
                       "--set", "metrics.serviceMonitor.labels.release=kube-prometheus-stack",
                       "--set-json", 'networkPolicy.apiServer.to=[{"ipBlock": {"cidr": "10.96.0.1/32"}}]')
    kinds = {d["kind"] for d in objects}
    assert {"ServiceMonitor", "PrometheusRule", "Service", "NetworkPolicy", "PodDisruptionBudget", "Job"} <= kinds
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuslice-system"}}
    await kube.apply(path_of(namespace), namespace, field_manager="gpuslice-install-check")
    # A pod (helm test's) is admitted only with its ServiceAccount there, which a dry run creates not.
    for account in (d for d in objects if d["kind"] == "ServiceAccount"):
        await kube.apply(path_of(account), account, field_manager="gpuslice-install-check")
    failures = await refused_by_dry_run(kube, objects)
    assert not failures, "the apiserver refused:\n" + "\n".join(failures)
    # The operator's schema judges our objects: a ServiceMonitor without its endpoints' port is refused.
    [monitor] = [d for d in objects if d["kind"] == "ServiceMonitor" and d["metadata"]["name"] == "gpuslice-agent"]
    broken = {**monitor, "spec": {**monitor["spec"], "endpoints": [{"interval": "not a duration"}]}}
    [refusal] = await refused_by_dry_run(kube, [broken])
    assert ": 422 Invalid: " in refusal, refusal
