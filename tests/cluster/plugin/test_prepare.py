"""Tenant pods start on their slices: the real scheduler allocates, the kubelet's own DRA code calls
gpuslice's kubelet plugin over its unix sockets, the plugin prepares and writes a CDI spec, and the
container receives the GPUSLICE_* variables of the device it was allocated."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gpuslice.dra.quantity import format_bytes, quantity_bytes
from gpuslice.kube.client import KubeClient
from gpuslice.planning.cluster.admission import binding as binding_of
from gpuslice.planning.cluster.tenancy_rule import NON_TENANTS, TENANCY, tenancy_binding
from tests.cluster.claims import pod_using
from tests.cluster.kubeutil import RESOURCE, pod_claim, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.plugin.plugin_nodes import PluginNodeFactory, event_with, exec_env, gone, pod_phase, running, until
from tests.cluster.pools import create_pods, published, tenant_policy
from tests.cluster.tenancy import claim, dry_run_admitted

VAP = "/apis/admissionregistration.k8s.io/v1"
GPU_BACKENDS = ("fake", "nvml")  # each test on the fake backend and on the mock NVML library


async def allocated_device(kube: KubeClient, namespace: str, pod: str) -> dict[str, Any]:
    claim = await pod_claim(kube, namespace, pod)
    assert claim is not None
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return {"claim": claim, **result}


async def test_memory_slice_pod_runs_and_its_container_knows_its_slice(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, cluster: Any,
) -> None:
    node = await plugin_node("h100-80gb", 1)
    policy = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10G"})
    devices = await published(kube, node.name, 8)
    await create_pods(kube, namespace, "gpu-slice", ["infer"])
    await running(kube, namespace, ["infer"])

    got = await allocated_device(kube, namespace, "infer")
    device = devices[got["device"]]
    env = exec_env(cluster, namespace, "infer")
    claim = got["claim"]["metadata"]
    assert env["GPUSLICE_DEVICE"] == got["device"]
    assert env["GPUSLICE_GPU_UUID"] == device["attributes"]["gpuslice.dev/parentUUID"]["string"]
    assert env["GPUSLICE_POLICY"] == policy
    assert env["GPUSLICE_MODE"] == "memory"
    assert env["GPUSLICE_SLICE_SIZE"] == "10G"
    assert env["GPUSLICE_MEMORY_LIMIT"] == "10G"
    assert env["GPUSLICE_MEMORY_LIMIT_BYTES"] == str(10**10)
    assert env["GPUSLICE_CLAIM"] == f"{namespace}/{claim['name']}"
    assert node.cdi_specs() == [f"gpuslice.dev-gpu_{claim['uid']}.json"]
    [checkpoint] = node.checkpoints()
    assert (checkpoint["phase"], checkpoint["uid"]) == ("completed", claim["uid"])

    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/infer")
    await gone(kube, namespace, ["infer"])
    assert node.cdi_specs() == [], "unprepare removes the claim's CDI spec"
    assert node.checkpoints() == []


async def test_shared_capacity_pod_gets_its_share_as_the_memory_limit(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, cluster: Any,
) -> None:
    node = await plugin_node("h100-80gb", 1)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "shared", "sliceSize": "10G"})
    [device] = (await published(kube, node.name, 1)).values()
    await create_pods(kube, namespace, "gpu-slice", ["nb-1", "nb-2"])
    await running(kube, namespace, ["nb-1", "nb-2"])
    shares = set()
    for pod in ("nb-1", "nb-2"):
        got = await allocated_device(kube, namespace, pod)
        env = exec_env(cluster, namespace, pod)
        assert env["GPUSLICE_DEVICE"] == device["name"] == got["device"]
        assert env["GPUSLICE_MODE"] == "shared"
        assert env["GPUSLICE_GPU_UUID"] == device["attributes"]["gpuslice.dev/uuid"]["string"]
        assert quantity_bytes(env["GPUSLICE_MEMORY_LIMIT"]) == quantity_bytes(got["consumedCapacity"]["memory"])
        assert env["GPUSLICE_SHARE_ID"] == got["shareID"]
        shares.add(got["shareID"])
    assert len(shares) == 2, "each claim has its own share of the one device"
    assert len(node.cdi_specs()) == 2

    for pod in ("nb-1", "nb-2"):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    await gone(kube, namespace, ["nb-1", "nb-2"])
    assert node.cdi_specs() == []


async def test_dynamic_mig_pod_gets_an_instance_made_at_its_placement_and_destroyed_after(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, cluster: Any,
) -> None:
    node = await plugin_node("a100-40gb", 1)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "mig", "mig": {"profiles": ["3g.20gb"]}})
    devices = await published(kube, node.name, 2)
    assert node.mig_instances() == [], "dynamic MIG: nothing exists until a claim is prepared"
    await create_pods(kube, namespace, "gpu-slice", ["train"])
    await running(kube, namespace, ["train"])

    got = await allocated_device(kube, namespace, "train")
    start = devices[got["device"]]["attributes"]["gpuslice.dev/placementStart"]["int"]
    assert node.mig_instances() == [("3g.20gb", start)]
    env = exec_env(cluster, namespace, "train")
    assert env["GPUSLICE_MODE"] == "mig"
    assert env["GPUSLICE_MIG_PROFILE"] == "3g.20gb"
    assert env["GPUSLICE_MIG_PLACEMENT"] == f"{start}+4"
    assert env["GPUSLICE_MIG_UUID"].startswith("MIG-")
    assert env["GPUSLICE_MEMORY_LIMIT"] == format_bytes(19968 * 1024**2)

    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/train")
    await gone(kube, namespace, ["train"])
    await until(lambda: node.mig_instances() == [], what="the instance to be destroyed on unprepare")
    assert node.cdi_specs() == []


async def test_claim_of_a_device_no_longer_published_is_refused_at_prepare(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    """A late allocation: the scheduler gave the claim a device that a policy edit has since removed.
    The allocation is written by hand (as a scheduler that raced the drain would have), so the race is
    certain rather than likely."""
    node = await plugin_node("h100-80gb", 1)
    policy = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10G"})
    devices = await published(kube, node.name, 8)
    gone_device = sorted(devices)[0].replace("-10g-", "-40g-")  # a name the pool does not have
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "late"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": f"{policy}.gpuslice.dev"}}]}}}
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", claim)
    pod = await kube.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late"},
        "spec": {"nodeName": node.name,
                 "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"claims": [{"name": "gpu"}]}}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": "late"}]},
    })
    body = await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/late")
    body["status"] = {
        "allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.gpuslice.dev", "pool": node.name,
                                                "device": gone_device}]},
                       "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                           {"key": "metadata.name", "operator": "In", "values": [node.name]}]}]}},
        "reservedFor": [{"resource": "pods", "name": "late", "uid": pod["metadata"]["uid"]}],
    }
    await kube.replace(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/late/status", body)

    event = await event_with(kube, namespace, "late", "no longer publishes")
    assert event["reason"] == "FailedPrepareDynamicResources"
    assert f"claim {namespace}/late was allocated device {gone_device} of pool {node.name}" in event["message"]
    assert "Delete the pod" in event["message"]
    assert await pod_phase(kube, namespace, "late") == "Pending"
    assert node.cdi_specs() == []
    assert node.checkpoints() == []
    assert node.agent.running
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/late", gracePeriodSeconds=0)


async def test_a_non_tenant_allocated_while_the_tenancy_rule_was_away_gets_no_device(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, namespaces: Callable[..., Awaitable[str]],
) -> None:
    """A hostile tenant in the window an admin's mistake opens: the tenancy rules' bindings are
    deleted, and before the controller probes again the scheduler allocates a published slice to a
    namespace that is not a tenant. The kubelet plugin, reading the policy at prepare time, gives
    it to no container, and the pod's Events say why."""
    node = await plugin_node("h100-80gb", 1)
    stranger = await namespaces("stranger")
    policy = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10G"})
    await published(kube, node.name, 8)
    klass = f"{policy}.gpuslice.dev"
    bindings = [f"{VAP}/validatingadmissionpolicybindings/{name}" for name in (TENANCY, NON_TENANTS)]

    async def admitted() -> bool:  # a dry-run claim of the stranger's: does a rule judge it?
        return await dry_run_admitted(kube, stranger, klass)

    for binding in bindings:
        await kube.delete(binding)
    try:
        await wait_for(admitted, what="the tenancy bindings to stop applying")
        await kube.create(f"{RESOURCE}/namespaces/{stranger}/resourceclaims", claim("taken", klass))
        await kube.create(f"/api/v1/namespaces/{stranger}/pods", pod_using("intruder", "taken"))
        event = await event_with(kube, stranger, "intruder", "is not in its spec.tenants")
        assert f"claim {stranger}/taken was allocated devices of GpuSlicePolicy {policy}" in event["message"]
        taken = await kube.get(f"{RESOURCE}/namespaces/{stranger}/resourceclaims/taken")
        assert taken["status"]["allocation"], "the scheduler allocated it: only the plugin stood in the way"
        assert await pod_phase(kube, stranger, "intruder") != "Running"
        assert node.recorded(stranger, "intruder") is None, "no container got the device"
        assert node.cdi_specs() == []
        # A retry (the kubelet's) may be between its started checkpoint and undoing it: none completed.
        assert [c for c in node.checkpoints()
                if c["uid"] == taken["metadata"]["uid"] and c["phase"] != "started"] == []
    finally:
        for binding, body in zip(bindings, (tenancy_binding(), binding_of(NON_TENANTS)), strict=True):
            await kube.apply(binding, body, field_manager="gpuslice-tests")
        await wait_for(lambda: _refused(admitted), what="the tenancy bindings to apply again")


async def _refused(admitted: Callable[[], Awaitable[bool]]) -> bool:
    return not await admitted()
