"""Property tests: for random inventories and policy sets, the plan keeps every rule."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.quantity import quantity_bytes
from gpuslice.inventory.catalog import MODELS
from gpuslice.planning.devices import gpu_tag
from gpuslice.planning.node_pool import MAX_COUNTER_SETS, MAX_DEVICES, plan_node_pool

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABELS = {"kubernetes.io/hostname": "n1", "zone": "a"}

inventories = st.lists(st.tuples(st.sampled_from(sorted(MODELS)), st.integers(1, 8)), min_size=1, max_size=3)
names = st.from_regex(r"[a-z][a-z0-9-]{0,48}[a-z0-9]", fullmatch=True)


@st.composite
def policies(draw: st.DrawFn) -> list[GpuSlicePolicy]:
    result = []
    for i, name in enumerate(draw(st.lists(names, min_size=1, max_size=4, unique=True))):
        mode = draw(st.sampled_from(["memory", "memory", "shared", "mig"]))
        slicing: dict[str, Any] = {"mode": mode}
        if mode == "mig":
            slicing["mig"] = {"profiles": draw(st.lists(st.sampled_from(["1g.5gb", "1g.10gb", "2g.20gb", "3g.40gb",
                                                                         "1g.10gb+me", "7g.80gb", "3g.20gb"]),
                                                        min_size=1, max_size=3, unique=True))}
        else:
            slicing["sliceSize"] = draw(st.sampled_from(["5Gi", "10Gi", "12Gi", "20Gi", "40Gi", "100Gi"]))
            slicing["allowFullGpu"] = mode == "memory" and draw(st.booleans())
        selector = draw(st.sampled_from([{}, {"matchLabels": {"zone": "a"}}, {"matchLabels": {"zone": "b"}}]))
        result.append(GpuSlicePolicy.model_validate({
            "metadata": {"name": name, "creationTimestamp": f"2026-11-29T10:00:{i:02d}Z"},
            "spec": {"slicing": slicing, "nodeSelector": selector},
        }))
    return result


@settings(max_examples=150, deadline=None)
@given(inventories, policies())
def test_plan_keeps_api_limits_and_never_oversubscribes(inventory: list[tuple[str, int]], pols: list[GpuSlicePolicy]) -> None:
    gpus = FakeBackend("n1", inventory).discover()
    plan = plan_node_pool(LABELS, gpus, pols)

    for planned in plan.slices:
        assert not (planned.shared_counters and planned.devices), "1.35+: counters and devices in separate slices"
        assert len(planned.shared_counters) <= MAX_COUNTER_SETS
        assert len(planned.devices) <= MAX_DEVICES
    device_names = [d["name"] for d in plan.devices]
    assert len(device_names) == len(set(device_names))
    assert all(DNS_LABEL.match(n) and len(n) <= 63 for n in device_names)
    set_names = [c["name"] for c in plan.counter_sets]
    assert len(set_names) == len(set(set_names))
    assert all(DNS_LABEL.match(n) for n in set_names)

    # Whatever combination of devices the scheduler picks within the counters, no GPU goes over.
    sets = {c["name"]: {k: quantity_bytes(v["value"]) for k, v in c["counters"].items()} for c in plan.counter_sets}
    for device in plan.devices:
        for use in device.get("consumesCounters", []):
            assert use["counterSet"] in sets
            for counter, value in use["counters"].items():
                assert quantity_bytes(value["value"]) <= sets[use["counterSet"]][counter]
    by_gpu: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for device in plan.devices:
        attributes = device["attributes"]
        by_gpu[(attributes.get("gpuslice.dev/uuid") or attributes["gpuslice.dev/parentUUID"])["string"]].append(device)
    for uuid, devices in by_gpu.items():
        [gpu] = [g for g in gpus if g.uuid == uuid]
        tag = gpu_tag(uuid)
        counter_sets = {u["counterSet"] for d in devices for u in d.get("consumesCounters", [])}
        shared = [d for d in devices if d.get("allowMultipleAllocations")]
        assert len(counter_sets) <= 1, "one counter set guards each GPU"
        if shared:
            assert len(devices) == 1, "a shared device has its GPU to itself"
            assert quantity_bytes(shared[0]["capacity"]["memory"]["value"]) <= gpu.memory
        elif counter_sets == {tag}:
            # memory counter == GPU memory: any set of devices the counters admit fits the GPU
            assert sets[tag]["memory"] == gpu.memory
        else:
            assert counter_sets == {f"{tag}-mig"}
            assert sets[f"{tag}-mig"] == {**{f"memory-slice-{i}": 1 for i in range(8)}, "media-engines": 1}

    # Small partitions first: the scheduler is first-fit.
    sizes = [quantity_bytes(d["capacity"]["memory"]["value"]) for d in plan.devices]
    assert sizes == sorted(sizes)


@settings(max_examples=50, deadline=None)
@given(inventories, policies())
def test_plan_is_deterministic(inventory: list[tuple[str, int]], pols: list[GpuSlicePolicy]) -> None:
    gpus = FakeBackend("n1", inventory).discover()
    assert plan_node_pool(LABELS, gpus, pols) == plan_node_pool(LABELS, gpus, list(reversed(pols)))


@settings(max_examples=50, deadline=None)
@given(inventories, policies())
def test_policy_that_does_not_select_the_node_contributes_nothing(inventory: list[tuple[str, int]],
                                                                  pols: list[GpuSlicePolicy]) -> None:
    gpus = FakeBackend("n1", inventory).discover()
    elsewhere = [p for p in pols if p.spec.node_selector.match_labels.get("zone") == "b"]
    plan = plan_node_pool(LABELS, gpus, pols)
    assert not {d["attributes"]["gpuslice.dev/policy"]["string"] for d in plan.devices} & {p.name for p in elsewhere}


@settings(max_examples=100, deadline=None)
@given(inventories, policies(), st.data())
def test_no_inventory_change_puts_one_gpu_under_two_counter_sets(
        inventory: list[tuple[str, int]], pols: list[GpuSlicePolicy], data: st.DataObject) -> None:
    """A GPU drops off the bus and the agent restarts: the others' indexes shift, some devices are
    allocated. Whatever is published then, each counter set guards one physical GPU, each GPU is
    guarded by one counter set, and a set's memory is that GPU's."""
    from dataclasses import replace

    from gpuslice.planning.pool_safety import make_safe

    before = FakeBackend("n1", inventory).discover()
    plan = plan_node_pool(LABELS, before, pols)
    lost = data.draw(st.sampled_from(before))
    after = [replace(g, index=i) for i, g in enumerate(g for g in before if g.uuid != lost.uuid)]
    names = [d["name"] for d in plan.devices]
    allocated = set(data.draw(st.lists(st.sampled_from(names), unique=True, max_size=8))) if names else set()
    safe = make_safe(plan_node_pool(LABELS, after, pols), plan.devices, plan.counter_sets, allocated, drained=set())

    uuid_of = {}
    for planned in safe.slices:
        for device in planned.devices:
            attributes = device["attributes"]
            uuid = (attributes.get("gpuslice.dev/uuid") or attributes["gpuslice.dev/parentUUID"])["string"]
            for use in device.get("consumesCounters", []):
                assert uuid_of.setdefault(use["counterSet"], uuid) == uuid, "one counter set, two GPUs"
    guarded: dict[str, set[str]] = defaultdict(set)
    for counter_set, uuid in uuid_of.items():
        guarded[uuid].add(counter_set)
    assert all(len(sets) == 1 for sets in guarded.values()), "one GPU under two counter sets"
    memory = {g.uuid: g.memory for g in before}
    for planned in safe.slices:
        for counter_set in planned.shared_counters:
            if "memory" in counter_set["counters"] and counter_set["name"] in uuid_of:
                assert quantity_bytes(counter_set["counters"]["memory"]["value"]) == memory[uuid_of[counter_set["name"]]]
