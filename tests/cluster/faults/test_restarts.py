"""Restarts and crashes. The API server restarts mid-change: the controller and the agents
carry on by themselves within 30 s. The controller and an agent are killed (SIGKILL, at a
failpoint: between the writes of one generation of a pool, between the applies of a converge)
and started again: they converge, with no duplicate objects and no lost allocation."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from typing import Any

import pytest

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.devcluster.process import Component
from gpuslice.kube.client import KubeClient, NotFound
from tests.cluster.faults.invariants import InvariantChecker, complete_pools
from tests.cluster.faults.ops import (
    RESOURCE,
    agent_metrics,
    allocated,
    alone_on,
    create_pods,
    devices,
    of_policy,
    pool_slices,
    settled,
    settled_devices,
    wait_devices,
)
from tests.cluster.faults.shape import API_SERVER_MAPPER, NODES, RECOVERY, PolicyMaker
from tests.cluster.kubeutil import POLICIES, create_namespace, delete_namespace, wait_for


async def restart_armed(component: Component, failpoints: str | None) -> None:
    """Restart ``component`` with ``failpoints`` armed (None: disarmed)."""
    component.env = {**os.environ, "GPUSLICE_FAILPOINTS": failpoints} if failpoints else None
    await component.restart()


async def killed(component: Component) -> None:
    async def dead() -> bool:
        return component.process is not None and component.process.returncode is not None

    await wait_for(dead, within=60, what=f"{component.name} to die at its failpoint")
    assert component.process is not None
    assert component.process.returncode == -9, "SIGKILL at the failpoint, not some other exit"


def assert_pool_whole(slices: list[dict[str, Any]]) -> None:
    """One generation, every slice of it present, each device once."""
    generations = {s["spec"]["pool"]["generation"] for s in slices}
    assert len(generations) == 1, f"slices of several generations remain: {sorted(generations)}"
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    names = Counter(d["name"] for s in slices for d in s["spec"].get("devices") or [])
    assert not [n for n, c in names.items() if c > 1], "a device is published twice"
    sets = Counter(c["name"] for s in slices for c in s["spec"].get("sharedCounters") or [])
    assert not [n for n, c in sets.items() if c > 1], "a counter set is published twice"


@pytest.mark.parametrize("outage", [0.0, 70.0], ids=["brief", "longer-than-kopf-retries"])
async def test_the_controller_and_agents_recover_from_an_api_server_restart_by_themselves(
    faults_cluster: DevCluster, fkube: KubeClient, fns: str, fpolicy: PolicyMaker, invariants: InvariantChecker,
    kube_controller_manager_back: None, outage: float,
) -> None:
    node = NODES[1]
    policy = await fpolicy(fns, node, {"mode": "memory", "sliceSize": "10G"})
    await wait_devices(fkube, node, policy, 16, "-10g-")
    pods = ["r0", "r1"]
    await create_pods(fkube, fns, "gpu-slice", pods)
    before = {d["device"] for d in await settled(fkube, fns, pods)}
    ours = [faults_cluster.component(n) for n in ("gpuslice-controller", *(f"gpuslice-agent-{x}" for x in NODES))]
    pids = {c.name: c.pid for c in ours}

    # Mid-change: the resize is draining when the API server dies (SIGKILL); it stays down until the
    # agent's loop has met the outage, then starts again on the same port, certificates and etcd.
    await fkube.merge_patch(f"{POLICIES}/{policy}", {"spec": {"slicing": {"sliceSize": "20G"}}})

    async def draining() -> bool:
        return any(d.get("taints") for n, d in of_policy(await devices(fkube, node), policy).items()
                   if "-10g-" in n and n not in before)

    await wait_for(draining, within=30, what="the resize to start draining")
    agent = faults_cluster.component(f"gpuslice-agent-{node}")
    failed = 'gpuslice_agent_publish_cycles_total{outcome="failed"}'
    failures = (await agent_metrics(agent)).get(failed, 0.0)
    async with faults_cluster.down("kube-apiserver"):
        async def met_the_outage() -> bool:
            return (await agent_metrics(agent)).get(failed, 0.0) > failures

        await wait_for(met_the_outage, within=30, what="the agent's publish cycle to fail against the dead API server")
        await asyncio.sleep(outage)  # the fault's length; Kopf alone gives up on a watch after 54 s
    back = time.monotonic()

    async def drained() -> bool:  # the agent finished the resize: the free 10G slices went, the held ones stay
        return {n for n in of_policy(await devices(fkube, node), policy) if "-10g-" in n} == before

    await wait_for(drained, within=RECOVERY, what="the agent to finish the resize after the restart")
    # An edit made after the restart, for both: the controller judges it (observedGeneration), the agent
    # publishes it (back to 10G: the free 20G slices drain and go).
    edited = await fkube.merge_patch(f"{POLICIES}/{policy}", {"spec": {
        "slicing": {"sliceSize": "10G"}, "tenants": [{"namespace": fns, "maxSlices": 6}]}})

    async def judged() -> bool:
        body = await fkube.get(f"{POLICIES}/{policy}")
        return bool((body.get("status") or {}).get("observedGeneration") == edited["metadata"]["generation"])

    await wait_for(judged, within=RECOVERY + API_SERVER_MAPPER,
                   what="the controller to act on an edit made after the restart")
    controlled = time.monotonic() - back

    async def published_again() -> bool:
        found = of_policy(await devices(fkube, node), policy)
        return len([n for n in found if "-10g-" in n]) == 16 and not [n for n in found if "-20g-" in n]

    await wait_for(published_again, within=RECOVERY + API_SERVER_MAPPER,
                   what="the agent to publish an edit made after the restart")
    resized = time.monotonic() - back
    assert {c.name: c.pid for c in ours} == pids, "nothing restarted itself"
    assert all(c.running for c in ours)
    assert before <= set(of_policy(await settled_devices(fkube, node), policy)), "the allocated 10G slices were kept"
    assert {d["device"] for d in await allocated(fkube, fns, pods)} == before
    print(f"recovery after the API server restart: agent {resized:.1f} s, controller {controlled:.1f} s")


async def test_an_agent_killed_between_the_writes_of_a_generation_converges_without_losing_allocations(
    faults_cluster: DevCluster, fkube: KubeClient, fns: str, fpolicy: PolicyMaker, invariants: InvariantChecker,
) -> None:
    node = NODES[1]
    agent = faults_cluster.component(f"gpuslice-agent-{node}")
    policy = await fpolicy(fns, node, {"mode": "memory", "sliceSize": "2G"})  # 2 x 42 devices: 3 slices
    await wait_devices(fkube, node, policy, 84, "-2g-")
    pods = ["k0", "k1", "k2"]
    await create_pods(fkube, fns, "gpu-slice", pods)
    before = {d["device"] for d in await settled(fkube, fns, pods)}
    try:
        await restart_armed(agent, "agent.slice-written=kill@2")
        await fkube.merge_patch(f"{POLICIES}/{policy}", {"spec": {"slicing": {"sliceSize": "4G"}}})
        await killed(agent)
        half = await pool_slices(fkube, node)
        assert len({s["spec"]["pool"]["generation"] for s in half}) == 2, "killed halfway through a generation"
    finally:
        await restart_armed(agent, None)

    async def whole() -> list[dict[str, Any]] | None:
        slices = await pool_slices(fkube, node)  # one read: what is checked is what was published at once
        pools, _ = complete_pools(slices)
        found = of_policy(pools.get(node), policy)
        done = sum("-4g-" in n for n in found) == 2 * 21 and {n for n in found if "-2g-" in n} == before
        return slices if done else None

    slices = await wait_for(whole, within=60, what="the restarted agent to finish the resize, keeping the held slices")
    assert_pool_whole(slices)
    assert {d["device"] for d in await allocated(fkube, fns, pods)} == before


async def test_the_controller_killed_between_applies_converges_with_no_duplicate_objects(
    faults_cluster: DevCluster, fkube: KubeClient, fns: str, fpolicy: PolicyMaker, invariants: InvariantChecker,
) -> None:
    """A policy whose first converge is cut short by a crash ends with exactly the objects of a twin
    policy that converged undisturbed, each once."""
    controller = faults_cluster.component("gpuslice-controller")
    node = NODES[0]
    first = await fpolicy(fns, node, {"mode": "memory", "sliceSize": "20G"}, template="first")
    await wait_devices(fkube, node, first, 8, "-20g-")
    await create_pods(fkube, fns, "first", ["c0"])
    before = {d["device"] for d in await settled(fkube, fns, ["c0"])}
    other = await create_namespace(fkube, f"{fns}-o")
    twin, crashed = f"{first}-twin", f"{first}-crash"

    def spec(template: str) -> dict[str, Any]:
        return {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
                "slicing": {"mode": "memory", "sliceSize": "10G"},
                "tenants": [{"namespace": fns, "maxSlices": 2}, {"namespace": other, "maxSlices": 1}],
                "claimTemplateName": template}

    async def ready(name: str) -> bool:
        body = await fkube.get(f"{POLICIES}/{name}")
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in (body.get("status") or {}).get("conditions") or [])

    try:
        await fkube.create(POLICIES, {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
                                      "metadata": {"name": twin}, "spec": spec("twin")})
        await wait_for(lambda: ready(twin), within=60, what="the twin policy to converge undisturbed")
        await restart_armed(controller, "controller.object-applied=kill@2")
        await fkube.create(POLICIES, {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
                                      "metadata": {"name": crashed}, "spec": spec("crash")})
        await killed(controller)
        partial = await _owned(fkube, crashed)
        assert 0 < sum(partial.values()) < sum((await _owned(fkube, twin)).values()), "killed halfway"
        await restart_armed(controller, None)

        await wait_for(lambda: ready(crashed), within=60, what="the restarted controller to converge the policy")
        reference = await _owned(fkube, twin)
        converged = await _owned(fkube, crashed)
        assert set(converged.values()) == {1}, f"duplicates: {converged}"
        renamed = {(kind, ns, name.replace(crashed, twin).replace("crash", "twin")): n
                   for (kind, ns, name), n in converged.items()}
        assert renamed == reference
        await wait_devices(fkube, node, crashed, 16, "-10g-")
        assert {d["device"] for d in await allocated(fkube, fns, ["c0"])} == before, "no allocation lost"
    finally:
        for name in (twin, crashed):
            with contextlib.suppress(NotFound):
                await fkube.delete(f"{POLICIES}/{name}")
        await delete_namespace(fkube, other)
        if not controller.running:
            await restart_armed(controller, None)


async def _owned(kube: KubeClient, policy: str) -> Counter[tuple[str, str, str]]:
    """Every object labelled as the policy's, by kind, namespace and name (a duplicate counts twice)."""
    found: Counter[tuple[str, str, str]] = Counter()
    for path, kind in ((f"{RESOURCE}/deviceclasses", "DeviceClass"),
                       (f"{RESOURCE}/resourceclaimtemplates", "ResourceClaimTemplate"),
                       ("/api/v1/resourcequotas", "ResourceQuota"),
                       ("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", "ValidatingAdmissionPolicy"),
                       ("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
                        "ValidatingAdmissionPolicyBinding")):
        for item in await kube.list(path, labelSelector=f"gpuslice.dev/policy={policy}"):
            found[(kind, item["metadata"].get("namespace", ""), item["metadata"]["name"])] += 1
    return found


