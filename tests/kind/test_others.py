"""What gpuslice must never hurt: another DRA driver's claims, on kind with the real kubelet and
scheduler, while gpuslice is installed and through an uninstall in the worst order (the CRD first,
as a GitOps prune does, then everything else as `kubectl delete -k` orders it). Run last
(tests/kind/conftest.py), on what the Helm tests left: gpuslice installed again with kustomize.

The second driver is made by hand: a DeviceClass and a ResourceSlice of four devices on a worker.
No kubelet plugin serves it, so its pods never start; what the test checks is what admission
decides: that the real scheduler's allocation of each claim is admitted.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import yaml

from tests.kind.checks import gpuslice_pods, leftovers, restarts
from tests.kind.kindutil import Kind

OTHER = "nic.example.com"
TENANT, STRANGER = "team-a", "other-team"  # a tenant of examples/policies (labelled), and no one's


@pytest.fixture(scope="module")
def reinstalled(kind: Kind) -> Kind:
    # docs/install.md, "Installing again": no API server restart, gpuslice-configmap-params was kept.
    kind.make("kind-deploy", IMAGE_BASE=kind.build["pythonBase"], TENANT_BASE=kind.build["busyboxBase"])
    kind.kubectl("apply", "-f", "examples/tenants/namespaces.yaml", "-f", "examples/policies/")
    kind.kubectl("wait", "gsp", "--all", "--for=condition=Ready", "--timeout=300s")
    kind.kubectl("create", "namespace", STRANGER)
    node = kind.workers[0]
    kind.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all([
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": OTHER},
         "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{OTHER}"'}}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"nic-{node}"},
         "spec": {"driver": OTHER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                  "devices": [{"name": f"nic-{i}"} for i in range(4)]}},
    ]))
    return kind


def allocated(kind: Kind, namespace: str) -> dict[str, Any]:
    """A claim of the other driver's class and a pod that uses it, allocated by the real scheduler
    (the allocation write is what admission judges); both deleted afterwards."""
    name = f"nic-{uuid.uuid4().hex[:6]}"
    kind.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump_all([
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
         "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": OTHER}}]}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
         "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                  "resources": {"claims": [{"name": "nic"}]}}],
                  "resourceClaims": [{"name": "nic", "resourceClaimName": name}]}},
    ]))

    def allocation() -> dict[str, Any] | None:
        claim: dict[str, Any] = kind.json("-n", namespace, "get", "resourceclaim", name)
        return claim if claim.get("status", {}).get("allocation") else None

    try:
        found: dict[str, Any] = kind.wait_until(f"the scheduler to allocate {namespace}/{name}", allocation,
                                                within=120)
    finally:
        kind.kubectl("-n", namespace, "delete", "pod", name, "--grace-period=0", "--force", "--wait=false",
                     check=False)
        kind.kubectl("-n", namespace, "delete", "resourceclaim", name, "--wait=false", check=False)
    return found


def test_other_drivers_claims_are_allocated_with_gpuslice_installed(reinstalled: Kind) -> None:
    for namespace in (TENANT, STRANGER):
        results = allocated(reinstalled, namespace)["status"]["allocation"]["devices"]["results"]
        assert {r["driver"] for r in results} == {OTHER}


def test_uninstall_in_the_worst_order_leaves_other_drivers_claims_working(reinstalled: Kind) -> None:
    kind = reinstalled
    labels = kind.json("get", "namespace", TENANT)["metadata"].get("labels", {})
    assert labels.get("gpuslice.dev/tenancy") == "judged", "a tenant's namespace is labelled"
    # The CRD first: its policies are deleted (the controller finalizes them and takes the tenancy
    # labels off), then it goes; the controller waits for it rather than crash-looping.
    kind.kubectl("delete", "crd", "gpuslicepolicies.gpuslice.dev", "--wait=true", "--timeout=300s")
    assert "gpuslice.dev/tenancy" not in kind.json("get", "namespace", TENANT)["metadata"].get("labels", {})
    for namespace in (TENANT, STRANGER):
        allocated(kind, namespace)

    def waiting() -> bool:
        pods = gpuslice_pods(kind, "controller")
        logs = "".join(kind.kubectl("-n", "gpuslice-system", "logs", p["metadata"]["name"], check=False)
                       for p in pods)
        return "the GpuSlicePolicy CRD is" in logs and "waiting for it" in logs

    kind.wait_until("a controller to say it waits for its CRD", waiting, within=120)
    assert all(restarts(p) == 0 for p in gpuslice_pods(kind, "controller")), "a controller restarted"
    # Then everything else, in the order kubectl deletes a kustomization.
    kind.kubectl("delete", "-k", "manifests/overlays/kind", "--ignore-not-found", "--wait=true", "--timeout=300s")
    for namespace in (TENANT, STRANGER):
        allocated(kind, namespace)
    kind.wait_until("the agents' slices to be gone (the kubelet drops them 30 s after the plugin)",
                    lambda: not kind.kubectl("get", "resourceslices", "--field-selector",
                                             "spec.driver=gpu.gpuslice.dev", "-o", "name"), within=120)
    kind.kubectl("delete", "deviceclass", OTHER)
    kind.kubectl("delete", "resourceslice", f"nic-{kind.workers[0]}")
    found = leftovers(kind, kept=())  # delete -k deleted the kept objects too
    assert not found, "left behind:\n" + "\n".join(found)
