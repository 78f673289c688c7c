"""The Helm chart on kind, once the kustomize install is gone (tests/kind/conftest.py runs this file
last): `helm install` as docs/install.md says (the kind values, every monitoring object and the
NetworkPolicies on, against the Prometheus Operator's CRDs), a tenant pod prepared by the chart's
agent, `helm upgrade` under it (the CRD first), `helm uninstall` refused while the pod holds its
slice (the pre-delete hook names its claim), then done, leaving nothing of gpuslice behind.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from typing import Any

import pytest
import yaml

from tests.kind.checks import (
    claim_of,
    environment,
    gpuslice_pods,
    leftovers,
    load_upgrade_image,
    nothing_left_on_the_nodes,
    ready,
    restart_apiserver,
    restarts,
    results,
)
from tests.kind.kindutil import REPO, TIMINGS, Kind

CHART = REPO / "charts/gpuslice"
RELEASE = ["gpuslice", "--namespace", "gpuslice-system"]
ON = ("metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,metrics.dashboard.enabled=true,"
      "networkPolicy.enabled=true")


def helm(kind: Kind, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = [kind.build["helm"], *args]
    print(f"\n>>> {shlex.join(command)}", flush=True)
    started = time.monotonic()
    done = subprocess.run(command, env=kind.env, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    TIMINGS[f"helm {args[0]}"] = TIMINGS.get(f"helm {args[0]}", 0) + time.monotonic() - started
    if check and done.returncode != 0:
        raise AssertionError(f"helm {args[0]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def tenant_pod() -> dict[str, Any]:
    pod: dict[str, Any] = next(yaml.safe_load_all((REPO / "examples/tenants/pods.yaml").read_text()))
    assert pod["metadata"]["name"] == "inference", "examples/tenants/pods.yaml's first pod is the inference tenant"
    return pod


@pytest.fixture(scope="module")
def installed(deployed: Kind) -> Kind:
    # What test_install's uninstall did, again in case it stopped part way (it is idempotent).
    deployed.make("kind-undeploy")
    # docs/install.md, "Installing again": the uninstall removed the last admission policy with a
    # ConfigMap parameter (gpuslice-drain), and a kube-apiserver then keeps a frozen copy of the
    # drain list until it restarts (kubernetes/kubernetes#130887): claims for the devices drained at
    # the uninstall would be refused for good, and new drains never proven.
    restart_apiserver(deployed)
    deployed.kubectl("create", "namespace", "gpuslice-system")
    deployed.kubectl("label", "namespace", "gpuslice-system", "pod-security.kubernetes.io/enforce=privileged",
                     "gpuslice.dev/tenancy=judged")
    deployed.kubectl("apply", "--server-side", "-f", deployed.build["monitoringCrds"])
    helm(deployed, "install", *RELEASE, str(CHART), "-f", str(CHART / "ci/kind-values.yaml"), "--set", ON,
         "--wait", "--timeout", "5m")
    return deployed


def test_helm_install_runs_gpuslice_and_a_tenant_pod_gets_its_slice(installed: Kind) -> None:
    kind = installed
    assert "deployed" in helm(kind, "status", *RELEASE).stdout
    # Helm's --wait takes a Deployment one copy short of its replicas (its maxUnavailable) as ready.
    def every_copy_ready() -> bool:
        pods = [p for c in ("controller", "agent", "webhook") for p in gpuslice_pods(kind, c)]
        return all(ready(p) for p in pods)
    try:
        kind.wait_until("every gpuslice pod Ready", every_copy_ready, within=300)
    except AssertionError:
        print(kind.kubectl("-n", "gpuslice-system", "get", "pods", "-o", "wide"))
        print(kind.kubectl("-n", "gpuslice-system", "describe", "pods", check=False)[-6000:])
        raise
    controllers, agents = gpuslice_pods(kind, "controller"), gpuslice_pods(kind, "agent")
    assert len(controllers) == 2
    assert len(agents) == len(kind.workers)
    assert len(gpuslice_pods(kind, "webhook")) == 2
    # The monitoring objects, applied for real against the Prometheus Operator's CRDs, and metrics
    # Services that select every copy and agent on their metrics port.
    for kind_, name in (("servicemonitor", "gpuslice-controller"), ("servicemonitor", "gpuslice-agent"),
                        ("prometheusrule", "gpuslice"), ("configmap", "gpuslice-dashboard"),
                        ("networkpolicy", "gpuslice-controller"), ("networkpolicy", "gpuslice-agent"),
                        ("servicemonitor", "gpuslice-webhook"), ("networkpolicy", "gpuslice-webhook")):
        kind.kubectl("-n", "gpuslice-system", "get", kind_, name)
    for component, pods in (("controller", controllers), ("agent", agents)):
        def selected(component: str = component, pods: list[dict[str, Any]] = pods) -> bool:
            slices = kind.items("endpointslices", "-n", "gpuslice-system",
                                "-l", f"kubernetes.io/service-name=gpuslice-{component}")
            addresses = {a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]}
            ports = {(p["name"], p["port"]) for s in slices for p in s.get("ports") or []}
            return addresses == {p["status"]["podIP"] for p in pods} and ports == {("metrics", 8080)}

        kind.wait_until(f"the {component} metrics Service to select every {component} pod", selected, within=60)
    kind.kubectl("apply", "-f", "examples/tenants/namespaces.yaml", "-f", "examples/policies/inference-memory.yaml")
    kind.kubectl("wait", "gsp/inference", "--for=condition=Ready", "--timeout=300s")
    kind.kubectl("apply", "-f", "-", input=yaml.safe_dump(tenant_pod()))
    kind.kubectl("-n", "team-a", "wait", "pod/inference", "--for=condition=Ready", "--timeout=300s")
    assert environment(kind, "team-a", "inference").get("GPUSLICE_POLICY") == "inference"


def test_helm_upgrade_keeps_the_running_pod_on_its_device(installed: Kind) -> None:
    kind = installed
    before = kind.json("-n", "team-a", "get", "pod", "inference")
    devices = results(claim_of(kind, "team-a", "inference"))
    assert devices, "the tenant pod holds no device"
    upgraded = load_upgrade_image(kind)
    # docs/install.md: Helm never upgrades crds/, so the CRD goes first, by hand.
    kind.kubectl("apply", "--server-side", "-f", str(CHART / "crds"))
    helm(kind, "upgrade", *RELEASE, str(CHART), "--reuse-values", "--set", f"image.tag={upgraded.partition(':')[2]}",
         "--set", "preDelete.timeoutSeconds=20", "--wait", "--timeout", "5m")
    kind.kubectl("-n", "gpuslice-system", "rollout", "status", "daemonset/gpuslice-agent", "--timeout=300s")
    # `--wait` ends when the new pods are ready; the old ones may still be terminating (listed,
    # with a deletionTimestamp) for their grace period. Every copy runs the new image once they go.
    def images(component: str) -> set[str]:
        return {p["spec"]["containers"][0]["image"] for p in gpuslice_pods(kind, component)}

    for component in ("agent", "controller", "webhook"):
        kind.wait_until(f"every {component} pod to run {upgraded}", lambda c=component: images(c) == {upgraded},
                        within=120)
    now = kind.json("-n", "team-a", "get", "pod", "inference")
    assert now["metadata"]["uid"] == before["metadata"]["uid"], "the tenant pod was replaced"
    assert restarts(now) == 0
    assert ready(now)
    assert results(claim_of(kind, "team-a", "inference")) == devices, "its allocation changed"


def test_helm_uninstall_waits_for_claims_then_leaves_nothing(installed: Kind) -> None:
    kind = installed
    claim = claim_of(kind, "team-a", "inference")["metadata"]["name"]
    refused = helm(kind, "uninstall", *RELEASE, "--wait", "--timeout", "3m", check=False)
    assert refused.returncode != 0, "helm uninstall went ahead while a claim held a device"
    assert "pre-delete" in refused.stderr, refused.stderr
    said = kind.kubectl("-n", "gpuslice-system", "logs", "job/gpuslice-pre-delete", check=False)
    assert claim in said, said
    assert gpuslice_pods(kind, "controller"), "the controller went before the policies"
    # The README's order: the workloads first, then the uninstall.
    kind.kubectl("-n", "team-a", "delete", "pod", "inference", "--wait=true")
    helm(kind, "uninstall", *RELEASE, "--wait", "--timeout", "5m")
    # What Helm leaves by design: crds/ (docs/install.md), and the release's namespace.
    kind.kubectl("delete", "crd", "gpuslicepolicies.gpuslice.dev", "gpusliceledgers.gpuslice.dev",
                 "gpusliceagentviews.gpuslice.dev")
    kind.kubectl("delete", "namespace", "gpuslice-system", "--wait=true")
    kind.kubectl("delete", "-f", kind.build["monitoringCrds"])
    kind.wait_until("the agents' slices to be gone", lambda: not kind.kubectl(
        "get", "resourceslices", "--field-selector", "spec.driver=gpu.gpuslice.dev", "-o", "name"), within=120)
    found = leftovers(kind)
    assert not found, "left behind:\n" + "\n".join(found)
    labels = kind.json("get", "namespace", "gpu-monitoring")["metadata"].get("labels", {})
    assert "resource.kubernetes.io/admin-access" not in labels
    nothing_left_on_the_nodes(kind)
