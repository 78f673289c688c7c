"""The node's pool, for each slicing mode."""

from __future__ import annotations

from gpuslice.planning.devices import Device, gpu_tag
from gpuslice.planning.mig_placement import mig_device_name, parse_mig_device_name
from gpuslice.planning.node.node_pool import plan_node_pool
from tests.builders import policy_model as policy
from tests.unit.planning.node.one_node import LABELS, gpus


def test_memory_mode_slices_and_full_gpu() -> None:
    plan = plan_node_pool(LABELS, gpus("h100-80gb"), [policy("a", {"mode": "memory", "sliceSize": "10G",
                                                                   "allowFullGpu": True})])
    [gpu] = gpus("h100-80gb")
    tag = gpu_tag(gpu.uuid)
    [counters] = plan.counter_sets
    # What NVML reports for an H100 80GB HBM3: 81,559 MiB, so eight slices of 10G (not of 10Gi).
    assert counters == {"name": tag, "counters": {"memory": {"value": "81559Mi"}, "compute": {"value": "1000"}}}
    names = [d["name"] for d in plan.devices]
    assert names == [f"{tag}-a-10g-{k}" for k in range(8)] + [f"{tag}-a-full"]
    first = plan.devices[0]
    assert first["consumesCounters"] == [{"counterSet": tag, "counters": {"memory": {"value": "10G"},
                                                                         "compute": {"value": "116"}}}]
    assert first["attributes"]["gpuslice.dev/parentUUID"] == {"string": gpu.uuid}
    assert plan.devices[-1]["attributes"]["gpuslice.dev/uuid"] == {"string": gpu.uuid}
    assert first["attributes"]["gpuslice.dev/policy"] == {"string": "a"}
    assert first["attributes"]["resource.kubernetes.io/pciBusID"]["string"].startswith("0000:")
    assert [s.suffix for s in plan.slices] == ["counters-00", "devices-00"]


def test_two_memory_policies_share_a_gpu_small_first() -> None:
    plan = plan_node_pool(LABELS, gpus("h100-80gb"), [policy("big", {"mode": "memory", "sliceSize": "20Gi"}),
                                                      policy("small", {"mode": "memory", "sliceSize": "10Gi"})])
    sizes = [d["capacity"]["memory"]["value"] for d in plan.devices]
    assert sizes == ["10Gi"] * 7 + ["20Gi"] * 3, "79.6 GiB hold seven 10Gi and three 20Gi slices"
    assert len(plan.counter_sets) == 1


def test_mps_devices_say_so_and_read_back() -> None:
    plan = plan_node_pool(LABELS, gpus("h100-80gb"), [
        policy("m", {"mode": "memory", "sliceSize": "10G", "isolation": "MPS", "allowFullGpu": True})])
    assert {d["attributes"]["gpuslice.dev/isolation"]["string"] for d in plan.devices} == {"MPS"}
    assert all(Device.from_manifest(d) == t for d, t in zip(plan.devices, plan.typed, strict=True))
    assert {t.isolation for t in plan.typed} == {"MPS"}
    shared = plan_node_pool(LABELS, gpus("h100-80gb"), [
        policy("s", {"mode": "shared", "sliceSize": "10Gi", "isolation": "MPS"})])
    assert [t.isolation for t in shared.typed] == ["MPS"]
    plain = plan_node_pool(LABELS, gpus("h100-80gb"), [policy("p", {"mode": "memory", "sliceSize": "10G"})])
    assert all("gpuslice.dev/isolation" not in d["attributes"] for d in plain.devices), "None adds nothing"


def test_a_gpu_has_one_isolation_the_senior_policys() -> None:
    plan = plan_node_pool(LABELS, gpus("h100-80gb"), [
        policy("old", {"mode": "memory", "sliceSize": "20Gi", "isolation": "MPS"}, created="2026-11-29T09:00:00Z"),
        policy("new", {"mode": "memory", "sliceSize": "10Gi"}),
        policy("also", {"mode": "memory", "sliceSize": "10G", "isolation": "MPS"})])
    assert {t.policy for t in plan.typed} == {"old", "also"}
    assert any("new: GPU 0 is sliced with isolation MPS by old" in n for n in plan.notes)


def test_mps_needs_volta_or_newer() -> None:
    from dataclasses import replace

    old = [replace(g, compute_capability="6.0") for g in gpus("l4")]
    plan = plan_node_pool(LABELS, old, [policy("m", {"mode": "memory", "sliceSize": "4Gi", "isolation": "MPS"})])
    assert plan.devices == []
    assert any("older than Volta; MPS limits need compute capability 7.0+" in n for n in plan.notes)
    assert plan_node_pool(LABELS, old, [policy("m", {"mode": "memory", "sliceSize": "4Gi"})]).devices


