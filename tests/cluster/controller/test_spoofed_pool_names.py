"""A compromised node's kubelet credentials name their ResourceSlice's pool
after another node.

The NodeRestriction admission plugin lets a kubelet (``system:node:<name>``) create any
ResourceSlice whose ``spec.nodeName`` is its own node, of any driver and **any pool name**
(k8s.io/kubernetes v1.37.2 plugin/pkg/admission/noderestriction, ``admitResourceSlice``). The
agent's own-node rule binds the pool to the node only for the agent's token. gpuslice then trusts
a pool's name to be its node: the tenancy rule admits an allocation when ``result.pool`` is in the
policy's ``status.selectedNodes``, and the maxMemory webhook sizes a device by (pool, device). So a
node the policy does not select publishes, under the pool name of one it does, a slice of a higher
generation (the scheduler then ignores the real node's slices of that pool) with a device of the
policy: the tenant's pod was scheduled onto the rogue node, which docs/agent.md's threat model says a
compromised node cannot do ("get a device allocated to a policy that does not select its node"),
and which its advice (select nodes by ``node-restriction.kubernetes.io/`` labels) did not stop.
Now the tenancy rule allocates a policy's device only from the pool of the node the allocation is
for (its nodeSelector, read as the API server reads it), and the pod stays Pending saying why.
Real API server (Node authorizer, NodeRestriction), scheduler and controller.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.claims import claim, request
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import RESOURCE, get_or_none, pod_claim, pod_with_claim, wait_for
from tests.cluster.observe import scheduler_attempts
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory, WebhookProcess
from tests.cluster.pools import published
from tests.cluster.tenancy import scheduling_events
from tests.cluster.webhook.budgets import budget_policy, claim_with_pod, ledger


def as_kubelet(cluster: DevCluster, path: Path, node: str) -> Path:
    """The admin's kubeconfig acting as the node's kubelet (``system:node:<node>`` in
    ``system:nodes``): the identity the Node authorizer and NodeRestriction judge."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    context = config["contexts"][0]["context"]
    admin = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    config["users"] = [{"name": "kubelet", "user": {**admin, "as": f"system:node:{node}",
                                                    "as-groups": ["system:nodes", "system:authenticated"]}}]
    config["contexts"] = [{"name": "kubelet", "context": {"cluster": context["cluster"], "user": "kubelet"}}]
    config["current-context"] = "kubelet"
    path.write_text(yaml.safe_dump(config))
    return path


async def pool_generation(kube: KubeClient, pool: str) -> int:
    generation = max(int(s["spec"]["pool"]["generation"]) for s in await kube.list(f"{RESOURCE}/resourceslices")
                     if s["spec"]["pool"]["name"] == pool)
    assert generation >= 1
    return generation


async def publish_as_kubelet(cluster: DevCluster, tmp_path: Path, rogue: str, name: str, pool: str, generation: int,
                             devices: list[dict[str, Any]]) -> str:
    """As ``rogue``'s kubelet, a slice of its own node under the pool name ``pool``; its path."""
    async with await KubeClient.from_kubeconfig(as_kubelet(cluster, tmp_path / "kubelet", rogue)) as kubelet:
        await kubelet.create(f"{RESOURCE}/resourceslices", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": "gpu.gpuslice.dev", "nodeName": rogue, "devices": devices,
                     "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1}}})
    return f"{RESOURCE}/resourceslices/{name}"


async def real_and_rogue(kube: KubeClient, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
                         namespace: str) -> tuple[str, str, str, dict[str, Any]]:
    """A policy of 10G slices selecting one H100 node, and a compromised node it does not select (its
    agent stopped: its kubelet's credentials are the attacker's): (real node, rogue node, policy, one
    of the real node's devices)."""
    real = await gpu_node("h100-80gb", 1)
    rogue = await gpu_node("l4", 1)
    await rogue.agent.stop()
    name = (await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": real.name}},
                               "slicing": {"mode": "memory", "sliceSize": "10G"},
                               "tenants": [{"namespace": namespace}]}))["metadata"]["name"]
    devices = await published(kube, real.name, 8)
    return real.name, rogue.name, str(name), next(iter(devices.values()))


async def test_a_kubelet_naming_its_pool_after_a_selected_node_lures_no_tenant(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str, cluster: DevCluster, tmp_path: Path,
) -> None:
    real, rogue, name, genuine = await real_and_rogue(kube, make_policy, gpu_node, namespace)
    lure: dict[str, Any] = {"name": "lure-0", "attributes": genuine["attributes"],
                            "capacity": {"memory": {"value": "10G"}}}
    path = await publish_as_kubelet(cluster, tmp_path, rogue, f"lure-{rogue}", real,
                                    await pool_generation(kube, real) + 1000, [lure])
    # The scheduler sees a node's own slices only when it considers that node: with the real node
    # open it may pick it (a genuine device, no harm done) or the rogue one first. Cordoned, the
    # rogue node is the only candidate, so the lure is tried every time.
    await kube.merge_patch(f"/api/v1/nodes/{real}", {"spec": {"unschedulable": True}})
    try:
        await wait_for(lambda: get_or_none(kube, f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates/gpu-slice"),
                       what="the tenant's claim template")
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim("victim", "gpu-slice"))

        events = await scheduling_events(kube, namespace, "victim", "in a pool named after another node")
        message = next(e["message"] for e in events if "in a pool named after another node" in e["message"])
        assert f"devices {real}/lure-0 of GpuSlicePolicy {name}" in message, message
        assert f"than the one they are on ({rogue})" in message, message
        claim = await pod_claim(kube, namespace, "victim")
        assert not ((claim or {}).get("status") or {}).get("allocation"), "never allocated"
        pod = await kube.get(f"/api/v1/namespaces/{namespace}/pods/victim")
        assert not pod["spec"].get("nodeName"), f"scheduled onto {pod['spec'].get('nodeName')}"
    finally:
        with contextlib.suppress(KubeError):
            await kube.merge_patch(f"/api/v1/nodes/{real}", {"spec": {"unschedulable": None}})
        with contextlib.suppress(KubeError):
            await kube.delete(path)
        with contextlib.suppress(KubeError):
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods/victim", gracePeriodSeconds=0)


