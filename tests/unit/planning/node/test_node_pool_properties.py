"""Property tests: for random inventories and policy sets, the plan keeps every rule."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.quantity import quantity_bytes
from gpuslice.inventory.catalog import MODELS
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.devices import gpu_tag
from gpuslice.planning.node.node_pool import MAX_COUNTER_SETS, MAX_DEVICES, plan_node_pool
from gpuslice.planning.node.pool_safety import make_safe
from gpuslice.planning.reads.usage import PENDING_TAINT_KEY

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
            memory = shared[0]["capacity"]["memory"]
            assert quantity_bytes(memory["value"]) <= gpu.memory
            valid = memory["requestPolicy"]["validRange"]  # what the apiserver checks: min + step fits
            assert quantity_bytes(valid["min"]) + quantity_bytes(valid["step"]) <= quantity_bytes(memory["value"])
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


def _uuid(device: dict[str, Any]) -> str:
    attributes = device["attributes"]
    return str((attributes.get("gpuslice.dev/uuid") or attributes["gpuslice.dev/parentUUID"])["string"])


def _without_pending(device: dict[str, Any]) -> dict[str, Any]:
    taints = [t for t in device.get("taints", []) if t["key"] != PENDING_TAINT_KEY]
    return {**{k: v for k, v in device.items() if k != "taints"}, **({"taints": taints} if taints else {})}


def assert_each_gpu_guarded_once(slices: Any, memory: dict[str, int]) -> None:
    """What is published lets no GPU's memory be handed out twice: each counter set that devices
    consume is published and guards one physical GPU with that GPU's memory, each GPU is guarded
    by one counter set, and a shared device (guarded by capacity, not counters) is alone on its GPU."""
    devices = [d for s in slices for d in s.devices]
    published_sets = {c["name"]: c for s in slices for c in s.shared_counters}
    guards: dict[str, str] = {}
    by_gpu: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for device in devices:
        by_gpu[_uuid(device)].append(device)
        for use in device.get("consumesCounters", []):
            assert use["counterSet"] in published_sets, f"{device['name']} uses an unpublished counter set"
            assert guards.setdefault(use["counterSet"], _uuid(device)) == _uuid(device), \
                f"counter set {use['counterSet']} guards two GPUs"
    for uuid, on_gpu in by_gpu.items():
        sets = {u["counterSet"] for d in on_gpu for u in d.get("consumesCounters", [])}
        assert len(sets) <= 1, f"GPU {uuid} is under two counter sets: {sorted(sets)}"
        if any(d.get("allowMultipleAllocations") for d in on_gpu):
            assert len(on_gpu) == 1, f"a shared device of GPU {uuid} is published next to others"
        for name in sets:
            counters = published_sets[name]["counters"]
            if "memory" in counters:
                assert quantity_bytes(counters["memory"]["value"]) == memory[uuid]


@st.composite
def inventory_histories(draw: st.DrawFn) -> list[list[Gpu]]:
    """A node's GPUs over successive agent restarts: GPUs drop off the bus, come back, are
    replaced by new ones, and are enumerated in another order (indexes are positions)."""
    physical = FakeBackend("n1", draw(inventories)).discover()
    physical += FakeBackend("spare", draw(inventories)).discover()  # other UUIDs: replacements
    history = []
    for _ in range(draw(st.integers(2, 4))):
        present = draw(st.lists(st.sampled_from(physical), min_size=1, max_size=10, unique_by=lambda g: g.uuid))
        history.append([replace(g, index=i, minor=i) for i, g in enumerate(present)])
    return history


@settings(max_examples=150, deadline=None)
@given(inventory_histories(), st.data())
def test_no_inventory_change_puts_one_gpu_under_two_counter_sets(history: list[list[Gpu]],
                                                                 data: st.DataObject) -> None:
    """The agent restarts after each inventory change, with claims holding some devices, devices
    draining, and the policies edited meanwhile. Whatever is published at each step keeps every
    GPU guarded once, and every allocated device stays exactly as it was published."""
    memory = {g.uuid: g.memory for step in history for g in step}
    published: list[dict[str, Any]] = []
    counter_sets: list[dict[str, Any]] = []
    allocated: set[str] = set()
    draining: set[str] = set()
    for gpus in history:
        pols = data.draw(policies(), label="policies")
        plan = plan_node_pool(LABELS, gpus, pols)
        assert_each_gpu_guarded_once(plan.slices, memory)
        drained = data.draw(st.sets(st.sampled_from(sorted(draining))) if draining else st.just(set[str]()))
        safe = make_safe(plan, published, counter_sets, allocated, drained=drained)
        assert_each_gpu_guarded_once(safe.slices, memory)
        now = {d["name"]: d for s in safe.slices for d in s.devices}
        before = {d["name"]: d for d in published}
        for name in allocated:
            assert name in now, f"allocated device {name} was removed"
            assert _without_pending(now[name]) == _without_pending(before[name]), f"allocated {name} changed"
        published, counter_sets = list(now.values()), [c for s in safe.slices for c in s.shared_counters]
        draining = set(safe.draining)
        # Claims come and go: some held devices are released, some free ones allocated.
        names = sorted(now)
        released = data.draw(st.sets(st.sampled_from(sorted(allocated)))) if allocated else set()
        taken = data.draw(st.sets(st.sampled_from(names), max_size=8)) if names else set()
        allocated = (allocated - released) | taken
