"""Each pod's real GPU use on fake nodes: the pod runner serves the kubelet's PodResources API from the
kubelet's own server code, the fake backend lists the processes `gpuslice fake-gpu use` puts on a GPU, and
each process's cgroup (written where the agent's --host-proc reads, as a container's would read on a node)
names its pod. The agent measures every pod against its allocation, exports it, sums it per tenant, and
marks a pod over its slice on its claim (a metric, a condition naming the pod); the controller posts the
pod's Event and evicts it where its policy says so (a PodDisruptionBudget holds it). The agent's own token
can neither evict nor post Events on pods, and marks only its own node's claims."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuslice.agent.usage.podresources import PodResources
from gpuslice.devcluster import operator
from gpuslice.devcluster.cluster import DevCluster
from gpuslice.devcluster.nodes import fake_gpu_node
from gpuslice.kube.client import Forbidden, Invalid, KubeClient, KubeError
from tests.cluster.cli import Cli
from tests.cluster.gpu_nodes import cluster_ca
from tests.cluster.kubeutil import pod_claim, wait_for
from tests.cluster.metric_names import served
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.plugin.gpu_use import FAST, claim_condition, in_pod, metric_is, overuse_entry, pod_uid, use
from tests.cluster.plugin.plugin_nodes import (
    PluginNode,
    PluginNodeFactory,
    event_with,
    gone,
    one_gpu_with_pods,
    pod_events,
    pod_phase,
    running,
    scraped,
)
from tests.cluster.pools import create_pods, published, tenant_policy
from tests.monitoring_queries import expressions, selectors

GPU_BACKENDS = ("fake", "nvml")  # each test on the fake backend and on the mock NVML library

GI = 1024**3


async def test_the_pod_runner_serves_the_kubelets_pod_resources(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    node, _ = await one_gpu_with_pods(kube, make_policy, plugin_node, namespace, {"mode": "memory", "sliceSize": "20G"},
                                      4, ["p"])
    claim = await pod_claim(kube, namespace, "p")
    assert claim is not None
    client = PodResources(node.root / "pod-resources" / "kubelet.sock")
    try:
        [held] = await client.list(node.name)
        assert (held.pod.namespace, held.pod.name) == (namespace, "p")
        assert held.container == "work"
        assert (held.claim_namespace, held.claim_name) == (namespace, claim["metadata"]["name"])
        assert held.device == claim["status"]["allocation"]["devices"]["results"][0]["device"]
        assert await client.list("another-node") == [], "only this node's pool"
    finally:
        await client.close()


async def test_use_against_allocation_per_pod_and_tenant_and_overuse_reported(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, gpuslice: Cli,
) -> None:
    node, policy = await one_gpu_with_pods(kube, make_policy, plugin_node, namespace,
                                           {"mode": "memory", "sliceSize": "10G"}, 8, ["busy", "idle", "over"], FAST)
    pods = {p: {"namespace": namespace, "pod": p, "policy": policy, "container": "work"} for p in ("busy", "idle", "over")}

    await use(node, kube, namespace, "busy", 4101, "6Gi", sm=40)
    await use(node, kube, namespace, "over", 4102, "12Gi", sm=90)
    in_pod(node, 4103, None)
    node.fake_gpu("use", "0", "--pid", "4103", "--memory", "1Gi")  # a host process on the GPU
    await metric_is(node, "gpuslice_pod_gpu_memory_used_bytes", pods["busy"], 6 * GI)
    assert await node.metric("gpuslice_pod_gpu_memory_allocated_bytes", pods["busy"]) == 10**10
    assert await node.metric("gpuslice_pod_gpu_utilization_ratio", pods["busy"]) == 0.4
    assert await node.metric("gpuslice_pod_gpu_memory_used_bytes", pods["idle"]) == 0, "an idle slice is measured"
    await metric_is(node, "gpuslice_tenant_used_bytes", {"node": node.name, "policy": policy, "namespace": namespace},
                    18 * GI)
    await metric_is(node, "gpuslice_gpu_unattributed_memory_used_bytes", {"node": node.name}, GI)

    # 12Gi of a 10G slice is past the 5% tolerance: after the grace, the agent's mark on the claim naming
    # the pod and a metric; the controller's Event on the pod.
    event = await event_with(kube, namespace, "over", "uses 12Gi of GPU memory")
    assert event["reason"] == "GpuMemoryOveruse"
    assert f"policy {policy}" in event["message"]
    assert event["source"]["component"] == "gpuslice-controller", "the agent posts no Event on a pod"
    await metric_is(node, "gpuslice_pod_gpu_overuse", pods["over"], 1)
    assert await node.metric("gpuslice_pod_gpu_overuse", pods["busy"]) is None
    assert await node.metric("gpuslice_overuse_actions_total", {"namespace": namespace, "action": "reported"}) == 1
    entry = await wait_for(lambda: overuse_entry(kube, namespace, "over"), what="the claim's overuse mark")
    [condition] = entry["conditions"]
    assert (condition["status"], condition["reason"]) == ("True", "OverAllocation")
    assert [p["uid"] for p in entry["data"]["overusingPods"]] == [await pod_uid(kube, namespace, "over")]
    assert await pod_phase(kube, namespace, "over") == "Running", "onOveruse: Report reports only"

    # The occupancy map shows the over-full slice; `why` for a neighbour on the GPU names who overused.
    status = (await gpuslice("status", "-o", "json")).json()
    holders = [s["holder"] for n in status["map"]["nodes"] if n["name"] == node.name for g in n["gpus"]
               for s in g["segments"] if s["holder"]]
    [over] = [h for h in holders if h["overuse"]]
    assert over["pods"] == ["over"]
    assert f"pod {namespace}/over" in over["overuse"]
    why = (await gpuslice("why", f"{namespace}/busy", "-o", "json")).json()
    [neighbour] = [f for f in why["findings"] if f["code"] == "NeighbourOverusing"]
    assert f"pod {namespace}/over" in neighbour["message"]
    assert "uses 12Gi of GPU memory" in neighbour["message"]
    text = " ".join((await gpuslice("status")).stdout.split())  # as wide as the terminal is: lines wrap
    assert f"over their allocation: {namespace}/over" in text

    # Back within: the condition turns False and names no pod, the controller says the end, the series goes.
    node.fake_gpu("use", "0", "--pid", "4102", "--memory", "9Gi")
    ended = await event_with(kube, namespace, "over", "is back within its 10G")
    assert (ended["reason"], ended["type"]) == ("GpuMemoryOveruseEnded", "Normal")
    await metric_is(node, "gpuslice_pod_gpu_overuse", pods["over"], None)
    entry = await overuse_entry(kube, namespace, "over")
    assert entry is not None
    assert (entry["conditions"][0]["status"], entry["conditions"][0]["reason"]) == ("False", "WithinAllocation")
    assert entry["data"]["overusingPods"] == []
    assert [e["reason"] for e in await pod_events(kube, namespace, "over")].count("GpuMemoryOveruse") == 1

    # A pod that is gone has no series left.
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/idle")
    await gone(kube, namespace, ["idle"])
    await metric_is(node, "gpuslice_pod_gpu_memory_allocated_bytes", pods["idle"], None)


async def gpu_of(kube: KubeClient, node: PluginNode, namespace: str, pod: str) -> int:
    """The index of the GPU the pod's claim was allocated on, from the device's published attributes."""
    claim = await pod_claim(kube, namespace, pod)
    assert claim is not None
    [result] = claim["status"]["allocation"]["devices"]["results"]
    slices = await kube.get("/apis/resource.k8s.io/v1/resourceslices",
                            query={"fieldSelector": f"spec.nodeName={node.name}"})
    return next(int(d["attributes"]["gpuslice.dev/index"]["int"]) for s in slices["items"]
                for d in s["spec"].get("devices") or [] if d["name"] == result["device"])


async def test_a_gpu_whose_processes_cannot_be_read_leaves_the_others_measured_and_its_marks_as_they_are(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    """NVML failing on one GPU (lost, an old driver's missing symbol) is that GPU's: the other GPUs' pods are
    still measured, and an overuse mark on the failing GPU's claim is neither lifted nor renewed."""
    node = await plugin_node("h100-80gb", 2, FAST)
    policy = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "80G"})
    await published(kube, node.name, 2)  # one slice per GPU: the two pods are on different GPUs
    await create_pods(kube, namespace, "gpu-slice", ["over", "fine"])
    await running(kube, namespace, ["over", "fine"])
    gpus = {pod: await gpu_of(kube, node, namespace, pod) for pod in ("over", "fine")}
    assert sorted(gpus.values()) == [0, 1]
    labels = {"namespace": namespace, "pod": "fine", "policy": policy, "container": "work"}
    in_pod(node, 4201, await pod_uid(kube, namespace, "over"))
    in_pod(node, 4202, await pod_uid(kube, namespace, "fine"))
    node.fake_gpu("use", str(gpus["over"]), "--pid", "4201", "--memory", "79Gi")  # over 80G (74.5Gi) + 5%
    node.fake_gpu("use", str(gpus["fine"]), "--pid", "4202", "--memory", "10Gi")
    await metric_is(node, "gpuslice_pod_gpu_memory_used_bytes", labels, 10 * GI)
    assert (await wait_for(lambda: claim_condition(kube, namespace, "over"), what="the overuse mark"))["status"] == "True"

    node.fake_gpu("fail", "processes", "--gpu", str(gpus["over"]), "--times", "-1")
    node.fake_gpu("use", str(gpus["over"]), "--pid", "4201", "--memory", "1Gi")  # unseen: its GPU cannot be read
    node.fake_gpu("use", str(gpus["fine"]), "--pid", "4202", "--memory", "20Gi")
    await metric_is(node, "gpuslice_pod_gpu_memory_used_bytes", labels, 20 * GI)
    failed = await node.metric("gpuslice_agent_usage_passes_total", {"outcome": "failed"}) or 0
    node.fake_gpu("use", str(gpus["fine"]), "--pid", "4202", "--memory", "21Gi")  # passes keep running
    await metric_is(node, "gpuslice_pod_gpu_memory_used_bytes", labels, 21 * GI)
    assert (await node.metric("gpuslice_agent_usage_passes_total", {"outcome": "failed"}) or 0) == failed
    condition = await claim_condition(kube, namespace, "over")
    assert condition is not None
    assert condition["status"] == "True", "a GPU not read says nothing about its pods: the mark stays"
    assert await node.metric("gpuslice_pod_gpu_memory_used_bytes", {**labels, "pod": "over"}) is None


