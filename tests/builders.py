"""Bodies of API objects as the server holds them, built in one place, in the spirit of Kueue's
``MakeX`` wrappers (pkg/util/testing/wrappers.go): a GpuSlicePolicy at any stage of its life, a fake
GPU node, a namespace, a claim and its allocation. Each builder makes the smallest body its
arguments describe, so a test names what matters to it; a folder's presets (e.g.
tests/unit/planning/cluster_state.py's ``policy_body``) are these builders with some arguments set."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.devcluster.nodes import fake_gpu_node
from gpuslice.dra.names import DRIVER

POLICIES = "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NODE = "n1"
TENANT = "team-a"
CREATED = "2026-11-29T10:00:00Z"


def policy(name: str = "p", slicing: Mapping[str, Any] | None = None, created: str | None = CREATED, *,
           spec: Mapping[str, Any] | None = None, node: str | None = None,
           tenants: Iterable[str | Mapping[str, Any]] | None = None, generation: int | None = None,
           uid: str | None = None, judged: bool = False, ready: bool = False, deleting: str | None = None,
           status: Mapping[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """A GpuSlicePolicy, of uid ``uid-<name>`` unless given. Its spec is ``spec`` whole, or else
    ``node`` (a nodeSelector of that hostname), ``slicing``, ``tenants`` (namespaces, or whole tenant
    entries) and ``fields``. ``judged``: the controller found it valid (observed at ``generation``,
    when one is given), what a node agent waits for before it publishes it; ``ready``: and Ready;
    ``status``: more of the status."""
    metadata: dict[str, Any] = {"name": name}
    for key, value in (("uid", f"uid-{name}" if uid is None else uid), ("generation", generation),
                       ("creationTimestamp", created), ("deletionTimestamp", deleting)):
        if value is not None:
            metadata[key] = value
    if spec is None:
        made: dict[str, Any] = {}
        if node is not None:
            made["nodeSelector"] = {"matchLabels": {"kubernetes.io/hostname": node}}
        if slicing is not None:
            made["slicing"] = dict(slicing)
        if tenants is not None:
            made["tenants"] = [{"namespace": t} if isinstance(t, str) else dict(t) for t in tenants]
        spec = {**made, **fields}
    body: dict[str, Any] = {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": metadata,
                            "spec": dict(spec)}
    found: dict[str, Any] = {}
    if judged:
        if generation is not None:
            found["observedGeneration"] = generation
        found["conditions"] = [{"type": "Valid", "status": "True", "reason": "SpecValid", "message": "",
                                "lastTransitionTime": CREATED}]
        if ready:
            found["conditions"].append({"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                                        "lastTransitionTime": CREATED})
    found.update(status or {})
    if found:
        body["status"] = found
    return body


def policy_model(name: str = "p", slicing: Mapping[str, Any] | None = None, created: str | None = CREATED,
                 **options: Any) -> GpuSlicePolicy:
    """The same policy as the operator's code reads it (``policy``'s options)."""
    return GpuSlicePolicy.from_body(policy(name, slicing, created, **options))


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
