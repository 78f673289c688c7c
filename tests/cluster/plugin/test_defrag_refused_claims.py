"""Auto defragmentation evicts no one for a claim that would not be allocated once the GPU is free.

The attack: a tenant at its maxMemory (40G held of 100G) makes one pod that waits for a whole GPU
(79.6Gi): alone it fits no GPU, and together with what the tenant holds it passes its limit. Were
a GPU freed for it, another tenant's pod would be evicted, the GPU reserved for the move's timeout,
and the allocation refused by the maxMemory webhook. So would it for a claim whose CEL selector no
device matches, and for a pod whose node affinity keeps it off every GPU node. Each is told why
(DefragmentationBlocked on the pod) and nothing is evicted."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import pod_with_claim, wait_for
from tests.cluster.observe import defrag_looked
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory, WebhookProcess
from tests.cluster.plugin.defrag_fleet import GPUS, SLICING, Fragmented
from tests.cluster.plugin.plugin_nodes import PluginNodeFactory, pod_events
from tests.cluster.pools import SLICES
from tests.cluster.webhook.budgets import memory_in_force

TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"


async def told(kube: KubeClient, namespace: str, pod: str, text: str) -> list[str]:
    return [str(e.get("message")) for e in await pod_events(kube, namespace, pod)
            if e.get("reason") == "DefragmentationBlocked" and text in str(e.get("message"))]


async def test_auto_defrag_evicts_no_one_for_a_claim_that_would_be_refused_or_kept_off_the_gpus(
    kube: KubeClient, cluster: DevCluster, controller: ControllerProcess, memory_webhook: WebhookProcess,
    make_policy: PolicyFactory, plugin_node: PluginNodeFactory, namespace: str,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    victim = namespace
    attacker = await namespaces("atk")
    other = await namespaces("sel")  # no maxMemory: its selectors and affinity are what would make it for nothing
    node = await plugin_node("h100-80gb", GPUS)
    body = await make_policy({
        "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}}, "slicing": SLICING,
        "tenants": [{"namespace": victim}, {"namespace": attacker, "maxMemory": "100G"}, {"namespace": other}],
        "defragmentation": {"mode": "Auto", "maxEvictionsPerHour": 10, "minPendingSeconds": 0}})
    policy = str(body["metadata"]["name"])

    async def ready() -> bool:
        devices = [d for s in await kube.list(SLICES, fieldSelector=f"spec.nodeName={node.name}")
                   for d in s["spec"].get("devices") or []]
        if len(devices) != GPUS * 5:
            return False
        for ns in (victim, attacker, other):
            try:
                await kube.get(f"{TEMPLATES.format(namespace=ns)}/gpu-slice-full")
            except KubeError:
                return False
        return True

    await wait_for(ready, within=90, what="devices published and the tenants' templates")
    await memory_in_force(kube, policy, attacker, "100G")
    fleet = Fragmented(kube, cluster, node, policy)
    # GPU 0 and 1: one Deployment pod of the victim each; GPU 2: two bare 20G pods of the attacker
    # (it holds 40G of its 100G: a whole GPU, 80G, alone fits its maxMemory, with the 40G it does not).
    await fleet.lay_out([[("dep", "web-a", victim)], [("dep", "web-b", victim)],
                         [("bare", "hold-0", attacker), ("bare", "hold-1", attacker)]])
    before = await fleet.uids([victim])
    await kube.create(f"/api/v1/namespaces/{attacker}/pods", pod_with_claim("big", "gpu-slice-full"))
    # The other tenant: a whole GPU narrowed by a selector no device matches, and one for a pod that
    # may only go to a node with no GPU.
    full = await kube.get(f"{TEMPLATES.format(namespace=other)}/gpu-slice-full")
    spec = full["spec"]
    spec["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "device.attributes['gpuslice.dev'].index == 99"}}]
    await kube.create(TEMPLATES.format(namespace=other), {"apiVersion": "resource.k8s.io/v1",
                                                          "kind": "ResourceClaimTemplate",
                                                          "metadata": {"name": "never"}, "spec": spec})
    await kube.create(f"/api/v1/namespaces/{other}/pods", pod_with_claim("selected", "never"))
    elsewhere: dict[str, Any] = pod_with_claim("elsewhere", "gpu-slice-full")
    elsewhere["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                     "values": ["a-node-with-no-gpu"]}]}]}}}
    await kube.create(f"/api/v1/namespaces/{other}/pods", elsewhere)

    async def victim_moved() -> list[str] | None:
        now = await fleet.uids([victim])
        gone = [p for p, uid in before.items() if now.get(p) != uid]
        return gone or None

    async def all_told() -> bool:
        return bool(await told(kube, attacker, "big", "maxMemory")
                    and await told(kube, other, "selected", "CEL selectors")
                    and await told(kube, other, "elsewhere", "node affinity"))

    async def moved_or_told() -> bool:
        return bool(await victim_moved()) or await all_told()

    with contextlib.suppress(AssertionError):
        await wait_for(moved_or_told, within=60, what="a victim evicted, or the three waiting pods told why not")
    await defrag_looked(kube, controller, fleet.policy, victim)  # two more of Auto's looks
    evicted = await victim_moved()
    moved = [e.get("message") for p in before for e in await pod_events(kube, victim, p.split("/")[1])
             if "moved by gpuslice" in (e.get("message") or "")]
    print("victim pods evicted:", evicted)
    print("victim pods told:", moved)
    print("the waiting pods told:", await told(kube, attacker, "big", ""), await told(kube, other, "selected", ""),
          await told(kube, other, "elsewhere", ""))
    print("policy defragmentation:", (await fleet.policy_status()).get("defragmentation"))
    assert not evicted, (f"the controller evicted {evicted} of tenant {victim} to free a GPU for a pod whose claim"
                         " would not be allocated on it")
    assert not (await fleet.policy_status()).get("defragmentation", {}).get("inFlight"), "a GPU is reserved"
    [message] = (await told(kube, attacker, "big", "maxMemory"))[-1:]
    assert "would not be allocated once a GPU is free" in message or "maxMemory" in message, message
    assert await told(kube, other, "selected", "CEL selectors"), "the pod with selectors was not told why"
    assert await told(kube, other, "elsewhere", "node affinity"), "the pod kept off the GPU nodes was not told why"