async def test_an_agent_killed_before_saving_its_record_and_wiped_keeps_the_device_a_claim_got(
    faults_cluster: DevCluster, fkube: KubeClient, fns: str, fpolicy: PolicyMaker, invariants: InvariantChecker,
) -> None:
    """T9 of the December hostile review. The agent saves what it published (published.json), and
    republishes from it when the kubelet has wiped its pool. Killed after writing a generation but
    before saving it, then wiped, then the plan changed: a device a claim got from that generation
    was in neither the record nor the pool, so nothing held it, and it vanished under its claim.
    The record of a generation is now saved before the generation is written."""
    node = NODES[1]
    agent = faults_cluster.component(f"gpuslice-agent-{node}")
    policy = await fpolicy(fns, node, {"mode": "memory", "sliceSize": "20G"})
    await wait_devices(fkube, node, policy, 8, "-20g-")
    await alone_on(fkube, node, policy)
    try:
        await restart_armed(agent, "agent.pool-written=kill")
        await fkube.merge_patch(f"{POLICIES}/{policy}", {"spec": {"slicing": {"sliceSize": "40G"}}})
        await killed(agent)  # the generation with the 40G devices is written, its record not saved (before)
        await wait_devices(fkube, node, policy, 4, "-40g-")
        invariants.expect_wipe(node)
        await create_pods(fkube, fns, "gpu-slice", ["t9"])
        [result] = await settled(fkube, fns, ["t9"])
        got = result["device"]
        assert "-40g-" in got, "allocated from the generation the agent wrote last"

        # The kubelet wipes a driver's slices 30 s after its plugin went away (the plugin tier shows it
        # with the pod runner; this tier runs no kubelet): its deletes, made here.
        for item in await pool_slices(fkube, node):
            await fkube.delete(f"{RESOURCE}/resourceslices/{item['metadata']['name']}")
        # The plan changes while the agent is away: the 40G devices are to go.
        await fkube.merge_patch(f"{POLICIES}/{policy}", {"spec": {"slicing": {"sliceSize": "20G"}}})
    finally:
        await restart_armed(agent, None)

    async def held() -> dict[str, Any] | None:
        device = of_policy(await devices(fkube, node), policy).get(got)
        taints = [t["key"] for t in (device or {}).get("taints") or []]
        return device if "gpuslice.dev/pending-change" in taints else None

    await wait_for(held, within=60, what=f"the restarted agent to publish {got} again, held for its claim")
    # The new plan around it: all eight 20G slices (the GPU's counters keep the held 40G from being
    # counted twice), and the other 40G devices gone.
    await wait_devices(fkube, node, policy, 8, "-20g-")
    await wait_devices(fkube, node, policy, 1, "-40g-")
    await invariants.check()
    invariants.assert_held()
    assert {d["device"] for d in await allocated(fkube, fns, ["t9"])} == {got}
