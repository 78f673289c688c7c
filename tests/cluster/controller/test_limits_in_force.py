"""Limits are judged against what is in force, never against a spec the controller has not
converged (the December review's H1). The devices, DeviceClasses and quotas follow the last
*valid* spec the controller converged; so does its record of the classes in force
(``status.classesInForce``), and the tenancy rule reads that record. An invalid edit, or any
edit while the controller is stalled, loosens nothing: a limited tenant in shared mode never
takes more than one in-force sliceSize per allocation."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.claims import allocation, claim, pod_using, refusal_says, refused, request
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import POLICIES, RESOURCE, condition, on, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import pool_devices, published
from tests.cluster.tenancy import ready_tenant

OVER = "as the class is in force"


async def judged(kube: KubeClient, name: str, valid: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        body = await kube.get(f"{POLICIES}/{name}")
        fresh = (body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"]
        return body if fresh and condition(body, "Valid").get("status") == valid else None

    found: dict[str, Any] = await wait_for(check, within=60, what=f"{name} Valid={valid} at its generation")
    return found


async def shared_policy(kube: KubeClient, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
                        namespace: str) -> tuple[str, str]:
    """A shared 10G policy on one H100, its tenant limited to one slice: (policy, class)."""
    node = await gpu_node("h100-80gb", 1)
    name = (await make_policy({"nodeSelector": on(node.name), "slicing": {"mode": "shared", "sliceSize": "10G"},
                               "tenants": [{"namespace": namespace, "maxSlices": 1}]}))["metadata"]["name"]
    await published(kube, node.name, 1)
    await ready_tenant(kube, name, namespace)
    return name, f"{name}.gpuslice.dev"


async def never_more_than_a_slice(kube: KubeClient, namespace: str, klass: str) -> None:
    """An 80G claim is refused when made; a 10G one still gets its slice, and no more."""
    await refused(kube, namespace, claim("big", request(klass, capacity={"requests": {"memory": "80G"}})), OVER,
                  f"{klass}: 10G")
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
                      claim("small", request(klass, capacity={"requests": {"memory": "10G"}})))
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_using("small", "small"))
    found = await wait_for(lambda: allocation(kube, namespace, "small"), within=60, what="the 10G claim")
    assert [r.get("consumedCapacity") for r in found["devices"]["results"]] == [{"memory": "10G"}]


async def test_an_invalid_edit_away_from_shared_loosens_no_limit(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    """The review's N1: a CRD-valid edit the controller finds invalid (100G slices on an 80 GB GPU)
    leaves the shared device, its class and the quota as they were; it must leave the step too."""
    name, klass = await shared_policy(kube, make_policy, gpu_node, namespace)
    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"slicing": {"mode": "memory", "sliceSize": "100G"}}})
    body = await judged(kube, name, "False")
    assert condition(body, "Valid")["reason"] == "SliceLargerThanGpu"
    assert body["status"]["classesInForce"] == [
        {"name": klass, "kind": "shared", "shared": True, "memory": "10G", "leastMemory": "10G"}]
    await never_more_than_a_slice(kube, namespace, klass)


async def test_an_edit_while_the_controller_is_stalled_loosens_no_limit(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    """The review's N1b: a valid edit (shared to memory, and one taking the tenant's limit away)
    made while the controller is frozen: the rule must not follow the spec before the classes do."""
    name, klass = await shared_policy(kube, make_policy, gpu_node, namespace)
    controller.pause()
    try:
        await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"slicing": {"mode": "memory", "sliceSize": "10G"}}})
        await refusal_says(kube, namespace, claim("big", request(klass, capacity={"requests": {"memory": "80G"}})), OVER)
        await refused(kube, namespace, claim("big", request(klass, capacity={"requests": {"memory": "80G"}})), OVER)
        # Taking the limit away is a loosening as well: it waits for the controller's record too.
        await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"slicing": {"mode": "shared", "sliceSize": "10G"},
                                                               "tenants": [{"namespace": namespace}]}})
        await asyncio.sleep(2)  # length: the rule sees the edit within it; its answers stay the same (the point)
        await never_more_than_a_slice(kube, namespace, klass)
    finally:
        controller.resume()


async def test_the_step_a_shared_device_rounds_up_to_is_judged_at_allocation(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    """What a limited tenant takes of a shared device is what the scheduler writes it consumed: a
    device whose step is larger than the step in force (its policy's new, smaller sliceSize,
    converged while the agent had not yet republished) would round a one-slice request up. Here the
    agent is stopped, so the 20G device stays published after the policy goes down to 10G."""
    node = await gpu_node("h100-80gb", 1)
    name = (await make_policy({"nodeSelector": on(node.name), "slicing": {"mode": "shared", "sliceSize": "20G"},
                               "tenants": [{"namespace": namespace, "maxSlices": 1}]}))["metadata"]["name"]
    klass = f"{name}.gpuslice.dev"
    [device] = (await published(kube, node.name, 1)).values()
    await ready_tenant(kube, name, namespace)
    await node.agent.stop()
    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"slicing": {"sliceSize": "10G"}}})
    await judged(kube, name, "True")

    async def recorded() -> bool:
        status = (await kube.get(f"{POLICIES}/{name}"))["status"]
        return [c["memory"] for c in status["classesInForce"]] == ["10G"]

    await wait_for(recorded, within=30, what="the 10G step to be in force")
    assert (await pool_devices(kube, node.name))[device["name"]]["capacity"]["memory"]["requestPolicy"][
        "validRange"]["step"] == "20G"
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
                      claim("one", request(klass, capacity={"requests": {"memory": "10G"}})))
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_using("one", "one"))

    async def refused_at_allocation() -> str | None:
        for event in await kube.list(f"/api/v1/namespaces/{namespace}/events"):
            if event["involvedObject"]["name"] == "one" and OVER in (event.get("message") or ""):
                return str(event["message"])
        return None

    message = await wait_for(refused_at_allocation, within=60, what="the allocation rounded up to 20G to be refused")
    assert "allocation of ResourceClaim one" in message
    assert await allocation(kube, namespace, "one") is None
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/one", gracePeriodSeconds=0)