async def test_every_usage_metric_the_dashboard_and_alerts_use_is_served_with_its_labels(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    node, _ = await one_gpu_with_pods(kube, make_policy, plugin_node, namespace,
                                      {"mode": "memory", "sliceSize": "20G", "isolation": "MPS"}, 4, ["m"], FAST)
    await use(node, kube, namespace, "m", 6101, "30Gi", sm=20)
    await event_with(kube, namespace, "m", "uses 30Gi of GPU memory")
    await metric_is(node, "gpuslice_pod_gpu_overuse", {"pod": "m"}, 1)
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{node.metrics_port}/metrics") as response:
        found = served(await response.text())
    usage = ("gpuslice_pod_", "gpuslice_tenant_used", "gpuslice_gpu_unattributed", "gpuslice_overuse_",
             "gpuslice_agent_usage_", "gpuslice_agent_mps_")
    checked, problems = set(), []
    for where, promql in expressions():
        for metric, labels in selectors(promql):
            if not metric.startswith(usage):
                continue
            checked.add(metric)
            if metric not in found:
                problems.append(f"{where}: {metric} is not served")
            elif found[metric] and not all(any(label in s for s in found[metric]) for label in labels):
                problems.append(f"{where}: {metric} has no label {sorted(labels)}")
    assert problems == []
    assert {"gpuslice_pod_gpu_overuse", "gpuslice_pod_gpu_utilization_ratio", "gpuslice_tenant_used_bytes",
            "gpuslice_agent_mps_daemons", "gpuslice_overuse_actions_total"} <= checked
    assert all(found[m] for m in ("gpuslice_pod_gpu_overuse", "gpuslice_tenant_used_bytes", "gpuslice_agent_mps_daemons",
                                  "gpuslice_pod_gpu_memory_allocated_bytes")), "served with samples, labels checked"


async def test_evict_evicts_the_overusing_pod_once_its_budget_allows(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    node = await plugin_node("h100-80gb", 1, FAST)
    body = await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                              "slicing": {"mode": "shared", "sliceSize": "10Gi", "isolation": "MPS"},
                              "tenants": [{"namespace": namespace}], "onOveruse": "Evict"})
    policy = body["metadata"]["name"]
    await published(kube, node.name, 1)
    await create_pods(kube, namespace, "gpu-slice", ["greedy", "neighbour"])
    await running(kube, namespace, ["greedy", "neighbour"])
    await kube.merge_patch(f"/api/v1/namespaces/{namespace}/pods/greedy", {"metadata": {"labels": {"app": "greedy"}}})
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep"},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "greedy"}}}}
    await kube.create(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", pdb)
    await wait_for(lambda: pdb_counted(kube, namespace), what="the PodDisruptionBudget to count the pod")

    # A client that cleared its MPS limit and took 30Gi of its 10Gi share: the agent marks its claim, the
    # controller evicts, and the budget holds it first.
    await use(node, kube, namespace, "greedy", 5101, "30Gi")
    event = await event_with(kube, namespace, "greedy", "the eviction was refused")
    assert event["reason"] == "GpuMemoryOveruseEvictionBlocked"
    assert event["source"]["component"] == "gpuslice-controller"
    assert await pod_phase(kube, namespace, "greedy") == "Running"
    labels = {"node": node.name, "namespace": namespace, "policy": policy}
    await controller_metric_is(controller, {**labels, "action": "eviction_blocked"}, lambda n: n >= 1)

    await kube.delete(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/keep")
    await gone(kube, namespace, ["greedy"], within=90)  # evicted at a later try (5 s doubling), then unprepared
    await controller_metric_is(controller, {**labels, "action": "evicted"}, lambda n: n == 1)
    evicted = await event_with(kube, namespace, "greedy", "was evicted")
    assert evicted["reason"] == "GpuMemoryOveruseEvicted"
    assert await pod_phase(kube, namespace, "neighbour") == "Running", "only the overusing pod goes"


async def controller_metric_is(controller: ControllerProcess, labels: dict[str, str],
                               check: Callable[[float], bool]) -> None:
    async def served_so() -> bool:
        found = await scraped(controller.metrics_port, "gpuslice_overuse_actions_total", labels)
        return found is not None and check(found)

    await wait_for(served_so, within=30, what=f"the controller's gpuslice_overuse_actions_total{labels}")


async def test_an_agent_token_marks_only_its_own_nodes_claims_and_evicts_nothing(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    plugin_node: PluginNodeFactory, namespace: str, unique: str, tmp_path: Path,
) -> None:
    """What a stolen agent token can do about pods: mark its own node's claims, and no more. Neither the
    node's own token nor another node's may evict a pod or post an Event on it; another node's may not
    mark this node's claims; and a mark naming a pod its claim is not reserved for gets nobody evicted."""
    node, policy = await one_gpu_with_pods(kube, make_policy, plugin_node, namespace,
                                           {"mode": "memory", "sliceSize": "10G"}, 8, ["mine", "bystander"], FAST)
    await kube.merge_patch(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{policy}", {"spec": {"onOveruse": "Evict"}})
    rogue = f"rogue-{unique}"
    await kube.create("/api/v1/nodes", fake_gpu_node(rogue, "l4", 1))
    try:
        rogue_kubeconfig = await operator.agent_kubeconfig(kube, rogue, tmp_path, cluster.server, cluster_ca(cluster))
        claim = await pod_claim(kube, namespace, "mine")
        assert claim is not None
        claim_path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{claim['metadata']['name']}"
        [result] = claim["status"]["allocation"]["devices"]["results"]
        mine, bystander = await pod_uid(kube, namespace, "mine"), await pod_uid(kube, namespace, "bystander")

        def mark(*pods: tuple[str, str]) -> dict[str, Any]:
            return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": claim["metadata"]["name"], "namespace": namespace},
                    "status": {"devices": [{
                        "driver": result["driver"], "pool": result["pool"], "device": result["device"],
                        "conditions": [{"type": "GpuMemoryOveruse", "status": "True", "reason": "OverAllocation",
                                        "message": "forged", "lastTransitionTime": "2026-12-01T10:00:00Z"}],
                        "data": {"overusingPods": [{"uid": uid, "name": name, "since": "2026-12-01T10:00:00Z",
                                                    "message": f"forged mark naming {name}"} for uid, name in pods]}}]}}

        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "mine", "namespace": namespace}}
        event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"forged.{unique}", "namespace": namespace},
                 "involvedObject": {"kind": "Pod", "name": "mine", "namespace": namespace, "uid": mine},
                 "reason": "Forged", "message": "forged", "type": "Warning"}
        for kubeconfig in (node.agent_kubeconfig, rogue_kubeconfig):
            async with await KubeClient.from_kubeconfig(kubeconfig) as as_agent:
                with pytest.raises(Forbidden, match="pods/eviction"):
                    await as_agent.create(f"/api/v1/namespaces/{namespace}/pods/mine/eviction", eviction)
                with pytest.raises(Forbidden, match="events"):
                    await as_agent.create(f"/api/v1/namespaces/{namespace}/events", event)
        async with await KubeClient.from_kubeconfig(rogue_kubeconfig) as as_rogue:
            with pytest.raises(Invalid, match="resourceclaims/driver"):  # the API server's field error: 422
                await as_rogue.apply(f"{claim_path}/status", mark((mine, "mine")), field_manager=f"gpuslice-agent-{rogue}")

        # The node's own token may mark its own claims: one mark naming a pod its claim is not reserved for
        # (the bystander holds another claim on this node) and the pod it is. The controller evicts the one
        # the claim is reserved for (so it read this very mark), and only that one.
        async with await KubeClient.from_kubeconfig(node.agent_kubeconfig) as as_node:
            await as_node.apply(f"{claim_path}/status", mark((bystander, "bystander"), (mine, "mine")),
                                field_manager="forged")
        await gone(kube, namespace, ["mine"], within=60)
        body = await kube.get(f"/api/v1/namespaces/{namespace}/pods/bystander")
        assert body["status"]["phase"] == "Running"
        assert "deletionTimestamp" not in body["metadata"]
        assert not [e for e in await pod_events(kube, namespace, "bystander") if e["reason"].startswith("GpuMemory")]
    finally:
        await kube.delete(f"/api/v1/nodes/{rogue}")


async def pdb_counted(kube: KubeClient, namespace: str) -> bool:
    try:
        body = await kube.get(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/keep")
    except KubeError:
        return False
    return int((body.get("status") or {}).get("currentHealthy") or 0) >= 1
