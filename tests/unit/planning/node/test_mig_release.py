"""What becomes of a GPU's MIG instances when its policy no longer wants them (planning.node.mig_release):
for each slicing mode a GPU can go to, from a layout, dynamic MIG or instances made by someone else."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.node.mig_layout import layout_targets
from gpuslice.planning.node.mig_release import Release, Wants, release, wants
from gpuslice.planning.node.node_pool import plan_node_pool
from tests import builders

LABELS = {"kubernetes.io/hostname": builders.NODE}
LAYOUT = [("3g.40gb", 0), ("3g.40gb", 4)]
OTHER = [("1g.10gb", 0)]  # made by hand, or left by dynamic MIG


def _gpu(model: str, mig: bool) -> Gpu:
    [gpu] = FakeBackend(builders.NODE, [(model, 1, mig)]).discover()
    return gpu


SLICINGS = {
    "layout": {"mode": "mig", "mig": {"layout": {"3g.40gb": 2}}},
    "dynamic": {"mode": "mig", "mig": {"profiles": ["1g.10gb"]}},
    "memory": {"mode": "memory", "sliceSize": "10Gi"},
    "whole": {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True},
    "shared": {"mode": "shared", "sliceSize": "10Gi"},
}


def _wants(gpu: Gpu, slicing: str | None, labels: dict[str, str] = LABELS) -> Wants:
    policies = [builders.policy_model("p", SLICINGS[slicing], generation=1, uid="u-p", node=builders.NODE,
                                      tenants=[builders.TENANT], judged=True)] if slicing else []
    plan = plan_node_pool(labels, [gpu], policies)
    return wants(plan, set(layout_targets(plan.typed, policies)), gpu)


@pytest.mark.parametrize("model", ["h100-80gb", "a100-80gb"])
def test_what_each_mode_wants_of_a_gpu_in_mig_mode(model: str) -> None:
    gpu = _gpu(model, True)
    assert [_wants(gpu, s) for s in (*SLICINGS, None)] == ["layout", "dynamic", "whole", "whole", "whole", "none"]
    off = replace(gpu, mig_enabled=False)
    assert _wants(off, "memory") == "whole", "published whole: nothing of MIG to undo but a record"
    operator = {**LABELS, "nvidia.com/gpu.deploy.mig-manager": "true"}
    assert _wants(gpu, "memory", operator) == "none", "the GPU Operator's MIG mode: nothing here wants it whole"


def test_a_gpu_taken_whole_loses_every_instance_and_on_hopper_its_mig_mode() -> None:
    h100, a100 = _gpu("h100-80gb", True), _gpu("a100-80gb", True)
    assert release(h100, "whole", LAYOUT, LAYOUT + OTHER) == Release(h100.uuid, tuple(sorted(LAYOUT + OTHER)),
                                                                     mig_off=True, forget=True)
    assert release(h100, "whole", None, OTHER) == Release(h100.uuid, tuple(OTHER), mig_off=True)
    assert release(h100, "whole", None, []) == Release(h100.uuid, mig_off=True), "no instance: only the mode"
    assert release(a100, "whole", LAYOUT, LAYOUT) == Release(a100.uuid, tuple(LAYOUT), mig_off=False, forget=True), \
        "before Hopper the mode waits for a reset (the policy's status says the step)"
    off = replace(h100, mig_enabled=False)
    assert release(off, "whole", None, []) is None, "as it wants it"
    assert release(off, "whole", LAYOUT, []) == Release(off.uuid, forget=True), "an old record goes"


def test_dynamic_mig_takes_a_gpu_a_layout_left_once_its_instances_are_gone() -> None:
    h100 = _gpu("h100-80gb", True)
    assert release(h100, "dynamic", LAYOUT, LAYOUT + OTHER) == Release(h100.uuid, tuple(sorted(LAYOUT + OTHER)),
                                                                       forget=True)
    assert release(h100, "dynamic", None, OTHER) is None, \
        "no layout left it: its devices are published, and its instances are its claims' (recovery undoes others)"


def test_a_gpu_no_policy_takes_loses_only_its_layouts_instances() -> None:
    h100 = _gpu("h100-80gb", True)
    assert release(h100, "none", LAYOUT, LAYOUT + OTHER) == Release(h100.uuid, tuple(LAYOUT), forget=True)
    assert release(h100, "none", None, OTHER) is None, "not gpuslice's: left alone"
    assert release(h100, "layout", LAYOUT, OTHER) is None, "a layout's GPU is the MIG manager's to reconfigure"
