"""Allocated devices are never removed or changed; the change waits, tainted."""

from __future__ import annotations

from typing import Any

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.planning.devices import gpu_tag
from gpuslice.planning.node.node_pool import plan_node_pool
from gpuslice.planning.node.pool_safety import PENDING_TAINT_KEY, changing, make_safe

LABELS = {"kubernetes.io/hostname": "n1"}
GPUS = FakeBackend("n1", [("h100-80gb", 1)]).discover()
T = gpu_tag(GPUS[0].uuid)  # the GPU's name in counter sets and devices


def plan(slicing: dict[str, Any]) -> Any:
    return plan_node_pool(LABELS, GPUS, [GpuSlicePolicy.model_validate(
        {"metadata": {"name": "p", "creationTimestamp": "2026-11-29T10:00:00Z"}, "spec": {"slicing": slicing}})])


def published(p: Any) -> list[dict[str, Any]]:
    """As the apiserver returns them: quantities canonical, taints with timeAdded."""
    return [dict(d) for d in p.devices]


def test_unchanged_allocated_device_is_not_held() -> None:
    old = plan({"mode": "memory", "sliceSize": "10G"})
    safe = make_safe(old, published(old), old.counter_sets, {f"{T}-p-10g-0"})
    assert safe.held == ()
    assert [d["name"] for s in safe.slices for d in s.devices] == [d["name"] for d in old.devices]


def test_resized_policy_keeps_allocated_slice_tainted_and_adds_the_new_ones() -> None:
    old, new = plan({"mode": "memory", "sliceSize": "10G"}), plan({"mode": "memory", "sliceSize": "20G"})
    safe = make_safe(new, published(old), old.counter_sets, {f"{T}-p-10g-3"})
    devices = {d["name"]: d for s in safe.slices for d in s.devices}
    assert safe.held == (f"{T}-p-10g-3",)
    kept = devices[f"{T}-p-10g-3"]
    assert kept["consumesCounters"] == old.devices[3]["consumesCounters"], "consumption never changes"
    assert kept["taints"] == [{"key": PENDING_TAINT_KEY, "effect": "NoSchedule"}]
    assert sorted(n for n in devices if "20g" in n) == [f"{T}-p-20g-{k}" for k in range(4)]
    assert f"{T}-p-10g-0" not in devices, "unallocated old slices go at once"
    # Same counter set: the scheduler can only hand out 20G slices that fit next to the held 10G.
    assert [c["name"] for s in safe.slices for c in s.shared_counters] == [T]


def test_mode_change_waits_for_the_gpu_to_be_free() -> None:
    old, new = plan({"mode": "memory", "sliceSize": "10G"}), plan({"mode": "shared", "sliceSize": "10G"})
    safe = make_safe(new, published(old), old.counter_sets, {f"{T}-p-10g-0"})
    names = [d["name"] for s in safe.slices for d in s.devices]
    assert names == [f"{T}-p-10g-0"]
    assert safe.blocked_gpus == (GPUS[0].uuid,)
    assert [c["name"] for s in safe.slices for c in s.shared_counters] == [T], "the held device's counters stay"


def test_removed_policy_keeps_only_allocated_devices() -> None:
    old = plan({"mode": "memory", "sliceSize": "10G"})
    nothing = plan_node_pool(LABELS, GPUS, [])
    safe = make_safe(nothing, published(old), old.counter_sets, {f"{T}-p-10g-5"})
    assert [d["name"] for s in safe.slices for d in s.devices] == [f"{T}-p-10g-5"]
    assert safe.held == (f"{T}-p-10g-5",)


def test_held_device_with_server_defaults_is_still_unchanged() -> None:
    old = plan({"mode": "memory", "sliceSize": "10G"})
    server = published(old)
    server[0] = {**server[0], "capacity": {"memory": {"value": "10000000000"}}}  # same quantity, other spelling
    assert make_safe(old, server, old.counter_sets, {server[0]["name"]}).held == ()


