"""Hostile review, December (third round), D: Auto defragmentation evicts no one for a pod that
could not run once the GPU is free, whatever keeps it off the node.

The fix for D (f535cec) judges the waiting claim as the admission rules and the maxMemory webhook
will, and the pod's node selector, required node affinity and tolerations. The scheduler judges
more than that before it allocates a claim: the node's CPU, memory and pods left (NodeResourcesFit),
the pod's scheduling gates, pod (anti-)affinity, topology spread. A tenant with no maxMemory at all
makes a pod that asks for a whole GPU and for 1000 CPUs (no node has them): its claim "would be
allocated" by every judge gpuslice asks, so Auto evicts another tenant's pod to free a GPU for it,
and the GPU stays reserved for the move's timeout while the pod never runs.

A promise test: it asserts no victim is evicted, so it fails while the hole is open.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import pod_with_claim, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.plugin.defrag_fleet import GPUS, SLICING, Fragmented
from tests.cluster.plugin.plugin_nodes import PluginNodeFactory, pod_events
from tests.cluster.pools import SLICES

TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"


async def _fleet(kube: KubeClient, cluster: DevCluster, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
                 victim: str, attacker: str) -> Fragmented:
    node = await plugin_node("h100-80gb", GPUS)
    body = await make_policy({
        "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}}, "slicing": SLICING,
        "tenants": [{"namespace": victim}, {"namespace": attacker}],
        "defragmentation": {"mode": "Auto", "maxEvictionsPerHour": 10, "minPendingSeconds": 0}})

    async def ready() -> bool:
        devices = [d for s in await kube.list(SLICES, fieldSelector=f"spec.nodeName={node.name}")
                   for d in s["spec"].get("devices") or []]
        if len(devices) != GPUS * 5:
            return False
        for ns in (victim, attacker):
            try:
                await kube.get(f"{TEMPLATES.format(namespace=ns)}/gpu-slice-full")
            except KubeError:
                return False
        return True

    await wait_for(ready, within=90, what="devices published and the tenants' templates")
    fleet = Fragmented(kube, cluster, node, str(body["metadata"]["name"]))
    # GPU 0 and 1: a Deployment pod of the victim each; GPU 2: two bare 20G pods of the attacker.
    await fleet.lay_out([[("dep", "web-a", victim)], [("dep", "web-b", victim)],
                         [("bare", "hold-0", attacker), ("bare", "hold-1", attacker)]])
    return fleet


async def _watch(kube: KubeClient, fleet: Fragmented, victim: str, attacker: str, pod: str,
                 before: dict[str, str]) -> tuple[list[str], dict[str, Any]]:
    async def victim_moved() -> list[str] | None:
        now = await fleet.uids([victim])
        gone = [p for p, uid in before.items() if now.get(p) != uid]
        return gone or None

    async def told() -> bool:
        return any(e.get("reason") == "DefragmentationBlocked" for e in await pod_events(kube, attacker, pod))

    async def moved_or_told() -> bool:
        return bool(await victim_moved()) or await told()

    with contextlib.suppress(AssertionError):
        await wait_for(moved_or_told, within=60, what="a victim evicted, or the waiting pod told why not")
    await asyncio.sleep(5)  # length: two more of Auto's looks (every 2 s in the tests), any of which could evict
    evicted = await victim_moved() or []
    moved = [e.get("message") for p in before for e in await pod_events(kube, victim, p.split("/")[1])
             if "moved by gpuslice" in (e.get("message") or "")]
    status = await fleet.policy_status()
    waiting = await kube.get(f"/api/v1/namespaces/{attacker}/pods/{pod}")
    print(f"D[{pod}] victim pods evicted:", evicted)
    print(f"D[{pod}] victim pods told:", moved)
    print(f"D[{pod}] waiting pod told:", [(e.get("reason"), e.get("message")) for e in
                                        await pod_events(kube, attacker, pod)][-4:])
    print(f"D[{pod}] waiting pod node:", waiting["spec"].get("nodeName"), "| conditions:",
          [(c.get("reason"), c.get("message")) for c in (waiting.get("status") or {}).get("conditions") or []])
    print(f"D[{pod}] policy defragmentation:", status.get("defragmentation"))
    print(f"D[{pod}] devices tainted for the move:", await fleet.defrag_tainted())
    return evicted, status


async def test_auto_defrag_evicts_no_one_for_a_pod_no_node_has_the_cpu_for(
    kube: KubeClient, cluster: DevCluster, controller: ControllerProcess, make_policy: PolicyFactory,
    plugin_node: PluginNodeFactory, namespace: str, namespaces: Callable[..., Awaitable[str]],
) -> None:
    victim, attacker = namespace, await namespaces("atk")
    fleet = await _fleet(kube, cluster, make_policy, plugin_node, victim, attacker)
    before = await fleet.uids([victim])
    big: dict[str, Any] = pod_with_claim("big", "gpu-slice-full")
    big["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1000"}  # no node has 1000 CPUs
    await kube.create(f"/api/v1/namespaces/{attacker}/pods", big)
    evicted, status = await _watch(kube, fleet, victim, attacker, "big", before)
    assert not evicted, (f"the controller evicted {evicted} of tenant {victim} to free a GPU for {attacker}/big,"
                         " a pod no node has the CPU for: it never runs, the eviction was for nothing")
    assert not (status.get("defragmentation") or {}).get("inFlight"), "a GPU is reserved for a pod that cannot run"


async def test_auto_defrag_evicts_no_one_for_a_pod_held_by_a_scheduling_gate(
    kube: KubeClient, cluster: DevCluster, controller: ControllerProcess, make_policy: PolicyFactory,
    plugin_node: PluginNodeFactory, namespace: str, namespaces: Callable[..., Awaitable[str]],
) -> None:
    """A pod with a scheduling gate is not even tried by the scheduler until its gate is removed (by
    the tenant, whenever it likes): freeing a GPU for it is for nothing, or reserves one for a pod
    the tenant starts when it wants."""
    victim, attacker = namespace, await namespaces("atk")
    fleet = await _fleet(kube, cluster, make_policy, plugin_node, victim, attacker)
    before = await fleet.uids([victim])
    gated: dict[str, Any] = pod_with_claim("gated", "gpu-slice-full")
    gated["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    await kube.create(f"/api/v1/namespaces/{attacker}/pods", gated)
    claim_made = None
    for _ in range(20):
        status = (await kube.get(f"/api/v1/namespaces/{attacker}/pods/gated")).get("status") or {}
        if claim_made := [s for s in status.get("resourceClaimStatuses") or [] if s.get("resourceClaimName")]:
            break
        await asyncio.sleep(1)  # length: one read a second, up to 20, of the gated pod's claim status
    print("D[gated] claim made for the gated pod:", claim_made)
    evicted, status = await _watch(kube, fleet, victim, attacker, "gated", before)
    assert not evicted, (f"the controller evicted {evicted} of tenant {victim} to free a GPU for {attacker}/gated,"
                         " a pod the scheduler does not try while its scheduling gate is on")
    assert not (status.get("defragmentation") or {}).get("inFlight"), "a GPU is reserved for a gated pod"
