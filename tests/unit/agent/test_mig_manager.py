"""The MIG manager hands a GPU that a static layout leaves to whatever takes it next (agent.mig_manager,
planning.node.mig_release), on the fake backend: never while anything of the GPU is published or
prepared, never the GPU Operator's, and a failed step leaves it to the next cycle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.agent.gpus.fake_state import InjectedFailure
from gpuslice.agent.mig_manager import MigManager
from gpuslice.agent.node_state.gpuops import GpuOps
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.node.node_pool import plan_node_pool
from tests import builders

LABELS = {"kubernetes.io/hostname": builders.NODE}
LAYOUT = {"mode": "mig", "mig": {"layout": {"3g.40gb": 2}}}
DYNAMIC = {"mode": "mig", "mig": {"profiles": ["1g.10gb", "3g.40gb"]}}
MEMORY = {"mode": "memory", "sliceSize": "10Gi"}


def _policies(slicing: dict[str, Any] | None) -> list[GpuSlicePolicy]:
    return [builders.policy_model("p", slicing, generation=1, uid="u-p", node=builders.NODE, tenants=[builders.TENANT],
                                  judged=True)] if slicing else []


class Node:
    """One H100 (or ``model``) whose MIG manager applied the layout of ``LAYOUT``: its instances made
    and recorded, as ``reconfigure`` leaves them."""

    def __init__(self, state: Path, model: str = "h100-80gb") -> None:
        self.backend = FakeBackend(builders.NODE, [(model, 1, True)], state)
        [self.gpu] = self.backend.discover()
        self.manager = MigManager(builders.NODE, GpuOps(self.backend, [self.gpu]), state)
        for start in (0, 4):
            self.backend.create_mig(self.gpu, self.profile("3g.40gb"), start)
        self.manager._record(self.gpu.uuid, "p", [("3g.40gb", 0), ("3g.40gb", 4)])

    def profile(self, name: str) -> Any:
        return next(p for p in self.gpu.mig_profiles if p.name == name)

    def instances(self) -> list[tuple[str, int]]:
        return sorted((i.profile, i.start) for i in self.backend.mig_instances(self.gpu))

    async def release(self, slicing: dict[str, Any] | None, busy: set[str] = frozenset(),  # type: ignore[assignment]
                      labels: dict[str, str] = LABELS) -> Gpu:
        policies = _policies(slicing)
        [gpu] = await self.manager.release([self.gpu], plan_node_pool(labels, [self.gpu], policies), policies,
                                           labels, set(busy))
        self.gpu = gpu
        return gpu


@pytest.mark.parametrize("slicing", [MEMORY, {**MEMORY, "allowFullGpu": True}, {"mode": "shared", "sliceSize": "10Gi"}])
async def test_a_layouts_gpu_taken_whole_is_emptied_and_switched_off_once_nothing_of_it_is_published(
    tmp_path: Path, slicing: dict[str, Any],
) -> None:
    node = Node(tmp_path)
    assert (await node.release(slicing, busy={node.gpu.uuid})).mig_enabled, "its old devices still drain"
    assert node.instances() == [("3g.40gb", 0), ("3g.40gb", 4)]
    assert node.manager.static_gpus() == {node.gpu.uuid}
    assert not (await node.release(slicing)).mig_enabled
    assert node.instances() == []
    assert not node.backend.mig_enabled(node.gpu)
    assert node.manager.static_gpus() == set(), "prepare may make and destroy instances there again"
    assert plan_node_pool(LABELS, [node.gpu], _policies(slicing)).devices, "the new policy publishes"


async def test_an_ampere_gpu_taken_whole_is_emptied_and_its_mode_left_to_the_admin(tmp_path: Path) -> None:
    node = Node(tmp_path, "a100-80gb")
    assert (await node.release(MEMORY)).mig_enabled
    assert node.instances() == [], "the instances go: the admin's step is then the mode and a reset only"
    assert node.backend.mig_enabled(node.gpu)
    assert node.manager.static_gpus() == set()
    [left_out] = plan_node_pool(LABELS, [node.gpu], _policies(MEMORY)).left_out
    assert left_out.reason == "MigModeOnNeedsReset"


async def test_dynamic_mig_publishes_on_a_layouts_gpu_only_once_the_layouts_instances_are_gone(
    tmp_path: Path,
) -> None:
    """The layout's instances hold placements that dynamic MIG's devices offer: they wait."""
    node = Node(tmp_path)
    policies = _policies(DYNAMIC)
    plan = plan_node_pool(LABELS, [node.gpu], policies)
    assert plan.devices
    assert (await node.manager.adjust(plan, policies)).devices == [], "held back while the layout's instances stay"
    await node.release(DYNAMIC, busy={node.gpu.uuid})
    assert node.instances() == [("3g.40gb", 0), ("3g.40gb", 4)]
    assert (await node.release(DYNAMIC)).mig_enabled, "dynamic MIG keeps MIG mode on"
    assert node.instances() == []
    assert len((await node.manager.adjust(plan, policies)).devices) == len(plan.devices)
    assert node.manager.static_gpus() == set(), "prepare makes and destroys its claims' instances"


async def test_a_gpu_no_policy_takes_loses_its_layouts_instances_and_keeps_the_rest(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.backend.destroy_mig(node.gpu, node.backend.mig_instances(node.gpu)[0])
    node.backend.create_mig(node.gpu, node.profile("1g.10gb"), 0)  # someone else's
    assert (await node.release(None)).mig_enabled, "MIG mode stays for whatever takes the GPU next"
    assert node.instances() == [("1g.10gb", 0)]
    assert node.manager.static_gpus() == set()


async def test_the_gpu_operators_mig_manager_keeps_the_final_say(tmp_path: Path) -> None:
    node = Node(tmp_path)
    for slicing in (MEMORY, DYNAMIC, None):
        assert (await node.release(slicing, labels={**LABELS, "nvidia.com/gpu.deploy.mig-manager": "true"})).mig_enabled
        assert node.instances() == [("3g.40gb", 0), ("3g.40gb", 4)]
        assert node.manager.static_gpus() == {node.gpu.uuid}


async def test_a_failed_step_leaves_the_gpu_to_the_next_cycle(tmp_path: Path) -> None:
    """A destroy that fails: MIG mode is not touched and the record stays, so the next cycle tries again."""
    node = Node(tmp_path)
    node.backend.state.update(lambda s: s.failures.append(InjectedFailure(operation="destroy-mig")))
    assert (await node.release(MEMORY)).mig_enabled
    assert node.manager.static_gpus() == {node.gpu.uuid}
    assert not (await node.release(MEMORY)).mig_enabled
    assert node.instances() == []
