"""The node agent publishes policies as devices and the real scheduler allocates them:
no GPU is ever over-allocated, whatever the mode."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.dra.quantity import quantity_bytes
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.planning.mig_placement import parse_mig_device_name
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import PAUSE_IMAGE, RESOURCE, condition, get_or_none, taint_rules, wait_for
from tests.cluster.observe import agent_cycles, scheduler_settled, total
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import (
    H100,
    SLICES,
    G,
    allocated_results,
    create_pods,
    memory_of,
    pool,
    pool_devices,
    pool_versions,
    published,
    settle,
    tag,
    tenant_policy,
)


async def test_nine_pods_on_an_h100_sliced_in_10g_eight_fit(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    name = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10G"})
    devices = await published(kube, node.name, 8)
    assert all(d["attributes"]["gpuslice.dev/policy"]["string"] == name for d in devices.values())

    pods = [f"w{i}" for i in range(9)]
    await create_pods(kube, namespace, "gpu-slice", pods)
    results = await settle(cluster, kube, namespace, pods, 8)
    assert memory_of(devices, results) == 80 * G
    assert len({r["device"] for r in results}) == 8

    async def counted() -> bool:
        status = (await kube.get(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}")).get("status") or {}
        return status.get("slices") == {"published": 8, "allocated": 8}

    await wait_for(counted, within=45, what="the policy status to count 8 published and 8 allocated")


async def test_two_policies_on_one_gpu_stay_within_its_memory(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "20G"}, "-20", "twenty")
    await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10G"}, "-10", "ten")
    devices = await published(kube, node.name, 8 + 4)
    big, small = [f"b{i}" for i in range(3)], [f"s{i}" for i in range(5)]
    await create_pods(kube, namespace, "twenty", big)
    await create_pods(kube, namespace, "ten", small)
    # 3 x 20G + 5 x 10G = 110G asked of an 85.5G GPU: whatever the scheduler picks stays within the GPU,
    # and it stops only when no waiting pod fits what is left (5 x 10 + 1 x 20 = 70G is such an end).
    async def full() -> list[dict[str, Any]] | None:
        results = await allocated_results(kube, namespace, big + small)
        free = H100 - memory_of(devices, results)
        sizes = [quantity_bytes(devices[r["device"]]["capacity"]["memory"]["value"]) for r in results]
        waiting = [20 * G] * (len(big) - sizes.count(20 * G)) + [10 * G] * (len(small) - sizes.count(10 * G))
        return results if not any(size <= free for size in waiting) else None

    results = await wait_for(full, within=90, what="the GPU to fill up until no waiting pod fits")
    await scheduler_settled(cluster)  # every waiting pod tried again since: none may have fit
    final = await allocated_results(kube, namespace, big + small)
    assert len(final) >= len(results)
    assert memory_of(devices, final) <= H100


async def test_shared_capacity_is_rounded_and_never_exceeded(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    name = await tenant_policy(make_policy, namespace, node.name, {"mode": "shared", "sliceSize": "10G"})
    [device] = (await published(kube, node.name, 1)).values()
    assert device["allowMultipleAllocations"] is True
    klass = f"{name}.gpuslice.dev"
    asks = {"a": "10G", "b": "30G", "c": "15G", "d": "20G", "e": "10G"}  # c rounds up to 20G; e no longer fits
    await wait_for(lambda: get_or_none(kube, f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates/gpu-slice"),
                   what="template")
    for pod, memory in asks.items():
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": f"claim-{pod}"},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                     "deviceClassName": klass, "capacity": {"requests": {"memory": memory}}}}]}}}
        await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", claim)
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
            "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": f"claim-{pod}"}]},
        })
        if pod != "e":  # one at a time, so the last one is the one that does not fit
            async def allocated(pod: str = pod) -> bool:
                claim = await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/claim-{pod}")
                return bool((claim.get("status") or {}).get("allocation"))

            await wait_for(allocated, within=60, what=f"claim-{pod} to be allocated")

    consumed = {}
    for pod in "abcd":
        claim = await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/claim-{pod}")
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] == device["name"]
        assert result["shareID"]
        consumed[pod] = quantity_bytes(result["consumedCapacity"]["memory"])
    assert consumed == {"a": 10 * G, "b": 30 * G, "c": 20 * G, "d": 20 * G}
    await scheduler_settled(cluster)  # claim-e's pod was tried, and parked
    last = await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/claim-e")
    assert not (last.get("status") or {}).get("allocation"), "80G of the GPU's 85.5G are taken; the next claim must wait"


async def test_dynamic_mig_placements_never_overlap(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    node = await gpu_node("a100-40gb", 1)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "mig", "mig": {"profiles": ["1g.5gb", "3g.20gb"]}})
    devices = await published(kube, node.name, 7 + 2)
    pods = [f"m{i}" for i in range(8)]
    await create_pods(kube, namespace, "gpu-slice", pods)
    results = await settle(cluster, kube, namespace, pods, 7)
    used: set[int] = set()
    for result in results:
        parsed = parse_mig_device_name(result["device"])
        assert parsed is not None
        cells = {int(k.rsplit("-", 1)[1]) for k in
                 devices[result["device"]]["consumesCounters"][0]["counters"] if k.startswith("memory-slice-")}
        assert not used & cells, f"{result['device']} overlaps another allocated placement"
        used |= cells


async def test_resize_while_claims_hold_slices_waits_for_them(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    name = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10G"})
    before = await published(kube, node.name, 8)
    pods = ["h0", "h1"]
    await create_pods(kube, namespace, "gpu-slice", pods)
    results = await settle(cluster, kube, namespace, pods, 2)
    held = {r["device"] for r in results}

    await kube.merge_patch(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}",
                           {"spec": {"slicing": {"sliceSize": "20G"}}})

    def twenty(devices: dict[str, Any]) -> set[str]:
        return {n for n in devices if "-20g-" in n}

    async def draining() -> dict[str, dict[str, Any]] | None:
        devices = await pool_devices(kube, node.name)
        return devices if len(twenty(devices)) == 4 and set(before) <= set(devices) else None

    # First every 10Gi slice drains, tainted, next to the new 20Gi ones under the same counters: the
    # scheduler may have picked a free one already and not yet written the claim.
    first = await wait_for(draining, within=30, what="20Gi slices next to all the 10Gi ones, draining")
    assert all(first[n].get("taints") for n in before), "every changing device is tainted while it drains"

    async def resized() -> dict[str, dict[str, Any]] | None:
        devices = await pool_devices(kube, node.name)
        return devices if set(devices) == held | twenty(devices) and len(twenty(devices)) == 4 else None

    during = await wait_for(resized, within=30, what="the free 10Gi slices to go once drained, the held ones to stay")
    for device in held:
        kept = during[device]
        assert kept["consumesCounters"] == before[device]["consumesCounters"], "an allocated device never changes"
        assert [(t["key"], t["effect"]) for t in kept["taints"]] == [("gpuslice.dev/pending-change", "NoSchedule")]

    async def pending_reported() -> dict[str, Any] | None:
        body = await kube.get(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}")
        found = condition(body, "Degraded")
        return found if found.get("reason") == "ChangePending" else None

    degraded = await wait_for(pending_reported, within=30, what="the policy status to say a change is pending")
    assert degraded["status"] == "True"
    assert degraded["message"].startswith("2 allocated devices keep their old shape")

    versions = await pool_versions(kube, node.name)
    cycles = total(await node.metrics(), "gpuslice_agent_publish_cycles_total")
    await agent_cycles(kube, node.name, node.metrics)
    assert await pool_versions(kube, node.name) == versions, "a held change writes nothing while it waits"
    after = total(await node.metrics(), "gpuslice_agent_publish_cycles_total")
    assert after - cycles <= 2 + 2, "and does not spin: a held device waits on its claim, not on a timer"

    for pod in pods:
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{pod}", gracePeriodSeconds=0)

    async def applied() -> bool:
        devices = await pool_devices(kube, node.name)
        return sorted(devices) == [f"{tag(node.name)}-{name}-20g-{k}" for k in range(4)] and not any(
            d.get("taints") for d in devices.values())

    await wait_for(applied, within=60, what="the held change to apply once the claims are gone")


async def test_invalid_edit_keeps_what_was_published(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    name = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10G"})
    await published(kube, node.name, 8)
    versions = await pool_versions(kube, node.name)
    path = f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}"

    await kube.merge_patch(path, {"spec": {"slicing": {"sliceSize": "100Gi"}}})  # larger than the GPU

    async def invalid() -> bool:
        body = await kube.get(path)
        return bool(condition(body, "Valid").get("status") == "False"
                    and body["status"].get("observedGeneration") == body["metadata"]["generation"])

    await wait_for(invalid, what="the controller to find the edit invalid")
    await agent_cycles(kube, node.name, node.metrics)  # the agent planned from the invalid spec
    assert await pool_versions(kube, node.name) == versions, "an invalid spec changes nothing that was published"

    await kube.merge_patch(path, {"spec": {"slicing": {"sliceSize": "40G"}}})

    async def applied() -> bool:
        return sorted(await pool_devices(kube, node.name)) == [f"{tag(node.name)}-{name}-40g-{k}" for k in range(2)]

    await wait_for(applied, within=30, what="the valid edit to apply")


async def test_agent_restart_rewrites_nothing_and_node_deletion_removes_the_pool(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    node = await gpu_node("l40s", 2)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "12Gi",
                                                            "allowFullGpu": True})
    await published(kube, node.name, 2 * (3 + 1))  # an L40S has 46,068 MiB: three 12Gi slices
    versions = {s["metadata"]["name"]: (s["metadata"]["resourceVersion"], s["spec"]["pool"]["generation"])
                for s in await pool(kube, node.name)}
    await node.restart_agent()

    async def first_cycle() -> dict[str, float] | None:
        samples = await node.metrics()
        return samples if samples.get('gpuslice_agent_publish_cycles_total{outcome="unchanged"}') else None

    samples = await wait_for(first_cycle, within=30, what="the restarted agent's first publish cycle")
    assert 'gpuslice_agent_publish_cycles_total{outcome="written"}' not in samples
    assert samples["gpuslice_agent_devices"] == 8
    assert node.agent.running
    after = {s["metadata"]["name"]: (s["metadata"]["resourceVersion"], s["spec"]["pool"]["generation"])
             for s in await pool(kube, node.name)}
    assert after == versions, "a restarted agent publishes the same slices without a write"

    await node.agent.stop()
    await kube.delete(f"/api/v1/nodes/{node.name}")

    async def collected() -> bool:
        return await pool(kube, node.name) == []

    await wait_for(collected, within=60, what="garbage collection of a deleted node's slices")


async def test_agent_may_write_only_its_own_nodes_slices(gpu_node: GpuNodeFactory, kube: KubeClient) -> None:
    mine, other = await gpu_node("l4", 1), await gpu_node("l4", 1)
    async with await KubeClient.from_kubeconfig(mine.kubeconfig) as as_agent:
        foreign = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{other.name}-x"},
                   "spec": {"driver": "gpu.gpuslice.dev", "nodeName": other.name,
                            "pool": {"name": other.name, "generation": 1, "resourceSliceCount": 1}, "devices": []}}
        with pytest.raises(KubeError) as denied:
            await as_agent.create(SLICES, foreign)
        # On its own node, still only our driver, in the pool named after the node.
        other_driver = {**foreign, "metadata": {"name": f"{mine.name}-d"},
                        "spec": {**foreign["spec"], "nodeName": mine.name, "driver": "other.example.com",
                                 "pool": {"name": mine.name, "generation": 1, "resourceSliceCount": 1}}}
        other_pool = {**foreign, "metadata": {"name": f"{mine.name}-p"},
                      "spec": {**foreign["spec"], "nodeName": mine.name}}  # the other node's pool name
        for body in (other_driver, other_pool):
            with pytest.raises(KubeError, match="may write only its own node's ResourceSlices"):
                await as_agent.create(SLICES, body)
    assert denied.value.status == 403
    assert f"gpuslice agent on node {mine.name} may write only its own node's ResourceSlices" in denied.value.message


async def test_policy_taints_travel_on_its_devices_and_reach_allocated_ones_at_once(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    """A taint is part of the device the agent publishes (no DeviceTaintRule per device): the
    scheduler keeps new claims off tainted devices, and an allocated device gets the taint at
    once (it changes who may use the device, not what the claim holds)."""
    node = await gpu_node("h100-80gb", 1)
    name = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10G"})
    await published(kube, node.name, 8)
    await create_pods(kube, namespace, "gpu-slice", ["before"])
    [result] = await settle(cluster, kube, namespace, ["before"], 1)
    taint = {"key": "gpuslice.dev/maintenance", "value": "planned", "effect": "NoSchedule"}
    await kube.merge_patch(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}", {"spec": {"taints": [taint]}})

    async def tainted() -> dict[str, dict[str, Any]] | None:
        devices = await pool_devices(kube, node.name)
        keys = [[(t["key"], t.get("value", ""), t["effect"]) for t in d.get("taints") or []] for d in devices.values()]
        return devices if keys and all(k == [(taint["key"], taint["value"], taint["effect"])] for k in keys) else None

    devices = await wait_for(tainted, within=30, what="the policy's taint on every device, the allocated one too")
    assert len(devices) == 8
    assert result["device"] in devices
    assert not await taint_rules(kube, labelSelector=f"gpuslice.dev/policy={name}")
    await create_pods(kube, namespace, "gpu-slice", ["after"])
    # "after" is unschedulable: every free device is tainted
    await settle(cluster, kube, namespace, ["before", "after"], 1)

    await kube.merge_patch(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}", {"spec": {"taints": []}})
    await settle(cluster, kube, namespace, ["before", "after"], 2)


async def test_claims_are_read_only_when_a_published_device_would_change(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    """At 1,000 nodes every agent listing every claim on every cycle is a thousand cluster-wide
    lists per burst. Cycles that change no published device read no claim; a resize does."""
    node = await gpu_node("h100-80gb", 1)
    name = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10G"})
    await published(kube, node.name, 8)
    await create_pods(kube, namespace, "gpu-slice", ["p0", "p1"])
    await settle(cluster, kube, namespace, ["p0", "p1"], 2)
    reads = 'gpuslice_agent_claim_reads_total{outcome="read"}'
    skipped = 'gpuslice_agent_claim_reads_total{outcome="skipped"}'
    before = await node.metrics()
    for count, value in enumerate(("a", "b", "c"), start=1):  # a Node event: a cycle that changes nothing
        await kube.merge_patch(f"/api/v1/nodes/{node.name}", {"metadata": {"labels": {"probe": value}}})

        async def cycled(count: int = count) -> dict[str, float] | None:
            samples = await node.metrics()
            return samples if samples.get(skipped, 0) >= before.get(skipped, 0) + count else None

        after = await wait_for(cycled, within=30, what=f"publish cycle {count} after a Node event")
    assert after.get(reads, 0) == before.get(reads, 0), "cycles that change no device must not read claims"
    await kube.merge_patch(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}",
                           {"spec": {"slicing": {"sliceSize": "20G"}}})

    async def read() -> bool:
        return (await node.metrics()).get(reads, 0) > before.get(reads, 0)

    await wait_for(read, within=30, what="a resize to read the claims")
