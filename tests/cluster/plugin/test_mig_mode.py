"""A GPU in MIG mode under a whole-GPU, memory or shared policy (planning.node.mig_mode): no container could
use it whole, so nothing of that policy is published there; the agent switches MIG mode off itself
from Hopper on once nothing of the GPU is published, and before Hopper waits for an admin (a reset),
with the policy's status saying why."""

from __future__ import annotations

from typing import Any

from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import wait_for
from tests.cluster.observe import agent_cycles
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.plugin.mig import by_gpu, degraded_as
from tests.cluster.plugin.plugin_nodes import PluginNodeFactory, exec_env, running
from tests.cluster.pools import create_pods, pool_devices, tenant_policy

GPU_BACKENDS = ("fake", "nvml")  # each test on the fake backend and on the mock NVML library


async def test_a_memory_policy_on_an_h100_in_mig_mode_switches_it_off_and_publishes(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, cluster: Any,
) -> None:
    """As NVIDIA's DRA driver (maybeDisableMigMode): Hopper switches MIG mode without a reset, so the
    agent turns it off (nothing of the GPU is published, no instance) and the memory slices follow."""
    node = await plugin_node("h100-80gb", 1, ["--fake-gpus", "h100-80gb:1:mig-on"])
    assert node.mig_modes() == [True]
    await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10Gi"})

    async def published() -> bool:
        devices = await pool_devices(kube, node.name)
        return bool(devices) and all(d["attributes"]["type"]["string"] == "slice"
                                     for d in devices.values())

    await wait_for(published, within=60, what="memory slices on the H100")
    assert node.mig_modes() == [False]
    await create_pods(kube, namespace, "gpu-slice", ["whole"])
    await running(kube, namespace, ["whole"])
    assert exec_env(cluster, namespace, "whole")["GPUSLICE_MODE"] == "memory"


async def test_a_shared_policy_on_an_a100_in_mig_mode_waits_for_its_admin(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    """An A100 switches MIG mode only at a reset, which the agent does not do: nothing is published
    and the policy says why, with the step; once an admin switched one GPU off (`gpuslice fake-gpu mig-mode
    0 off` and `reset 0`, as nvidia-smi -mig 0 and -r), that GPU publishes at the next cycle."""
    node = await plugin_node("a100-40gb", 2, ["--resync", "3"])
    policy = await tenant_policy(make_policy, namespace, node.name, {"mode": "shared", "sliceSize": "5Gi"})
    condition = await degraded_as(kube, policy, "MigModeOnNeedsReset")
    assert f"MIG mode is on on node {node.name} GPU 0 (NVIDIA A100-SXM4-40GB), node {node.name} GPU 1" \
        in condition["message"]
    assert (f"Then switch MIG mode off on node {node.name}: nvidia-smi -i 0 -mig 0 && nvidia-smi -i 1 -mig 0, then"
            " nvidia-smi -r -i 0,1 with every client of these GPUs stopped, or reboot the node") in condition["message"]
    assert await pool_devices(kube, node.name) == {}
    assert node.mig_modes() == [True, True], "nothing switched"

    node.fake_gpu("mig-mode", "0", "off")  # nvidia-smi -i 0 -mig 0: pending until the reset
    await agent_cycles(kube, node.name, node.metrics)
    assert await pool_devices(kube, node.name) == {}, "a pending mode changes nothing"
    node.fake_gpu("reset", "0")

    async def gpu_0_only() -> bool:
        published = by_gpu(await pool_devices(kube, node.name))
        return list(published) == [0] and published[0][0]["attributes"]["type"]["string"] == "gpu"

    await wait_for(gpu_0_only, within=60, what="GPU 0's shared device")

    async def only_gpu_1() -> bool:
        found = await degraded_as(kube, policy, "MigModeOnNeedsReset")
        return "GPU 0" not in found["message"] and f"node {node.name} GPU 1" in found["message"]

    await wait_for(only_gpu_1, within=60, what="the status to name GPU 1 only")
