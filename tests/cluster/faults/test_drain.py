"""Drain under a slow cluster: a device that is about to change or go is never handed out after
it went. The scheduler decides on devices from what it saw and writes the claim's allocation
later; here that write is held (the proxy in front of the scheduler, as a congested uplink or
client-side throttling would), or the whole API server or etcd stalls, past any drain timer,
while a policy is resized, changes mode, or is deleted. The invariant checker watches all along."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient
from tests.cluster.faults.invariants import InvariantChecker, complete_pools
from tests.cluster.faults.ops import (
    allocated,
    alone_on,
    binding,
    create_pods,
    devices,
    of_policy,
    pool_slices,
    settled,
    settled_devices,
    wait_devices,
)
from tests.cluster.faults.shape import NODES, PolicyMaker
from tests.cluster.kubeutil import POLICIES, wait_for

PODS = [f"w{i}" for i in range(5)]
STALL = 8.0  # seconds


async def decided(cluster: DevCluster, count: int) -> None:
    """Wait until the scheduler has chosen devices for ``count`` pods and is writing their claims."""
    async def check() -> bool:
        return await binding(cluster) >= count

    await wait_for(check, within=60, what=f"the scheduler to decide on {count} pods")


Change = Callable[[KubeClient, str], Awaitable[None]]


async def resize(kube: KubeClient, policy: str) -> None:
    await kube.merge_patch(f"{POLICIES}/{policy}", {"spec": {"slicing": {"sliceSize": "20G"}}})


async def to_shared(kube: KubeClient, policy: str) -> None:
    await kube.merge_patch(f"{POLICIES}/{policy}", {"spec": {"slicing": {"mode": "shared"}}})


async def delete(kube: KubeClient, policy: str) -> None:
    await kube.delete(f"{POLICIES}/{policy}")


@pytest.mark.parametrize("change", [resize, to_shared, delete], ids=["resize", "mode-change", "deletion"])
async def test_no_device_is_allocated_after_it_went_while_the_schedulers_writes_are_held(
    faults_cluster: DevCluster, fkube: KubeClient, fns: str, fpolicy: PolicyMaker, invariants: InvariantChecker,
    change: Change,
) -> None:
    node = NODES[0]
    policy = await fpolicy(fns, node, {"mode": "memory", "sliceSize": "10G"})
    old = await wait_devices(fkube, node, policy, 16, "-10g-")
    await alone_on(fkube, node, policy)
    proxy = faults_cluster.proxy
    assert proxy is not None
    proxy.hold()
    await create_pods(fkube, fns, "gpu-slice", PODS)
    await decided(faults_cluster, len(PODS))  # chosen among the 10G slices; the claims not yet written

    await change(fkube, policy)

    async def old_gone() -> bool:
        # Not while the agent is between the writes of a generation: the pool then reads as no
        # devices at all, and the writes released would land before the drain.
        pools, incomplete = complete_pools(await pool_slices(fkube, node))
        return node not in incomplete and not set(old) & set(pools.get(node) or {})

    await wait_for(old_gone, within=60, what="the free 10G slices to drain and go")
    proxy.release()
    if change is delete:  # the class is gone: the pods can only wait, unallocated
        async def bound_nothing() -> bool:
            return await binding(faults_cluster) == 0

        await wait_for(bound_nothing, within=60, what="the scheduler's held binding cycles to end")
        results = await allocated(fkube, fns, PODS)
    else:
        results = await settled(fkube, fns, PODS)
    if change is resize:  # more pods take what looks free: had a claim kept a slice that went, a GPU overflows
        more = [f"m{i}" for i in range(8)]
        await create_pods(fkube, fns, "gpu-slice", more)
        await settled(fkube, fns, more)
    await invariants.check()
    invariants.assert_held()
    assert not {r["device"] for r in results} & set(old), "no claim holds a device that went"
    if change is not delete:
        now = of_policy(await settled_devices(fkube, node), policy)
        assert {r["device"] for r in results} <= set(now)
        assert len(results) == len(PODS), "the refused pods were scheduled again, onto the new devices"


async def stall_during_resize(faults_cluster: DevCluster, fkube: KubeClient, fns: str, fpolicy: PolicyMaker,
                              invariants: InvariantChecker, component: str) -> None:
    node = NODES[1]
    policy = await fpolicy(fns, node, {"mode": "memory", "sliceSize": "10G"})
    old = await wait_devices(fkube, node, policy, 16, "-10g-")
    await alone_on(fkube, node, policy)
    await create_pods(fkube, fns, "gpu-slice", PODS)
    await resize(fkube, policy)

    async def draining() -> bool:
        found = of_policy(await devices(fkube, node), policy)
        return any(d.get("taints") for n, d in found.items() if n in old)

    await wait_for(draining, within=30, what="the 10G slices to start draining")
    async with faults_cluster.paused(component):
        await asyncio.sleep(STALL)  # the fault itself, not a wait: longer than the old 5 s drain timer
    results = await settled(fkube, fns, PODS)
    await invariants.check()
    invariants.assert_held()
    assert invariants.allocations_seen, "the checker saw allocations"
    now = of_policy(await settled_devices(fkube, node), policy)
    assert {r["device"] for r in results} <= set(now) | set(old)


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
async def test_a_stalled_control_plane_during_a_resize_keeps_the_invariants(
    faults_cluster: DevCluster, fkube: KubeClient, fns: str, fpolicy: PolicyMaker, invariants: InvariantChecker,
    component: str,
) -> None:
    await stall_during_resize(faults_cluster, fkube, fns, fpolicy, invariants, component)
