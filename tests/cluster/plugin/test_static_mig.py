"""Static MIG layouts made real: the agent reconfigures each GPU to the layout one at a time, never under
a claim (a busy GPU drains, waits and follows), publishes the instances the GPU really has, and rolls
a failed reconfiguration back to the last good layout, saying so on the policy."""

from __future__ import annotations

from typing import Any

from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import POLICIES, pod_claim, wait_for
from tests.cluster.observe import agent_cycles
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.plugin.mig import RECONFIGURING, by_gpu, degraded_as, layout_of, settled, taint_keys
from tests.cluster.plugin.plugin_nodes import PluginNodeFactory, exec_env, gone, running
from tests.cluster.pools import create_pods, pool_devices, tenant_policy

GPU_BACKENDS = ("fake", "nvml")  # each test on the fake backend and on the mock NVML library

ONE_G = [("1g.5gb", s) for s in range(7)]
THREE_G = [("3g.20gb", 0), ("3g.20gb", 4)]


async def test_layout_change_goes_one_gpu_at_a_time_and_waits_for_the_busy_one(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, cluster: Any,
) -> None:
    node = await plugin_node("a100-40gb", 3)
    assert node.mig_instances(0) == [], "a fresh fake GPU has no instances"
    policy = await tenant_policy(make_policy, namespace, node.name, {"mode": "mig", "mig": {"layout": {"3g.20gb": 2}}})
    await settled(kube, node, {0: THREE_G, 1: THREE_G, 2: THREE_G})

    await create_pods(kube, namespace, "gpu-slice", ["busy"])
    await running(kube, namespace, ["busy"])
    claim = await pod_claim(kube, namespace, "busy")
    assert claim is not None
    held = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    busy = (await pool_devices(kube, node.name))[held]["attributes"]["gpuslice.dev/index"]["int"]
    env = exec_env(cluster, namespace, "busy")
    assert env["GPUSLICE_MIG_PROFILE"] == "3g.20gb"
    others = [i for i in range(3) if i != busy]

    # (A merge patch merges maps: the old profile is removed by name.)
    await kube.merge_patch(f"{POLICIES}/{policy}",
                           {"spec": {"slicing": {"mig": {"layout": {"3g.20gb": None, "1g.5gb": 7}}}}})
    most_at_once = 0

    async def others_done() -> bool:
        nonlocal most_at_once
        published = by_gpu(await pool_devices(kube, node.name))
        draining_free = [i for i in others if RECONFIGURING in taint_keys(published.get(i, []))]
        most_at_once = max(most_at_once, len(draining_free))
        assert layout_of(published[busy]) == THREE_G, "a GPU a claim holds is never reconfigured"
        assert node.mig_instances(busy) == THREE_G
        return all(layout_of(published.get(i, [])) == ONE_G and node.mig_instances(i) == ONE_G for i in others)

    await wait_for(others_done, within=120, what="the free GPUs to be reconfigured", every=0.1)
    assert most_at_once <= 1, "free GPUs are reconfigured one at a time"
    published = by_gpu(await pool_devices(kube, node.name))
    assert taint_keys(published[busy]) == {RECONFIGURING}, "the busy GPU drains: nothing new lands on it"
    await agent_cycles(kube, node.name, node.metrics)  # its MIG manager had two more chances
    assert node.mig_instances(busy) == THREE_G
    assert exec_env(cluster, namespace, "busy") == env

    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/busy")
    await gone(kube, namespace, ["busy"])
    await settled(kube, node, {0: ONE_G, 1: ONE_G, 2: ONE_G})

    # The new layout serves claims: a pod gets a 1g.5gb instance that exists.
    await create_pods(kube, namespace, "gpu-slice", ["after"])
    await running(kube, namespace, ["after"])
    assert exec_env(cluster, namespace, "after")["GPUSLICE_MIG_PROFILE"] == "1g.5gb"
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/after")
    await gone(kube, namespace, ["after"])


