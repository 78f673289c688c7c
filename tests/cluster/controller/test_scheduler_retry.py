"""A pod kube-scheduler turned away only because allocations were in flight, which the maxMemory
webhook then refused, is tried again by the controller (controller.retry) within seconds; the
scheduler alone would try it only after its 5-minute flush (docs/memory-limits.md)."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from gpuslice.controller.retry import RETRY_AT
from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient
from gpuslice.planning.reads.retry import turned_away
from tests.cluster.claims import allocation, pod_using
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import RESOURCE, wait_for
from tests.cluster.observe import scheduler_allocating
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory, WebhookProcess
from tests.cluster.webhook.budgets import memory_claim, shared_tenant


async def test_a_pod_turned_away_by_allocations_refused_in_flight_is_tried_again_within_seconds(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    """The tenant (maxMemory 30Gi, one H100 of 79.65Gi shared) asks for 79Gi in ten claims while
    the webhook is frozen: all ten are in flight, the GPU is full in the scheduler's count, and a
    4Gi claim made then is turned away. Thawed, the webhook admits 23 or 24Gi and refuses the rest:
    the 4Gi claim fits, and no event of the scheduler's would try it again for 5 minutes."""
    name, _ = await shared_tenant(kube, make_policy, gpu_node, namespace)
    klass = f"{name}.gpuslice.dev"
    claims = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    bigs = [f"big-{i}" for i in range(10)]
    for big, gib in zip(bigs, [8] * 9 + [7], strict=True):
        await kube.create(claims, memory_claim(big, klass, gib))  # the webhook judges claims made too
    await kube.create(claims, memory_claim("small", klass, 4))
    process = memory_webhook.process
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    try:
        for big in bigs:
            await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_using(big, big))
        await scheduler_allocating(cluster, len(bigs))  # all ten placed, waiting on the frozen webhook
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_using("small", "small"))

        async def away() -> bool:
            return turned_away(await kube.get(f"/api/v1/namespaces/{namespace}/pods/small"))

        await wait_for(away, within=20, what="the 4Gi pod to be turned away while the GPU is full of allocations in"
                                             " flight")
    finally:
        process.send_signal(signal.SIGCONT)
    began = asyncio.get_running_loop().time()
    try:
        await wait_for(lambda: allocation(kube, namespace, "small"), within=60,
                       what="the 4Gi claim to be allocated once the controller asked the scheduler to try again")
    except AssertionError as error:
        pod: dict[str, Any] = await kube.get(f"/api/v1/namespaces/{namespace}/pods/small")
        raise AssertionError(f"{error}; the pod's conditions: {pod['status'].get('conditions')}; the controller"
                             f" said: {[line for line in controller.log_text().splitlines() if 'turned away' in line][-3:]}"
                             ) from None
    print(f"the 4Gi claim was allocated {asyncio.get_running_loop().time() - began:.0f} s after the webhook thawed")
    device_class = await kube.get(f"{RESOURCE}/deviceclasses/{klass}")
    assert RETRY_AT in (device_class["metadata"].get("annotations") or {}), "the controller did not ask"
