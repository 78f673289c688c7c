"""The node's pool: GPU inventory + the policies that select the node -> ResourceSlice
content. Pure and deterministic: the same inputs give byte-identical slices.

Layout (Kubernetes 1.35+): counter sets and devices live in separate slices of
one pool; at most 8 counter sets per slice and 64 devices per slice that uses
counters or taints. Devices are ordered small to large, because the scheduler
takes the first device that fits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.names import ATTRIBUTE_DOMAIN, short_hash
from gpuslice.dra.quantity import format_bytes, quantity_bytes
from gpuslice.inventory.catalog import MEMORY_SLICES, MigProfile
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.mig import mig_device_name, static_layout
from gpuslice.planning.validation import MAX_SLICES_PER_GPU, seniority

MAX_COUNTER_SETS = 8
MAX_DEVICES = 64
COMPUTE_UNITS = 1000  # a GPU's compute, in thousandths, shared in proportion to memory
Device = dict[str, Any]


@dataclass(frozen=True)
class PlannedSlice:
    """One slice of the pool, before the publisher adds node, driver and generation."""

    suffix: str  # the slice is named gpuslice-<node>-<suffix>
    shared_counters: tuple[dict[str, Any], ...] = ()
    devices: tuple[Device, ...] = ()


@dataclass(frozen=True)
class NodePlan:
    slices: tuple[PlannedSlice, ...]
    notes: tuple[str, ...] = ()  # why a policy left a GPU out, for logs and status

    @property
    def devices(self) -> list[Device]:
        return [d for s in self.slices for d in s.devices]

    @property
    def counter_sets(self) -> list[dict[str, Any]]:
        return [c for s in self.slices for c in s.shared_counters]


def _attr(value: str | int) -> dict[str, str | int]:
    return {"int": value} if isinstance(value, int) else {"string": value}


def _attributes(policy: GpuSlicePolicy, gpu: Gpu, mode: str, **extra: str | int) -> dict[str, Any]:
    attrs = {
        f"{ATTRIBUTE_DOMAIN}/policy": _attr(policy.name),
        f"{ATTRIBUTE_DOMAIN}/mode": _attr(mode),
        f"{ATTRIBUTE_DOMAIN}/productName": _attr(gpu.product_name[:64]),
        f"{ATTRIBUTE_DOMAIN}/index": _attr(gpu.index),
        "resource.kubernetes.io/pciBusID": _attr(gpu.pci_bus_id),
    }
    attrs.update({f"{ATTRIBUTE_DOMAIN}/{k}": _attr(v) for k, v in extra.items()})
    return attrs


def _policy_tag(policy: str, room: int) -> str:
    return policy if len(policy) <= room else f"p{short_hash(policy, length=8)}"


def device_name(gpu: int, policy: str, what: str) -> str:
    """``gpu-0-inference-10gi-3``; the policy becomes a hash when the name would pass 63."""
    return f"gpu-{gpu}-{_policy_tag(policy, 63 - len(f'gpu-{gpu}--{what}'))}-{what}"


def selects(policy: GpuSlicePolicy, labels: Mapping[str, str], gpu: Gpu) -> bool:
    spec = policy.spec
    if not spec.node_selector.matches(dict(labels)):
        return False
    if spec.gpu_selector.products and gpu.product_name not in spec.gpu_selector.products:
        return False
    return gpu.memory >= spec.gpu_selector.min_memory_bytes


def _memory_devices(gpu: Gpu, policies: Sequence[GpuSlicePolicy], notes: list[str]) -> list[Device]:
    devices = []
    counter_set = f"gpu-{gpu.index}"

    def consumes(memory: int) -> list[dict[str, Any]]:
        compute = COMPUTE_UNITS * memory // gpu.memory
        return [{"counterSet": counter_set, "counters": {
            "memory": {"value": format_bytes(memory)}, "compute": {"value": str(compute)}}}]

    for policy in policies:
        size = policy.spec.slicing.slice_bytes
        if size > gpu.memory:
            notes.append(f"{policy.name}: sliceSize {policy.spec.slicing.slice_size} is larger than GPU {gpu.index}")
            continue
        if gpu.memory // size > MAX_SLICES_PER_GPU:
            notes.append(f"{policy.name}: sliceSize {policy.spec.slicing.slice_size} makes more than"
                         f" {MAX_SLICES_PER_GPU} slices of GPU {gpu.index}")
            continue
        tag = format_bytes(size).lower()
        for k in range(gpu.memory // size):
            devices.append({
                "name": device_name(gpu.index, policy.name, f"{tag}-{k}"),
                "attributes": _attributes(policy, gpu, "memory", parentUUID=gpu.uuid,
                                          sliceSize=policy.spec.slicing.slice_size or ""),
                "capacity": {"memory": {"value": format_bytes(size)}},
                "consumesCounters": consumes(size),
            })
        if policy.spec.slicing.allow_full_gpu:
            devices.append({
                "name": device_name(gpu.index, policy.name, "full"),
                "attributes": _attributes(policy, gpu, "memory", uuid=gpu.uuid, sliceSize="full"),
                "capacity": {"memory": {"value": format_bytes(gpu.memory)}},
                "consumesCounters": consumes(gpu.memory),
            })
    return devices


def _shared_device(gpu: Gpu, policy: GpuSlicePolicy) -> Device:
    size = format_bytes(policy.spec.slicing.slice_bytes)
    return {
        "name": device_name(gpu.index, policy.name, "shared"),
        "attributes": _attributes(policy, gpu, "shared", uuid=gpu.uuid, sliceSize=policy.spec.slicing.slice_size or ""),
        "allowMultipleAllocations": True,
        "capacity": {"memory": {"value": format_bytes(gpu.memory),
                                "requestPolicy": {"default": size, "validRange": {"min": size, "step": size}}}},
    }


def _mig_device(gpu: Gpu, policy: GpuSlicePolicy, profile: MigProfile, start: int) -> Device:
    counters = {f"memory-slice-{i}": {"value": "1"} for i in range(start, start + profile.size)}
    if profile.media:
        counters["media-engines"] = {"value": "1"}
    return {
        "name": mig_device_name(gpu.index, profile.name, start),
        "attributes": _attributes(policy, gpu, "mig", parentUUID=gpu.uuid, profile=profile.name,
                                  placementStart=start, placementSize=profile.size),
        "capacity": {"memory": {"value": format_bytes(profile.memory)}},
        "consumesCounters": [{"counterSet": f"gpu-{gpu.index}-mig", "counters": counters}],
    }


def _mig_devices(gpu: Gpu, policy: GpuSlicePolicy, notes: list[str]) -> list[Device]:
    mig = policy.spec.slicing.mig
    assert mig is not None
    if not gpu.mig_capable:
        notes.append(f"{policy.name}: GPU {gpu.index} ({gpu.product_name}) has no MIG")
        return []
    if mig.layout:
        placed = static_layout(gpu, mig.layout)
        if placed is None:
            notes.append(f"{policy.name}: MIG layout does not fit GPU {gpu.index} ({gpu.product_name})")
            return []
        return [_mig_device(gpu, policy, profile, start) for profile, start in placed]
    devices: list[Device] = []
    for name in mig.profiles or []:
        profile = gpu.mig_profile(name)
        if profile is None:
            notes.append(f"{policy.name}: GPU {gpu.index} ({gpu.product_name}) has no MIG profile {name}")
            continue
        devices.extend(_mig_device(gpu, policy, profile, start) for start in profile.starts)
    return devices


def _counter_set(gpu: Gpu, mode: str) -> dict[str, Any]:
    if mode == "mig":
        counters = {f"memory-slice-{i}": {"value": "1"} for i in range(MEMORY_SLICES)}
        counters["media-engines"] = {"value": "1"}
        return {"name": f"gpu-{gpu.index}-mig", "counters": counters}
    return {"name": f"gpu-{gpu.index}", "counters": {
        "memory": {"value": format_bytes(gpu.memory)}, "compute": {"value": str(COMPUTE_UNITS)}}}


def _consumed_memory(device: Device) -> int:
    return quantity_bytes(device["capacity"]["memory"]["value"])


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def plan_node_pool(labels: Mapping[str, str], gpus: Sequence[Gpu], policies: Iterable[GpuSlicePolicy]) -> NodePlan:
    """The node's pool for these GPUs and policies.

    Per GPU, the most senior policy that selects it decides its mode: memory-mode
    policies share a GPU (its counters keep their sum within the GPU); a shared or
    MIG policy has it to itself. Policies being deleted publish nothing new.
    """
    active = sorted((p for p in policies if not p.metadata.deletion_timestamp), key=seniority)
    counter_sets: list[dict[str, Any]] = []
    devices: list[Device] = []
    notes: list[str] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        takers = [p for p in active if selects(p, labels, gpu)]
        if not takers:
            continue
        mode = takers[0].spec.slicing.mode
        if mode == "memory":
            sharing = [p for p in takers if p.spec.slicing.mode == "memory"]
            notes += [f"{p.name}: GPU {gpu.index} is taken by {takers[0].name} ({mode} mode)"
                      for p in takers if p.spec.slicing.mode != "memory"]
            found = _memory_devices(gpu, sorted(sharing, key=lambda p: (p.spec.slicing.slice_bytes, seniority(p))),
                                    notes)
        else:
            notes += [f"{p.name}: GPU {gpu.index} is taken by {takers[0].name} ({mode} mode)" for p in takers[1:]]
            found = [_shared_device(gpu, takers[0])] if mode == "shared" else _mig_devices(gpu, takers[0], notes)
        if not found:
            continue
        if mode != "shared":
            counter_sets.append(_counter_set(gpu, mode))
        devices.extend(found)
    return NodePlan(layout(counter_sets, devices), tuple(notes))


def layout(counter_sets: Sequence[dict[str, Any]], devices: Sequence[Device]) -> tuple[PlannedSlice, ...]:
    """Counter sets and devices into slices within the API's limits, small devices first."""
    ordered = sorted(devices, key=lambda d: (_consumed_memory(d), d["name"]))
    counters = sorted(counter_sets, key=lambda c: str(c["name"]))
    slices = [PlannedSlice(f"counters-{i:02d}", shared_counters=tuple(chunk))
              for i, chunk in enumerate(_chunks(counters, MAX_COUNTER_SETS))]
    slices += [PlannedSlice(f"devices-{i:02d}", devices=tuple(chunk))
               for i, chunk in enumerate(_chunks(ordered, MAX_DEVICES))]
    return tuple(slices)