def test_free_devices_drain_tainted_before_they_change() -> None:
    old, new = plan({"mode": "memory", "sliceSize": "10G"}), plan({"mode": "memory", "sliceSize": "20G"})
    old_names = {d["name"] for d in old.devices}

    first = make_safe(new, published(old), old.counter_sets, set(), drained=set())
    devices = {d["name"]: d for s in first.slices for d in s.devices}
    assert set(first.draining) == old_names
    assert first.held == ()
    assert all(devices[n]["taints"] == [{"key": PENDING_TAINT_KEY, "effect": "NoSchedule"}] for n in old_names)
    assert sorted(n for n in devices if "20g" in n) == [f"{T}-p-20g-{k}" for k in range(4)], \
        "the new slices come at once, under the same counters"

    # Drained, and the claims read again: one was allocated meanwhile; it is held, the rest go.
    late = f"{T}-p-10g-2"
    second = make_safe(new, [d for s in first.slices for d in s.devices], old.counter_sets, {late},
                       drained=old_names)
    names = {d["name"] for s in second.slices for d in s.devices}
    assert second.held == (late,)
    assert second.draining == ()
    assert names & old_names == {late}


def test_drain_of_a_mode_change_keeps_the_new_devices_off_the_gpu() -> None:
    old, new = plan({"mode": "memory", "sliceSize": "10G"}), plan({"mode": "shared", "sliceSize": "10G"})
    safe = make_safe(new, published(old), old.counter_sets, set(), drained=set())
    assert safe.blocked_gpus == (GPUS[0].uuid,)
    assert {d["name"] for s in safe.slices for d in s.devices} == {d["name"] for d in old.devices}


def test_frozen_policy_keeps_its_devices_untainted_and_its_gpu() -> None:
    old = plan({"mode": "memory", "sliceSize": "10G"})
    names = {d["name"] for d in old.devices}
    other = plan_node_pool(LABELS, GPUS, [GpuSlicePolicy.model_validate(
        {"metadata": {"name": "q", "creationTimestamp": "2026-11-29T11:00:00Z"},
         "spec": {"slicing": {"mode": "shared", "sliceSize": "10G"}}})])
    safe = make_safe(other, published(old), old.counter_sets, set(), drained=set(), frozen=names)
    devices = {d["name"]: d for s in safe.slices for d in s.devices}
    assert set(devices) == names, "another policy's devices never land on a GPU a frozen one holds"
    assert not any(d.get("taints") for d in devices.values())
    assert (safe.held, safe.draining, safe.blocked_gpus) == ((), (), (GPUS[0].uuid,))


def test_a_taint_reaches_an_allocated_device_at_once() -> None:
    """A policy's taint (NoExecute evicts) must not wait for the claim like a change of shape does."""
    taint = {"key": "gpuslice.dev/maintenance", "effect": "NoExecute"}
    old = plan({"mode": "memory", "sliceSize": "10G"})
    new = plan_node_pool(LABELS, GPUS, [GpuSlicePolicy.model_validate(
        {"metadata": {"name": "p", "creationTimestamp": "2026-11-29T10:00:00Z"},
         "spec": {"slicing": {"mode": "memory", "sliceSize": "10G"}, "taints": [taint]}})])
    allocated = f"{T}-p-10g-0"
    assert changing(new, published(old)) == set()  # nothing a claim holds changes: no claims to read
    safe = make_safe(new, published(old), old.counter_sets, {allocated}, drained=set())
    devices = {d["name"]: d for s in safe.slices for d in s.devices}
    assert safe.held == ()
    assert safe.draining == ()
    assert devices[allocated]["taints"] == [taint]


def test_only_devices_that_change_shape_need_the_claims() -> None:
    old, new = plan({"mode": "memory", "sliceSize": "10G"}), plan({"mode": "memory", "sliceSize": "20G"})
    assert changing(old, published(old)) == set()
    assert changing(new, published(old)) == {d["name"] for d in old.devices}
    assert changing(new, published(old), frozen={f"{T}-p-10g-0"}) == {d["name"] for d in old.devices} - {
        f"{T}-p-10g-0"}
