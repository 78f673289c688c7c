"""API objects as the server holds them, for the tests that serve them (tests.fakeapi): a policy the
controller has judged, a fake GPU node, a namespace, a claim and its allocation."""

from __future__ import annotations

from typing import Any

from gpuslice.devcluster.nodes import fake_gpu_node
from gpuslice.dra.names import DRIVER

POLICIES = "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NODE = "n1"
TENANT = "team-a"


def policy(name: str, slicing: dict[str, Any], *, generation: int = 1, tenants: tuple[str, ...] = (TENANT,),
           node: str = NODE, judged: bool = True, **spec: Any) -> dict[str, Any]:
    """A GpuSlicePolicy for ``node``'s GPUs; ``judged``: the controller found this generation valid
    (what a node agent waits for before it publishes it)."""
    body: dict[str, Any] = {
        "apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
        "metadata": {"name": name, "uid": f"u-{name}", "generation": generation,
                     "creationTimestamp": "2026-11-29T10:00:00Z"},
        "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}}, "slicing": slicing,
                 "tenants": [{"namespace": t} for t in tenants], **spec},
    }
    if judged:
        body["status"] = {"observedGeneration": generation, "conditions": [
            {"type": "Valid", "status": "True", "reason": "SpecValid", "message": "",
             "lastTransitionTime": "2026-11-29T10:00:00Z"}]}
    return body


def node(name: str = NODE, model: str = "h100-80gb", count: int = 1) -> dict[str, Any]:
    return fake_gpu_node(name, model, count)


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "uid": f"uid-{name}"},
            "status": {"phase": "Active"}}


def claim(name: str, devices: list[str], *, namespace: str = TENANT, pool: str = NODE,
          admin: bool = False, uid: str | None = None, **result: Any) -> dict[str, Any]:
    """A ResourceClaim the scheduler allocated ``devices`` of ``pool`` (none: not allocated);
    ``result``: more of each allocation result (``shareID``, ``consumedCapacity``)."""
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
    }
    if devices:
        body["status"] = {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": pool, "device": d, **({"adminAccess": True} if admin else {}),
             **result} for d in devices]}}}
    return body