def test_shared_mode_is_one_multi_allocatable_device_per_gpu() -> None:
    plan = plan_node_pool(LABELS, gpus("h100-80gb", 2), [policy("s", {"mode": "shared", "sliceSize": "10Gi"})])
    assert plan.counter_sets == []
    assert [d["name"] for d in plan.devices] == sorted(f"{gpu_tag(g.uuid)}-s-shared" for g in gpus("h100-80gb", 2))
    device = plan.devices[0]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["memory"] == {"value": "81559Mi", "requestPolicy": {
        "default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}}


def test_dynamic_mig_offers_every_placement() -> None:
    plan = plan_node_pool(LABELS, gpus("a100-40gb"), [policy("m", {"mode": "mig", "mig": {"profiles": ["1g.5gb", "3g.20gb"]}})])
    tag = gpu_tag(gpus("a100-40gb")[0].uuid)
    names = [d["name"] for d in plan.devices]
    assert names == [mig_device_name(tag, "1g.5gb", s) for s in range(7)] + [mig_device_name(tag, "3g.20gb", s) for s in (0, 4)]
    three_at_four = plan.devices[-1]
    assert three_at_four["consumesCounters"][0]["counters"] == {f"memory-slice-{i}": {"value": "1"} for i in (4, 5, 6, 7)}
    assert parse_mig_device_name(three_at_four["name"]) == (tag, "3g20gb", 4)


def test_static_mig_layout_is_placed_first_fit() -> None:
    plan = plan_node_pool(LABELS, gpus("a100-40gb"), [policy("m", {"mode": "mig", "mig": {"layout": {"3g.20gb": 1, "1g.5gb": 4}}})])
    # 3g.20gb at 0 would leave only three 1g.5gb placements: the planner backtracks to 4.
    tag = gpu_tag(gpus("a100-40gb")[0].uuid)
    assert sorted(d["name"] for d in plan.devices) == sorted(
        [mig_device_name(tag, "3g.20gb", 4)] + [mig_device_name(tag, "1g.5gb", s) for s in (0, 1, 2, 3)])
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
    plan = plan_node_pool(LABELS, gpus("h100-80gb", 16), [policy("a", {"mode": "memory", "sliceSize": "10G"})])
    assert [s.suffix for s in plan.slices] == ["counters-00", "counters-01", "devices-00", "devices-01"]
    assert [len(s.shared_counters) for s in plan.slices[:2]] == [8, 8]
    assert [len(s.devices) for s in plan.slices[2:]] == [64, 64]


def test_too_many_slices_per_gpu_are_not_planned() -> None:
    plan = plan_node_pool(LABELS, gpus("h100-80gb"), [policy("a", {"mode": "memory", "sliceSize": "512Mi"})])
    assert list(plan.devices) == []
    assert list(plan.notes) == ["a: sliceSize 512Mi makes more than 64 slices of GPU 0"]


def test_shared_slice_larger_than_a_gpu_is_left_out_not_published_broken() -> None:
    """A request policy above the device's capacity would make the apiserver reject the slice."""
    plan = plan_node_pool(LABELS, gpus("l4"), [policy("s", {"mode": "shared", "sliceSize": "40Gi"})])
    assert plan.devices == []
    assert plan.notes == ("s: sliceSize 40Gi is larger than GPU 0 (23034Mi)",)
    # min + step (two slices) must fit too, or the apiserver rejects the request policy.
    plan = plan_node_pool(LABELS, gpus("l4"), [policy("s", {"mode": "shared", "sliceSize": "12Gi"})])
    assert plan.devices == []
    assert plan.notes == ("s: sliceSize 12Gi is more than half of GPU 0 (23034Mi); a shared device needs room for two",)


def test_typed_devices_read_back_from_what_is_published() -> None:
    """The kubelet plugin and the controller read devices back from slices: nothing is lost."""
    pols = [policy("a", {"mode": "memory", "sliceSize": "10Gi", "allowFullGpu": True}),
            policy("b", {"mode": "memory", "sliceSize": "20Gi"})]
    for plan in (plan_node_pool(LABELS, gpus("h100-80gb", 2), pols),
                 plan_node_pool(LABELS, gpus("h100-80gb"), [policy("s", {"mode": "shared", "sliceSize": "10Gi"})]),
                 plan_node_pool(LABELS, gpus("a100-40gb"), [policy("m", {"mode": "mig", "mig": {"profiles": ["1g.5gb+me", "3g.20gb"]}})])):
        assert plan.typed
        assert [Device.from_manifest(d) for d in plan.devices] == list(plan.typed)
    assert Device.from_manifest({"name": "x", "attributes": {}}) is None


def test_a_policys_taints_are_on_each_of_its_devices_and_read_back() -> None:
    taints = [{"key": "gpuslice.dev/maintenance", "value": "planned", "effect": "NoSchedule"},
              {"key": "example.com/evict", "effect": "NoExecute"}]
    tainted = policy("a", {"mode": "memory", "sliceSize": "20Gi"}, taints=taints)
    plain = policy("b", {"mode": "memory", "sliceSize": "40Gi"}, created="2026-11-29T11:00:00Z")
    plan = plan_node_pool(LABELS, gpus("h100-80gb"), [tainted, plain])
    for device in plan.devices:
        policy_name = device["attributes"]["gpuslice.dev/policy"]["string"]
        if policy_name == "a":
            assert device["taints"] == [taints[0], taints[1]]  # no empty value: the apiserver would drop it
        else:
            assert "taints" not in device
    assert [Device.from_manifest(d) for d in plan.devices] == list(plan.typed)


def test_mig_device_names_of_plus_me_and_go_nvlibs_minus_me_differ() -> None:
    """``+me`` keeps its published spelling; go-nvlib's ``-me`` (no media engine) gets its own."""
    names = {p: mig_device_name("gpu-2d3e5f1a", p, 3) for p in ("1g.10gb+me", "1g.10gb-me", "1g.10gb+me.all",
                                                                  "1g.10gb")}
    assert names["1g.10gb+me"] == "gpu-2d3e5f1a-mig-1g10gb-me-at-3"
    assert names["1g.10gb-me"] == "gpu-2d3e5f1a-mig-1g10gb-nome-at-3"
    assert len(set(names.values())) == len(names)
