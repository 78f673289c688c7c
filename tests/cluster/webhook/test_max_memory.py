"""maxMemory: a tenant holds no more GPU memory than its limit, whatever it asks and however many
allocations race. The real scheduler allocates, the real API server calls the maxMemory webhook
(on loopback, by URL, as the dev cluster runs it) which charges each allocation in the tenant's
ledger; the tenancy rule keeps the limit's record."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.claims import allocation, claim, refusal_says, refused, request
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import POLICIES, RESOURCE, wait_for
from tests.cluster.observe import scheduler_settled
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory, WebhookProcess
from tests.cluster.webhook.budgets import (
    GI,
    admits,
    budget_policy,
    claim_with_pod,
    held_gib,
    ledger,
    memory_claim,
    memory_in_force,
    refused_at_allocation,
    sample,
)


async def test_a_tenant_with_max_memory_holds_no_more_and_is_told_why(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    """Shared mode, maxMemory 30Gi: any capacity may be asked; 20Gi and 8Gi are allocated, a 4Gi more
    is refused at allocation (the pod's Events say what it holds, its limit and what it asks), a
    claim of 40Gi alone is refused when made, and releasing the 8Gi lets the 4Gi in within seconds."""
    name, klass, _ = await budget_policy(kube, make_policy, gpu_node, namespace, {"mode": "shared", "sliceSize": "1Gi"})
    message = await refused(kube, namespace, memory_claim("huge", klass, 40), "asks for at least 40Gi",
                            "spec.tenants[].maxMemory: 30Gi", f"GpuSlicePolicy {name}")
    assert "maxmemory.gpuslice.dev" in message
    for pod, gib in (("big", 20), ("mid", 8)):
        await claim_with_pod(kube, namespace, pod, memory_claim(pod, klass, gib))
        await wait_for(lambda pod=pod: allocation(kube, namespace, pod), within=60, what=f"{pod} to be allocated")
    await claim_with_pod(kube, namespace, "more", memory_claim("more", klass, 4))
    said = await refused_at_allocation(kube, namespace, "more", "maxMemory")
    assert f"namespace {namespace} holds 28Gi of its 30Gi maxMemory in GpuSlicePolicy {name}; this claim asks 4Gi" \
        in said, said
    assert await allocation(kube, namespace, "more") is None
    assert (await ledger(kube, name, namespace))["status"]["heldBytes"] == 28 * GI
    # What it holds against its limit, as metrics: the ledger's (the webhook), and the status' (the controller).
    labels = f'namespace="{namespace}",policy="{name}"'
    text = await memory_webhook.metrics()
    assert sample(text, "gpuslice_webhook_ledger_charged_bytes", labels) == 28 * GI
    assert sample(text, "gpuslice_webhook_ledger_limit_bytes", labels) == 30 * GI

    async def controller_says() -> bool:
        import aiohttp

        async with aiohttp.ClientSession() as session, session.get(
                f"http://127.0.0.1:{controller.metrics_port}/metrics") as response:
            served = await response.text()
        return (sample(served, "gpuslice_tenant_allocated_bytes", labels) == 28 * GI
                and sample(served, "gpuslice_tenant_limit_bytes", labels) == 30 * GI)

    await wait_for(controller_says, within=30, what="the controller's tenant metrics to say 28Gi of 30Gi")
    # Releasing a claim frees its memory for the next allocation within seconds.
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/mid", gracePeriodSeconds=0)
    await kube.delete(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/mid")
    started = asyncio.get_running_loop().time()
    await wait_for(lambda: allocation(kube, namespace, "more"), within=30, what="the 4Gi claim once 8Gi is released")
    print(f"released and allocated again in {asyncio.get_running_loop().time() - started:.1f} s")
    assert await held_gib(kube, namespace) == 24
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)


def extended_pod(name: str, resource: str, count: int) -> dict[str, Any]:
    from tests.cluster.kubeutil import PAUSE_IMAGE

    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE, "resources": {"limits": {resource: str(count)}}}]}}


async def test_every_way_to_ask_for_more_is_refused_or_charged(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, unique: str,
) -> None:
    """Memory mode, 10Gi slices and whole GPUs, maxMemory 30Gi and no count limit: several requests,
    count, firstAvailable, allocationMode All, admin access and extended resources (explicit and
    implicit) are each refused when made, refused at allocation, or charged what they hold."""
    resource = f"example.com/slice-{unique}"
    name, slices, _ = await budget_policy(kube, make_policy, gpu_node, namespace,
                                          {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True},
                                          gpus=2, devices=16, extendedResourceName=resource)
    full = f"full.{name}.gpuslice.dev"
    # Refused when made: what could never fit.
    await refused(kube, namespace, claim("four", request(slices, count=4)), "asks for at least 40Gi")
    await refused(kube, namespace, claim("whole", request(full)), "maxMemory: 30Gi")
    await refused(kube, namespace, claim("admin", request(slices, adminAccess=True)), "adminAccess")
    # allocationMode All: every slice of the class (140Gi), refused at allocation.
    await claim_with_pod(kube, namespace, "all", claim("all", request(slices, allocationMode="All")))
    said = await refused_at_allocation(kube, namespace, "all", "maxMemory")
    assert f"holds 0 of its 30Gi maxMemory in GpuSlicePolicy {name}; this claim asks 140Gi" in said, said
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/all", gracePeriodSeconds=0)
    # Several requests: charged for each.
    two = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "two"},
           "spec": {"devices": {"requests": [{"name": "a", "exactly": request(slices)},
                                             {"name": "b", "exactly": request(slices)}]}}}
    await claim_with_pod(kube, namespace, "two", two)
    await wait_for(lambda: allocation(kube, namespace, "two"), within=60, what="two slices in one claim")
    # Refused at allocation: the whole GPU first (firstAvailable), every slice (allocationMode All).
    await claim_with_pod(kube, namespace, "either", claim("either", first=[
        {"name": "whole", **request(full)}, {"name": "slice", **request(slices)}]))
    said = await refused_at_allocation(kube, namespace, "either", "maxMemory")
    assert f"holds 20Gi of its 30Gi maxMemory in GpuSlicePolicy {name}; this claim asks 79.6Gi" in said, said
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/either", gracePeriodSeconds=0)

    # Extended resources: the scheduler's own claim for the pod is judged like any other.
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", extended_pod("explicit", resource, 2))
    said = await refused_at_allocation(kube, namespace, "explicit", "maxmemory.gpuslice.dev")
    assert "asks for at least 20Gi" in said or "this claim asks 20Gi" in said, said
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/explicit", gracePeriodSeconds=0)
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", extended_pod(
        "implicit", f"deviceclass.resource.kubernetes.io/{slices}", 1))

    async def implicit_allocated() -> bool:
        for item in await kube.list(f"{RESOURCE}/namespaces/{namespace}/resourceclaims"):
            owners = [o["name"] for o in item["metadata"].get("ownerReferences") or []]
            if "implicit" in owners and (item.get("status") or {}).get("allocation"):
                return True
        return False

    await wait_for(implicit_allocated, within=60, what="the implicit extended resource's slice")
    ledger_status = (await ledger(kube, name, namespace))["status"]
    assert ledger_status["heldBytes"] == 30 * GI, ledger_status
    assert len(ledger_status["charges"]) == 2
    await claim_with_pod(kube, namespace, "one-more", claim("one-more", request(slices)))
    said = await refused_at_allocation(kube, namespace, "one-more", "maxMemory")
    assert "holds 30Gi of its 30Gi maxMemory" in said
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)


async def test_capacity_on_another_key_takes_nothing(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    """A tenant with maxMemory alone may ask any capacity of a shared device; a key the device does not
    have matches no device, and the memory it holds is what the scheduler says it consumed."""
    name, klass, _ = await budget_policy(kube, make_policy, gpu_node, namespace, {"mode": "shared", "sliceSize": "10G"})
    await claim_with_pod(kube, namespace, "sly", claim("sly", request(klass, capacity={"requests": {
        "gpu.gpuslice.dev/memory": "80G"}})))
    await claim_with_pod(kube, namespace, "odd", memory_claim("odd", klass, 15))  # rounded up to 20G by the step
    await wait_for(lambda: allocation(kube, namespace, "odd"), within=60, what="the 15Gi claim")
    await scheduler_settled(cluster)  # sly was tried since, and parked
    assert await allocation(kube, namespace, "sly") is None
    assert (await ledger(kube, name, namespace))["status"]["heldBytes"] == 20 * 10**9
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)


async def test_a_tenant_removed_while_it_holds_memory_gets_it_counted_when_it_returns(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    """Removed from spec.tenants, a tenant keeps what it holds (its pods run), allocates nothing more,
    and its ledger goes; put back, its new ledger counts what it still holds from its claims before
    its limit is in force again."""
    name, klass, _ = await budget_policy(kube, make_policy, gpu_node, namespace, {"mode": "shared", "sliceSize": "1Gi"})
    await claim_with_pod(kube, namespace, "kept", memory_claim("kept", klass, 20))
    await wait_for(lambda: allocation(kube, namespace, "kept"), within=60, what="the 20Gi claim")
    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"tenants": []}})

    async def ledger_gone() -> bool:
        try:
            await ledger(kube, name, namespace)
        except KubeError as error:
            return error.status == 404
        return False

    await wait_for(ledger_gone, within=30, what="the removed tenant's ledger to go")
    await refused(kube, namespace, memory_claim("new", klass, 1), "is not a tenant")
    assert await allocation(kube, namespace, "kept") is not None
    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"tenants": [{"namespace": namespace, "maxMemory": "30Gi"}]}})
    await memory_in_force(kube, name, namespace, "30Gi")
    assert (await ledger(kube, name, namespace))["status"]["heldBytes"] == 20 * GI
    await admits(kube, namespace, klass)
    await claim_with_pod(kube, namespace, "big", memory_claim("big", klass, 16))
    said = await refused_at_allocation(kube, namespace, "big", "maxMemory")
    assert "holds 20Gi of its 30Gi maxMemory" in said
    await claim_with_pod(kube, namespace, "fits", memory_claim("fits", klass, 8))
    await wait_for(lambda: allocation(kube, namespace, "fits"), within=60, what="the 8Gi claim")
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)


async def test_a_raised_max_memory_waits_for_the_controller(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    """Judged against what is in force: raised while the controller is stalled, the tenant's new claims
    wait (the ledger still says 30Gi); once the controller is back, the new limit is in force."""
    name, klass, _ = await budget_policy(kube, make_policy, gpu_node, namespace, {"mode": "shared", "sliceSize": "1Gi"})
    controller.pause()
    try:
        await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"tenants": [
            {"namespace": namespace, "maxMemory": "60Gi"}]}})
        await refusal_says(kube, namespace, memory_claim("raised", klass, 40), "changed, and gpuslice has not yet put them")
        await refused(kube, namespace, memory_claim("raised", klass, 40), "changed, and gpuslice has not yet put them")
        assert (await ledger(kube, name, namespace))["spec"]["maxMemory"] == "30Gi"
    finally:
        controller.resume()
    await memory_in_force(kube, name, namespace, "60Gi")
    await admits(kube, namespace, klass)
    await claim_with_pod(kube, namespace, "raised", memory_claim("raised", klass, 40))
    await wait_for(lambda: allocation(kube, namespace, "raised"), within=60, what="40Gi under the raised limit")
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)