async def test_a_kubelet_naming_its_pool_after_another_node_resizes_none_of_its_devices_for_max_memory(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, cluster: DevCluster, tmp_path: Path,
) -> None:
    """P2: the maxMemory webhook sized a device by (pool, device) from every slice of the driver. A
    rogue kubelet publishes, under the pool name of a node the policy selects and with an older
    generation (so the scheduler keeps using the real slices), the names of that node's devices at
    1Mi each: the tenant with maxMemory 30Gi took all seven 10Gi slices, each charged 1Mi. Now the
    webhook reads memory only from a slice of its own node's pool, and the tenant gets three."""
    name, klass, devices = await budget_policy(kube, make_policy, gpu_node, namespace,
                                               {"mode": "memory", "sliceSize": "10Gi"}, devices=7)
    [pool] = {s["spec"]["pool"]["name"] for s in await kube.list(f"{RESOURCE}/resourceslices")
              if {d["name"] for d in s["spec"].get("devices") or []} & set(devices)}
    rogue = await gpu_node("l4", 1)
    await rogue.agent.stop()
    fakes = [{"name": device, "capacity": {"memory": {"value": "1Mi"}}} for device in sorted(devices)]
    path = await publish_as_kubelet(cluster, tmp_path, rogue.name, f"poison-{rogue.name}", pool,
                                    await pool_generation(kube, pool) - 1, fakes)
    await memory_webhook_saw(kube, path)
    try:
        for i in range(7):
            await claim_with_pod(kube, namespace, f"s{i}", claim(f"s{i}", request(klass)))
        async def allocated() -> list[str]:
            return [c["metadata"]["name"] for c in await kube.list(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")
                    if (c.get("status") or {}).get("allocation")]

        await wait_for(lambda: allocated_at_least(allocated, 3), within=60, what="three 10Gi slices")
        # The pods refused are tried again with backoff; none left to try means all were allocated.
        with contextlib.suppress(AssertionError):
            await scheduler_attempts(cluster, 4, within=30)
        found = await allocated()
        held = (await ledger(kube, name, namespace))["status"]
        print("allocated", found, "charged", held.get("heldBytes"))
        assert len(found) == 3, f"{namespace} holds {len(found)} slices of 10Gi with maxMemory 30Gi, charged {held}"
    finally:
        with contextlib.suppress(KubeError):
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)
        with contextlib.suppress(KubeError):
            await kube.delete(path)


async def memory_webhook_saw(kube: KubeClient, path: str) -> None:
    """The slice has been there long enough for the webhook's watch: its resourceVersion is behind the
    one of a write made after it (a watch delivers in resourceVersion order; a second is ample on
    loopback, and the assertion after it is what the test checks)."""
    await wait_for(lambda: get_or_none(kube, path), within=10, what="the rogue slice")
    await asyncio.sleep(2)  # length: the webhook's watch brings the slice within it (it reports no watch event)


async def allocated_at_least(allocated: Callable[[], Awaitable[list[str]]], count: int) -> bool:
    return len(await allocated()) >= count


async def test_a_kubelet_naming_its_pool_after_a_selected_node_holds_no_policy_hostage(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str, cluster: DevCluster, tmp_path: Path,
) -> None:
    """P3: a rogue kubelet publishes a device of the policy under the pool name of a node the policy
    selects (an older generation: the scheduler ignores it). Deleting the policy must not wait for it:
    the real node's agent takes its own devices away, and nobody else's slice counts as that node's."""
    real, rogue, name, genuine = await real_and_rogue(kube, make_policy, gpu_node, namespace)
    path = await publish_as_kubelet(cluster, tmp_path, rogue, f"hostage-{rogue}", real,
                                    await pool_generation(kube, real) - 1, [
                                        {"name": "hostage-0", "attributes": genuine["attributes"],
                                         "capacity": {"memory": {"value": "10G"}}}])
    try:
        await kube.delete(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}")

        async def gone() -> bool:
            return await get_or_none(kube, f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}") is None

        await wait_for(gone, within=60, what=f"policy {name} to go though a rogue slice names {real}'s pool")
    finally:
        with contextlib.suppress(KubeError):
            await kube.delete(path)
