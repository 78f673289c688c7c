"""A GPU follows its policy, whatever it served before (agent.mig_manager, planning.node.mig_release): every
ordered pair of whole, memory, shared, static MIG, dynamic MIG and no policy, by editing a pool's mode or by
deleting a policy and applying another, converges with no step on the node; a claim held across a change
keeps its instance until it is released; before Hopper the policy names each node and GPU with the step."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import pytest

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.kube.client import Conflict, KubeClient
from gpuslice.planning.node.node_pool import plan_node_pool
from tests.cluster.kubeutil import POLICIES, pod_claim, wait_for
from tests.cluster.observe import agent_cycles
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.plugin.mig import by_gpu, degraded_as, settled, taint_keys
from tests.cluster.plugin.plugin_nodes import PluginNode, PluginNodeFactory, exec_env, gone, running
from tests.cluster.pools import create_pods, pool_devices, tenant_policy

MODEL, GPUS = "h100-80gb", 2
LAYOUT = [("3g.40gb", 0), ("3g.40gb", 4)]
SLICINGS: dict[str, dict[str, Any]] = {
    "whole": {"mode": "memory", "sliceSize": "40Gi", "allowFullGpu": True},
    "memory": {"mode": "memory", "sliceSize": "10Gi"},
    "shared": {"mode": "shared", "sliceSize": "10Gi"},
    "static": {"mode": "mig", "mig": {"layout": {"3g.40gb": 2}}},
    "dynamic": {"mode": "mig", "mig": {"profiles": ["1g.10gb", "3g.40gb"]}},
}
MODES = ("none", *SLICINGS)
MIG_MODE = {"whole": False, "memory": False, "shared": False, "static": True}  # dynamic, none: as it was


def every_pair() -> list[str]:
    """A walk from no policy back to none that makes every change of mode once (an Euler circuit of the
    complete directed graph on the modes: each has as many ways in as out; Hierholzer's algorithm)."""
    unused = {mode: [other for other in MODES if other != mode] for mode in MODES}
    stack, walk = ["none"], []
    while stack:
        if unused[stack[-1]]:
            stack.append(unused[stack[-1]].pop(0))
        else:
            walk.append(stack.pop())
    return walk[::-1]


class Walker:
    """One fake node of two H100s taken from mode to mode; each step waits until the GPUs are what the
    new mode wants (instances, MIG mode) and publish exactly its devices, untainted, and the policy
    says Ready with nothing Degraded."""

    def __init__(self, kube: KubeClient, make_policy: PolicyFactory, namespace: str, node: PluginNode,
                 key: str) -> None:
        self.kube, self.make_policy, self.namespace, self.node, self.key = kube, make_policy, namespace, node, key
        self.policy: str | None = None
        self.steps = 0
        self.took: list[tuple[str, str, float]] = []

    async def go(self, before: str, after: str) -> None:
        self.steps += 1
        mig_before = [g["mig_enabled"] for g in self.node.fake_state()["gpus"].values()]
        started = asyncio.get_running_loop().time()
        if after == "none":
            assert self.policy is not None
            await self.kube.delete(f"{POLICIES}/{self.policy}")
            self.policy = None
        elif before == "none" or self.steps % 2:
            if self.policy is not None:  # deleted, and another applied at once
                await self.kube.delete(f"{POLICIES}/{self.policy}")
            suffix = f"-{self.key}{self.steps}"
            self.policy = await tenant_policy(self.make_policy, self.namespace, self.node.name, SLICINGS[after],
                                              suffix, template=f"t{self.key}{self.steps}")
        else:  # the pool's mode changes
            assert self.policy is not None
            path = f"{POLICIES}/{self.policy}"

            async def replaced() -> bool:  # the controller writes the status meanwhile: a conflict is tried again
                body = await self.kube.get(path)
                body["spec"]["slicing"] = SLICINGS[after]
                with contextlib.suppress(Conflict):
                    return bool(await self.kube.replace(path, body))
                return False

            await wait_for(replaced, within=10, what=f"{path}'s slicing replaced")
        await wait_for(lambda: self.converged(after, mig_before), within=60,
                       what=f"{self.node.name} to go from {before} to {after} (step {self.steps})")
        self.took.append((before, after, round(asyncio.get_running_loop().time() - started, 1)))

    async def converged(self, mode: str, mig_before: list[bool]) -> bool:
        state = self.node.fake_state()["gpus"]
        mig = [MIG_MODE.get(mode, before) for before in mig_before]
        if [g["mig_enabled"] for g in state.values()] != mig:
            return False
        if any(self.node.mig_instances(i) != (LAYOUT if mode == "static" else []) for i in range(GPUS)):
            return False
        devices = await pool_devices(self.kube, self.node.name)
        if self.policy is None:
            return devices == {}
        body = await self.kube.get(f"{POLICIES}/{self.policy}")
        labels = (await self.kube.get(f"/api/v1/nodes/{self.node.name}"))["metadata"]["labels"]
        gpus = [FakeBackend(self.node.name, [(MODEL, GPUS, m)]).discover()[i] for i, m in enumerate(mig)]
        wanted = {d["name"] for d in plan_node_pool(labels, gpus, [GpuSlicePolicy.from_body(body)]).devices}
        conditions = {c["type"]: c for c in (body.get("status") or {}).get("conditions") or []}
        return (bool(wanted) and set(devices) == wanted and not taint_keys(list(devices.values()))
                and {d["attributes"]["gpuslice.dev/policy"]["string"] for d in devices.values()} == {self.policy}
                and conditions.get("Ready", {}).get("status") == "True"
                and conditions.get("Degraded", {}).get("reason") == "AsExpected")


async def test_every_change_of_mode_converges_with_no_step_on_the_node(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    """The 30 ordered pairs of six modes, in three walks of ten on three nodes at once (each from no
    policy to its first mode first); H100s from the factory, MIG mode off."""
    walk = every_pair()
    assert len(walk) == 31
    assert set(itertools.pairwise(walk)) == {(a, b) for a in MODES for b in MODES if a != b}, "every ordered pair once"
    nodes = [await plugin_node(MODEL, GPUS, ["--fake-gpus", f"{MODEL}:{GPUS}:mig-off"]) for _ in range(3)]

    async def run(node: PluginNode, key: str, part: list[str]) -> Walker:
        walker = Walker(kube, make_policy, namespace, node, key)
        for before, after in itertools.pairwise(["none", *part]):
            if before != after:
                await walker.go(before, after)
        return walker

    parts = [walk[i:i + 11] for i in range(0, 30, 10)]
    walkers = await asyncio.gather(*(run(n, k, p) for n, k, p in zip(nodes, "abc", parts, strict=True)))
    done = {(a, b) for w in walkers for a, b, _ in w.took}
    assert done >= {(a, b) for a in MODES for b in MODES if a != b}


async def test_a_claim_held_across_a_change_keeps_its_instance_until_it_is_released(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, cluster: Any,
) -> None:
    """The change the bench makes: a static layout's policy is deleted and a memory policy applied to the
    same Hopper GPUs. The free GPU is published in memory slices within a minute, with no other step; the
    GPU whose instance a running pod holds keeps it, its device held as published, until the pod goes."""
    node = await plugin_node(MODEL, GPUS, ["--fake-gpus", f"{MODEL}:{GPUS}:mig-off"])
    static = await tenant_policy(make_policy, namespace, node.name, SLICINGS["static"], "-static", "before")
    await settled(kube, node, {0: LAYOUT, 1: LAYOUT})
    await create_pods(kube, namespace, "before", ["held"])
    await running(kube, namespace, ["held"])
    claim = await pod_claim(kube, namespace, "held")
    assert claim is not None
    device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    attributes = (await pool_devices(kube, node.name))[device]["attributes"]
    busy, start = attributes["gpuslice.dev/index"]["int"], attributes["gpuslice.dev/placementStart"]["int"]
    free = 1 - busy
    [instance] = [i for i in node.fake_state()["gpus"][str(busy)]["instances"] if i["start"] == start]
    env = exec_env(cluster, namespace, "held")

    await kube.delete(f"{POLICIES}/{static}")
    memory = await tenant_policy(make_policy, namespace, node.name, SLICINGS["memory"], "-memory", "after")

    async def free_gpu_published() -> bool:
        published = by_gpu(await pool_devices(kube, node.name))
        return (len(published.get(free, [])) == 7
                and {d["attributes"]["gpuslice.dev/mode"]["string"] for d in published[free]} == {"memory"}
                and not node.fake_state()["gpus"][str(free)]["mig_enabled"] and node.mig_instances(free) == [])

    await wait_for(free_gpu_published, within=60, what=f"GPU {free} published in memory slices")
    condition = await degraded_as(kube, memory, "MigModeOn", saying=lambda message: f"GPU {free} " not in message)
    assert f"node {node.name} GPU {busy} " in condition["message"]
    await agent_cycles(kube, node.name, node.metrics)
    published = by_gpu(await pool_devices(kube, node.name))
    assert [d["name"] for d in published[busy]] == [device], "the held device alone, as it was published"
    assert taint_keys(published[busy]) == {"gpuslice.dev/pending-change"}
    # The GPU is left alone while anything of it is published: its instances go together once the claim went.
    assert instance in node.fake_state()["gpus"][str(busy)]["instances"], "its instance is never destroyed under it"
    assert node.fake_state()["gpus"][str(busy)]["mig_enabled"]
    assert exec_env(cluster, namespace, "held") == env

    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/held")
    await gone(kube, namespace, ["held"])

    async def all_published() -> bool:
        published = by_gpu(await pool_devices(kube, node.name))
        return (all(len(published.get(i, [])) == 7 and not taint_keys(published[i]) for i in range(GPUS))
                and not any(g["mig_enabled"] or g["instances"] for g in node.fake_state()["gpus"].values()))

    await wait_for(all_published, within=60, what="both GPUs published in memory slices once the pod went")
    await degraded_as(kube, memory, "AsExpected")
    await create_pods(kube, namespace, "after", ["on-memory"])
    await running(kube, namespace, ["on-memory"])
    assert exec_env(cluster, namespace, "on-memory")["GPUSLICE_MODE"] == "memory"


@pytest.mark.gpu_backends("fake", "nvml")  # and on the mock NVML library, whose A100s' MIG mode waits for a reset
async def test_before_hopper_the_instances_go_and_the_policy_names_the_step_on_each_gpu(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    """The same change on A100s: the agent destroys the layout's instances but cannot switch MIG mode (a
    reset it does not do), so the memory policy names the node, its GPUs and the commands; once an admin
    ran them (nvidia-smi -mig 0 and -r, the fake's mig-mode and reset), the slices follow."""
    node = await plugin_node("a100-40gb", GPUS)
    static = await tenant_policy(make_policy, namespace, node.name, {"mode": "mig", "mig": {"layout": {"3g.20gb": 2}}},
                                 "-static", "before")
    three_g = [("3g.20gb", 0), ("3g.20gb", 4)]
    await settled(kube, node, {0: three_g, 1: three_g})
    await kube.delete(f"{POLICIES}/{static}")
    memory = await tenant_policy(make_policy, namespace, node.name, SLICINGS["memory"], "-memory", "after")

    async def emptied() -> bool:
        return all(node.mig_instances(i) == [] for i in range(GPUS))

    await wait_for(emptied, within=60, what="the layout's instances destroyed")
    condition = await degraded_as(kube, memory, "MigModeOnNeedsReset")
    assert (f"Then switch MIG mode off on node {node.name}: nvidia-smi -i 0 -mig 0 && nvidia-smi -i 1 -mig 0, then"
            " nvidia-smi -r -i 0,1 with every client of these GPUs stopped, or reboot the node") in condition["message"]
    assert await pool_devices(kube, node.name) == {}
    assert node.mig_modes() == [True] * GPUS, "no MIG mode switched below Hopper"

    for gpu in range(GPUS):
        node.fake_gpu("mig-mode", str(gpu), "off")
    node.fake_gpu("reset", "0", "1")

    async def published() -> bool:
        found = by_gpu(await pool_devices(kube, node.name))
        return all(len(found.get(i, [])) == 4 for i in range(GPUS))  # 10Gi slices of 40,960 MiB

    await wait_for(published, within=60, what="memory slices on both A100s")
    await degraded_as(kube, memory, "AsExpected")
