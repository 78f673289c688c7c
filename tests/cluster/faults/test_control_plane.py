"""The API server or etcd killed (SIGKILL) and started again in the middle of a policy's deletion,
the invariant checker on throughout: what claims hold stays as it was, the free devices drain and
go once the control plane is back, and the policy goes once its claims are released.

The agent is stopped (SIGSTOP) from the deletion until the component is dead, so its whole drain
(the drain object written, the probe the restarted API server must refuse, the claims read) runs
against a control plane that has just come back: the API server's admission parameters, the drain
objects selected by label, loaded again from nothing."""

from __future__ import annotations

import asyncio

import pytest

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient
from tests.cluster.faults.invariants import InvariantChecker
from tests.cluster.faults.ops import (
    allocated,
    alone_on,
    create_pods,
    delete_pods,
    devices,
    of_policy,
    settled,
    wait_devices,
)
from tests.cluster.faults.shape import API_SERVER_MAPPER, NODES, RECOVERY, PolicyMaker
from tests.cluster.kubeutil import POLICIES, get_or_none, wait_for

OUTAGE = 8.0  # seconds the component stays dead: the fault's length, not a wait


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
async def test_a_control_plane_restart_during_a_deletion_keeps_what_claims_hold_and_drains_the_rest(
    faults_cluster: DevCluster, fkube: KubeClient, fns: str, fpolicy: PolicyMaker, invariants: InvariantChecker,
    kube_controller_manager_back: None, component: str,
) -> None:
    node = NODES[0]
    agent = f"gpuslice-agent-{node}"
    policy = await fpolicy(fns, node, {"mode": "memory", "sliceSize": "10G"})
    await wait_devices(fkube, node, policy, 16, "-10g-")
    await alone_on(fkube, node, policy)
    pods = ["d0", "d1"]
    await create_pods(fkube, fns, "gpu-slice", pods)
    held = {d["device"] for d in await settled(fkube, fns, pods)}
    assert len(held) == 2

    faults_cluster.pause(agent)
    try:
        await fkube.delete(f"{POLICIES}/{policy}")
        async with faults_cluster.down(component):
            faults_cluster.resume(agent)  # its cycles meet the dead component first
            await asyncio.sleep(OUTAGE)
    finally:
        faults_cluster.resume(agent)

    async def only_held() -> bool:
        found = of_policy(await devices(fkube, node), policy)
        return set(found) == held and all(d.get("taints") for d in found.values())

    await wait_for(only_held, within=RECOVERY + API_SERVER_MAPPER,
                   what="the free devices to drain and go, the claimed ones held, after the restart")
    await invariants.check()
    invariants.assert_held()
    assert invariants.allocations_seen, "the checker saw the allocations"
    assert {d["device"] for d in await allocated(fkube, fns, pods)} == held
    assert await get_or_none(fkube, f"{POLICIES}/{policy}") is not None, "deletion waits for its claims"

    await delete_pods(fkube, fns, pods)

    async def gone() -> bool:
        return not of_policy(await devices(fkube, node), policy) and await get_or_none(
            fkube, f"{POLICIES}/{policy}") is None

    await wait_for(gone, within=90, what="the policy to go once its claims are released")
