"""The node's pool, for each slicing mode."""

from __future__ import annotations

from typing import Any

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.planning.mig import mig_device_name, parse_mig_device_name
from gpuslice.planning.node_pool import plan_node_pool

LABELS = {"kubernetes.io/hostname": "n1"}


def gpus(model: str, count: int = 1) -> list[Any]:
    return FakeBackend("n1", [(model, count)]).discover()


def policy(name: str, slicing: dict[str, Any], created: str = "2026-11-29T10:00:00Z", **spec: Any) -> GpuSlicePolicy:
    return GpuSlicePolicy.model_validate({"metadata": {"name": name, "creationTimestamp": created},
                                          "spec": {"slicing": slicing, **spec}})


def test_memory_mode_slices_and_full_gpu() -> None:
    plan = plan_node_pool(LABELS, gpus("h100-80gb"), [policy("a", {"mode": "memory", "sliceSize": "10Gi",
                                                                   "allowFullGpu": True})])
    [counters] = plan.counter_sets
    assert counters == {"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}, "compute": {"value": "1000"}}}
    names = [d["name"] for d in plan.devices]
    assert names == [f"gpu-0-a-10gi-{k}" for k in range(8)] + ["gpu-0-a-full"]
    first = plan.devices[0]
    assert first["consumesCounters"] == [{"counterSet": "gpu-0", "counters": {"memory": {"value": "10Gi"},
                                                                             "compute": {"value": "125"}}}]
    assert first["attributes"]["gpuslice.dev/policy"] == {"string": "a"}
    assert first["attributes"]["resource.kubernetes.io/pciBusID"]["string"].startswith("0000:")
    assert [s.suffix for s in plan.slices] == ["counters-00", "devices-00"]


def test_two_memory_policies_share_a_gpu_small_first() -> None:
    plan = plan_node_pool(LABELS, gpus("h100-80gb"), [policy("big", {"mode": "memory", "sliceSize": "20Gi"}),
                                                      policy("small", {"mode": "memory", "sliceSize": "10Gi"})])
    sizes = [d["capacity"]["memory"]["value"] for d in plan.devices]
    assert sizes == ["10Gi"] * 8 + ["20Gi"] * 4
    assert len(plan.counter_sets) == 1


def test_shared_mode_is_one_multi_allocatable_device_per_gpu() -> None:
    plan = plan_node_pool(LABELS, gpus("h100-80gb", 2), [policy("s", {"mode": "shared", "sliceSize": "10Gi"})])
    assert plan.counter_sets == []
    assert [d["name"] for d in plan.devices] == ["gpu-0-s-shared", "gpu-1-s-shared"]
    device = plan.devices[0]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["memory"] == {"value": "80Gi", "requestPolicy": {
        "default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}}


def test_dynamic_mig_offers_every_placement() -> None:
    plan = plan_node_pool(LABELS, gpus("a100-40gb"), [policy("m", {"mode": "mig", "mig": {"profiles": ["1g.5gb", "3g.20gb"]}})])
    names = [d["name"] for d in plan.devices]
    assert names == [mig_device_name(0, "1g.5gb", s) for s in range(7)] + [mig_device_name(0, "3g.20gb", s) for s in (0, 4)]
    three_at_four = plan.devices[-1]
    assert three_at_four["consumesCounters"][0]["counters"] == {f"memory-slice-{i}": {"value": "1"} for i in (4, 5, 6, 7)}
    assert parse_mig_device_name(three_at_four["name"]) == (0, "3g20gb", 4)


def test_static_mig_layout_is_placed_first_fit() -> None:
    plan = plan_node_pool(LABELS, gpus("a100-40gb"), [policy("m", {"mode": "mig", "mig": {"layout": {"3g.20gb": 1, "1g.5gb": 4}}})])
    # 3g.20gb at 0 would leave only three 1g.5gb placements: the planner backtracks to 4.
    assert sorted(d["name"] for d in plan.devices) == sorted(
        [mig_device_name(0, "3g.20gb", 4)] + [mig_device_name(0, "1g.5gb", s) for s in (0, 1, 2, 3)])
    too_much = policy("m", {"mode": "mig", "mig": {"layout": {"4g.20gb": 1, "3g.20gb": 2}}})
    plan = plan_node_pool(LABELS, gpus("a100-40gb"), [too_much])
    assert plan.devices == []
    assert "MIG layout does not fit" in " ".join(plan.notes)


def test_exclusive_mode_takes_the_gpu_from_newer_policies() -> None:
    older = policy("mig", {"mode": "mig", "mig": {"profiles": ["1g.10gb"]}}, created="2026-11-29T09:00:00Z")
    newer = policy("mem", {"mode": "memory", "sliceSize": "10Gi"})
    plan = plan_node_pool(LABELS, gpus("h100-80gb"), [newer, older])
    assert {d["attributes"]["gpuslice.dev/policy"]["string"] for d in plan.devices} == {"mig"}
    assert any("taken by mig" in note for note in plan.notes)


def test_unselected_node_or_gpu_publishes_nothing() -> None:
    other = policy("x", {"mode": "memory", "sliceSize": "10Gi"}, nodeSelector={"matchLabels": {"pool": "other"}})
    assert plan_node_pool(LABELS, gpus("h100-80gb"), [other]).slices == ()
    l4_only = policy("y", {"mode": "memory", "sliceSize": "10Gi"}, gpuSelector={"products": ["NVIDIA L4"]})
    assert plan_node_pool(LABELS, gpus("h100-80gb"), [l4_only]).slices == ()


def test_many_gpus_chunk_counter_sets_and_devices() -> None:
    plan = plan_node_pool(LABELS, gpus("h100-80gb", 16), [policy("a", {"mode": "memory", "sliceSize": "10Gi"})])
    assert [s.suffix for s in plan.slices] == ["counters-00", "counters-01", "devices-00", "devices-01"]
    assert [len(s.shared_counters) for s in plan.slices[:2]] == [8, 8]
    assert [len(s.devices) for s in plan.slices[2:]] == [64, 64]


def test_too_many_slices_per_gpu_are_not_planned() -> None:
    plan = plan_node_pool(LABELS, gpus("h100-80gb"), [policy("a", {"mode": "memory", "sliceSize": "512Mi"})])
    assert list(plan.devices) == []
    assert list(plan.notes) == ["a: sliceSize 512Mi makes more than 64 slices of GPU 0"]