async def test_failed_reconfiguration_rolls_back_and_says_so(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    node = await plugin_node("a100-40gb", 2)
    policy = await tenant_policy(make_policy, namespace, node.name, {"mode": "mig", "mig": {"layout": {"1g.5gb": 7}}})
    await settled(kube, node, {0: ONE_G, 1: ONE_G})

    node.fake_gpu("fail", "create-mig", "--gpu", "0", "--times", "1")
    await kube.merge_patch(f"{POLICIES}/{policy}",
                           {"spec": {"slicing": {"mig": {"layout": {"1g.5gb": None, "3g.20gb": 2}}}}})

    async def rolled_back() -> list[dict[str, Any]] | None:
        published = by_gpu(await pool_devices(kube, node.name))
        failed = [t for d in published.get(0, []) for t in d.get("taints") or [] if t["key"] == "gpuslice.dev/mig-failed"]
        ok = (layout_of(published.get(0, [])) == ONE_G and len(failed) == 7 and layout_of(published.get(1, [])) == THREE_G
              and node.mig_instances(1) == THREE_G)
        return failed if ok else None

    failed = await wait_for(rolled_back, within=120, what="GPU 0 rolled back and tainted, GPU 1 reconfigured")
    assert {(t["value"], t["effect"]) for t in failed} == {("rolled-back", "None")}
    assert node.mig_instances(0) == ONE_G, "the GPU has its last good layout again: nothing half made is left"

    async def event() -> list[dict[str, Any]]:
        # The agent's own Event (the controller's says it too, for its Degraded condition).
        return [e for e in await kube.list("/api/v1/namespaces/default/events")
                if e["involvedObject"]["name"] == policy and e["reason"] == "MigReconfigurationFailed"
                and (e.get("source") or {}).get("component") == "gpuslice-agent"]

    [found] = await wait_for(event, within=30, what="an Event on the policy saying the reconfiguration failed")
    assert "GPU 0 (" in found["message"]
    # The fake backend's injected failure, or NVML's answer (Unknown Error) through the mock library.
    assert ("NVML failed while creating" if node.nvml else "create-mig failed") in found["message"]
    assert "rolled back to its last good layout" in found["message"]

    async def degraded() -> dict[str, Any] | None:
        conditions = (await kube.get(f"{POLICIES}/{policy}")).get("status", {}).get("conditions") or []
        found = next((c for c in conditions if c["type"] == "Degraded"), None)
        return found if found and found["reason"] == "MigReconfigurationFailed" else None

    condition = await wait_for(degraded, within=60, what="the policy's status to report the failed reconfiguration")
    assert condition["status"] == "True"
    assert condition["message"].startswith("7 devices are on GPUs whose MIG reconfiguration")

    # The policy keeps serving claims (mig-failed is informational; the failed GPU keeps its last good layout).
    await create_pods(kube, namespace, "gpu-slice", ["still"])
    await running(kube, namespace, ["still"])
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/still")
    await gone(kube, namespace, ["still"])


async def test_a_layout_on_gpus_whose_mig_mode_is_off_turns_it_on_and_publishes(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, cluster: Any,
) -> None:
    """Hopper GPUs fresh from the factory (or after the GPU Operator's all-disabled) have MIG mode
    off: the layout still fits them, and Hopper switches MIG mode without a reset, so the agent
    switches them to MIG mode, makes the instances, publishes them, and a pod runs on one."""
    node = await plugin_node("h100-80gb", 2, ["--fake-gpus", "h100-80gb:2:mig-off"])
    assert node.mig_modes() == [False, False]
    await tenant_policy(make_policy, namespace, node.name, {"mode": "mig", "mig": {"layout": {"3g.40gb": 2}}})
    three_g = [("3g.40gb", 0), ("3g.40gb", 4)]
    await settled(kube, node, {0: three_g, 1: three_g})
    assert node.mig_modes() == [True, True]
    made = node.mig_uuids()
    published = {(d["attributes"]["gpuslice.dev/index"]["int"], d["attributes"]["gpuslice.dev/placementStart"]["int"]):
                 d["attributes"]["uuid"]["string"] for d in (await pool_devices(kube, node.name)).values()}
    assert published == made, "each static device carries its instance's UUID, as NVIDIA's do"
    await create_pods(kube, namespace, "gpu-slice", ["on-mig"])
    await running(kube, namespace, ["on-mig"])
    assert exec_env(cluster, namespace, "on-mig")["GPUSLICE_MIG_PROFILE"] == "3g.40gb"


async def test_an_ampere_gpu_whose_mig_mode_is_off_waits_for_its_admin(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    """An A100 switches MIG mode only at a GPU reset, which the agent does not do (planning.node.mig_mode,
    as NVIDIA's DRA driver): with MIG mode off nothing of a layout is published or tried, and the
    policy's status says why and what to do, from what the agent wrote on its pool. Once an admin
    has switched one GPU (and reset it), the next cycle applies the layout there."""
    node = await plugin_node("a100-40gb", 2, ["--fake-gpus", "a100-40gb:2:mig-off", "--resync", "3"])
    policy = await tenant_policy(make_policy, namespace, node.name, {"mode": "mig", "mig": {"layout": {"3g.20gb": 2}}})
    condition = await degraded_as(kube, policy, "MigModeOff")
    assert f"MIG mode is off on node {node.name} GPU 0 (NVIDIA A100-SXM4-40GB), node {node.name} GPU 1" \
        in condition["message"]
    assert (f"Enable MIG mode on node {node.name}: nvidia-smi -i 0 -mig 1 && nvidia-smi -i 1 -mig 1, then"
            " nvidia-smi -r -i 0,1 with every client of these GPUs stopped, or reboot the node") in condition["message"]
    assert await pool_devices(kube, node.name) == {}
    slices = await kube.list("/apis/resource.k8s.io/v1/resourceslices", fieldSelector=f"spec.nodeName={node.name}")
    assert [s["metadata"]["name"] for s in slices] == [f"gpuslice-{node.name}-devices-00"], "an empty slice says it"
    assert node.mig_modes() == [False, False], "nothing tried"

    node.fake_gpu("mig-mode", "0", "on")  # an admin's nvidia-smi -i 0 -mig 1, and a GPU reset
    node.fake_gpu("reset", "0")
    await settled(kube, node, {0: THREE_G, 1: []})

    async def only_gpu_1() -> bool:
        found = await degraded_as(kube, policy, "MigModeOff")
        return "GPU 0" not in found["message"] and f"node {node.name} GPU 1" in found["message"]

    await wait_for(only_gpu_1, within=60, what="the status to name GPU 1 only")
