"""A policy's tenants as the API server enforces them: a policy proved Valid, a tenant admitted with
its quota counting, a dry-run claim admitted or not."""

from __future__ import annotations

from typing import Any

from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import NO_NODES, POLICIES, RESOURCE, condition, get_or_none, wait_for
from tests.cluster.operator_fixtures import PolicyFactory


async def ready_tenant(kube: KubeClient, policy: str, ns: str, *, quota: bool = True, classes: int = 0) -> None:
    """The tenant is admitted and, with ``quota``, its quota counts (at least ``classes`` of the
    policy's classes: before that, claims of the others are refused)."""
    async def counted() -> bool:
        body = await kube.get(f"{POLICIES}/{policy}")
        record = [a for a in (body.get("status") or {}).get("admittedTenants") or [] if a["namespace"] == ns]
        if not record:
            return False
        if not quota:
            return "limits" not in record[0]
        found = await get_or_none(kube, f"/api/v1/namespaces/{ns}/resourcequotas/gpuslice-{policy}")
        return (found is not None and "used" in (found.get("status") or {})
                and len(record[0].get("classes") or []) >= classes)

    await wait_for(counted, within=30, what=f"{ns} to be admitted with its quota counting")


ADMIN_LABEL = "resource.kubernetes.io/admin-access"


def claim(name: str, device_class: str, admin: bool = False) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if admin:
        exactly["adminAccess"] = True
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


async def dry_run_admitted(kube: KubeClient, namespace: str, device_class: str) -> bool:
    """Whether the apiserver admits a dry-run claim of ``device_class`` from ``namespace``."""
    try:
        await kube.request("POST", f"{RESOURCE}/namespaces/{namespace}/resourceclaims", claim("probe", device_class),
                           query={"dryRun": "All"})
    except KubeError:
        return False
    return True


async def ready_policy(kube: KubeClient, make_policy: PolicyFactory, spec: dict[str, Any], suffix: str = "") -> str:
    """Create a policy and wait until the controller has proved its tenancy is enforced (Valid)."""
    name = (await make_policy({"nodeSelector": NO_NODES, "slicing": {"mode": "memory", "sliceSize": "10Gi"}, **spec},
                              suffix))["metadata"]["name"]
    await valid(kube, name)
    return name


async def valid(kube: KubeClient, name: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        body = await kube.get(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}")
        fresh = (body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"]
        return body if fresh and condition(body, "Valid").get("status") == "True" else None

    found: dict[str, Any] = await wait_for(check, within=30, what=f"{name} to be Valid")
    return found


async def scheduling_events(kube: KubeClient, namespace: str, pod: str, words: str) -> list[dict[str, Any]]:
    """The pod's FailedScheduling Events, once one says ``words``."""
    async def said() -> list[dict[str, Any]] | None:
        found = [e for e in await kube.list(f"/api/v1/namespaces/{namespace}/events")
                 if e["involvedObject"].get("name") == pod and e.get("reason") == "FailedScheduling"]
        return found if any(words in e.get("message", "") for e in found) else None

    events: list[dict[str, Any]] = await wait_for(said, within=60, what=f"a FailedScheduling Event of {pod} saying {words}")
    return events


async def valid_condition(kube: KubeClient, name: str, status: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        body = await kube.get(f"{POLICIES}/{name}")
        found = condition(body, "Valid")
        generation_seen = (body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"]
        return found if found.get("status") == status and generation_seen else None

    result: dict[str, Any] = await wait_for(check, what=f"Valid={status} on {name}")
    return result
