"""The node's pool: GPU inventory + the policies that select the node -> ResourceSlice
content. Pure and deterministic: the same inputs give byte-identical slices.

Layout (Kubernetes 1.35+): counter sets and devices live in separate slices of
one pool; at most 8 counter sets per slice and 64 devices per slice that uses
counters or taints. Devices are ordered small to large, because the scheduler
takes the first device that fits. What a device is, per slicing mode, is the
business of ``planning.modes``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.wire import device_memory
from gpuslice.inventory.gpus import Gpu
from gpuslice.inventory.nodes import same_product
from gpuslice.jsontypes import Object
from gpuslice.planning.devices import CounterSet, Device, gpu_tag
from gpuslice.planning.left_out import LeftOut
from gpuslice.planning.modes import mode_of
from gpuslice.planning.node.coexistence import MIG_MANAGER_LABEL, mig_manager_active
from gpuslice.planning.node.mig_mode import conflict_note, mig_mode_conflict
from gpuslice.planning.selection import seniority

MAX_COUNTER_SETS = 8
MAX_DEVICES = 64
MPS_MIN_COMPUTE_CAPABILITY = 7  # Volta


@dataclass(frozen=True)
class PlannedSlice:
    """One slice of the pool, before the publisher adds node, driver and generation."""

    suffix: str  # the slice is named gpuslice-<node>-<suffix>
    shared_counters: tuple[dict[str, Any], ...] = ()
    devices: tuple[Object, ...] = ()


@dataclass(frozen=True)
class NodePlan:
    """The pool as planned, typed; its JSON is rendered once, when first asked for.

    What is published and what a held device must stay is JSON (``planning.node.pool_safety``):
    the safety layer compares and keeps what the API server holds, verbatim, whichever version of
    the agent wrote it. So the plan is typed up to its slices, and the safety layer works on them.
    """

    typed: tuple[Device, ...] = ()  # the planned devices, small first (the scheduler takes the first that fits)
    guards: tuple[CounterSet, ...] = ()  # the counter sets that guard their GPUs
    notes: tuple[str, ...] = ()  # why a policy left a GPU out, for logs and status
    left_out: tuple[LeftOut, ...] = ()  # GPUs left out for a state the controller cannot see (planning.left_out)

    @cached_property
    def slices(self) -> tuple[PlannedSlice, ...]:
        return layout([c.manifest() for c in self.guards], [d.manifest() for d in self.typed])

    @property
    def devices(self) -> list[Object]:
        return [d for s in self.slices for d in s.devices]

    @property
    def counter_sets(self) -> list[dict[str, Any]]:
        return [c for s in self.slices for c in s.shared_counters]


def selects(policy: GpuSlicePolicy, labels: Mapping[str, str], gpu: Gpu) -> bool:
    spec = policy.spec
    if not spec.node_selector.matches(dict(labels)):
        return False
    if spec.gpu_selector.products and not any(same_product(gpu.product_name, p) for p in spec.gpu_selector.products):
        return False
    return gpu.memory >= spec.gpu_selector.min_memory_bytes


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _ambiguous_tags(gpus: Sequence[Gpu], notes: list[str]) -> set[str]:
    """GPU tags two GPUs share (eight hex digits of two UUIDs alike: about one node in 10^8).
    Such GPUs publish nothing rather than one counter set for two GPUs."""
    counts = Counter(gpu_tag(g.uuid) for g in gpus)
    clashing = {tag for tag, n in counts.items() if n > 1}
    notes += [f"GPUs {', '.join(g.uuid for g in gpus if gpu_tag(g.uuid) == tag)} share the name {tag}; they"
              " are left out" for tag in sorted(clashing)]
    return clashing


def _tainted(devices: Sequence[Device], policies: Sequence[GpuSlicePolicy]) -> list[Device]:
    """Each device carries its policy's ``spec.taints``: the taint travels with the device the
    agent publishes, instead of a DeviceTaintRule per device (72,000 of them for one tainted
    policy on 1,000 nodes of 8 GPUs in 9 devices each)."""
    taints = {p.name: tuple((t.key, t.value, t.effect) for t in p.spec.taints) for p in policies}
    return [replace(d, taints=taints[d.policy]) if taints.get(d.policy) else d for d in devices]


def _isolated(devices: Sequence[Device], policies: Sequence[GpuSlicePolicy]) -> list[Device]:
    """Devices of a policy with ``slicing.isolation: MPS`` say so (``gpuslice.dev/isolation``)."""
    mps = {p.name for p in policies if p.spec.slicing.isolation == "MPS"}
    return [replace(d, isolation="MPS") if d.policy in mps else d for d in devices]


def _volta_or_newer(gpu: Gpu) -> bool:
    major, _, _ = gpu.compute_capability.partition(".")
    return major.isdigit() and int(major) >= MPS_MIN_COMPUTE_CAPABILITY


def _isolation_takers(gpu: Gpu, sharing: list[GpuSlicePolicy], notes: list[str]) -> list[GpuSlicePolicy]:
    """The policies that may slice ``gpu`` together: one MPS control daemon serves every client of a
    GPU, so the most senior policy's isolation is the GPU's, and MPS needs Volta or newer (its
    per-client memory and thread limits are Volta MPS features)."""
    isolation = sharing[0].spec.slicing.isolation
    notes += [f"{p.name}: GPU {gpu.index} is sliced with isolation {isolation} by {sharing[0].name}; a GPU has one"
              " isolation" for p in sharing if p.spec.slicing.isolation != isolation]
    if isolation == "MPS" and not _volta_or_newer(gpu):
        notes.append(f"{sharing[0].name}: GPU {gpu.index} ({gpu.product_name}, compute capability"
                     f" {gpu.compute_capability}) is older than Volta; MPS limits need compute capability 7.0+")
        return []
    return [p for p in sharing if p.spec.slicing.isolation == isolation]


def plan_node_pool(labels: Mapping[str, str], gpus: Sequence[Gpu], policies: Iterable[GpuSlicePolicy]) -> NodePlan:
    """The node's pool for these GPUs and policies.

    Per GPU, the most senior policy that selects it decides its mode and its isolation:
    memory-mode policies of one isolation share a GPU (its counters keep their sum within
    the GPU); a shared or MIG policy has it to itself. Policies being deleted publish
    nothing new. A GPU whose MIG mode the mode cannot use, and the agent cannot switch,
    publishes nothing for it (``planning.node.mig_mode``).
    """
    active = sorted((p for p in policies if not p.metadata.deletion_timestamp), key=seniority)
    counter_sets: list[CounterSet] = []
    devices: list[Device] = []
    notes: list[str] = []
    left_out: list[LeftOut] = []
    clashing = _ambiguous_tags(gpus, notes)
    for gpu in sorted(gpus, key=lambda g: g.index):
        takers = [p for p in active if selects(p, labels, gpu)]
        if not takers or gpu_tag(gpu.uuid) in clashing:
            continue
        mode = mode_of(takers[0])
        if mode.traits.instances and mig_manager_active(labels):
            notes.append(f"{takers[0].name}: GPU {gpu.index} is on a node where the GPU Operator's MIG manager is"
                         f" active ({MIG_MANAGER_LABEL}=true), which would undo this policy's MIG instances; set"
                         f" {MIG_MANAGER_LABEL}=false on the node")
            continue
        # An exclusive mode's GPU serves one policy; memory-mode policies share theirs.
        sharing = takers[:1] if mode.exclusive else [p for p in takers if p.spec.slicing.mode == mode.name]
        notes += [f"{p.name}: GPU {gpu.index} is taken by {takers[0].name} ({mode.name} mode)"
                  for p in takers if p not in sharing]
        conflict = mig_mode_conflict(mode.traits, gpu, mig_manager_active(labels))
        if conflict is not None:
            notes += [conflict_note(p.name, gpu, conflict) for p in sharing]
            left_out += [LeftOut(p.name, conflict, gpu.index, gpu.product_name) for p in sharing]
            continue
        sharing = _isolation_takers(gpu, sharing, notes)
        if not sharing:
            continue
        found = _isolated(_tainted(mode.devices(gpu, sharing, notes), sharing), sharing)
        if not found:
            continue
        guard = mode.counter_set(gpu)
        if guard is not None:
            counter_sets.append(guard)
        devices.extend(found)
    ordered = sorted(devices, key=lambda d: (d.memory, d.name))
    return NodePlan(tuple(ordered), tuple(counter_sets), tuple(notes), tuple(left_out))


def layout(counter_sets: Sequence[dict[str, Any]], devices: Sequence[Object]) -> tuple[PlannedSlice, ...]:
    """Counter sets and devices into slices within the API's limits, small devices first."""
    ordered = sorted(devices, key=lambda d: (device_memory(d) or 0, d["name"]))
    counters = sorted(counter_sets, key=lambda c: str(c["name"]))
    slices = [PlannedSlice(f"counters-{i:02d}", shared_counters=tuple(chunk))
              for i, chunk in enumerate(_chunks(counters, MAX_COUNTER_SETS))]
    slices += [PlannedSlice(f"devices-{i:02d}", devices=tuple(chunk))
               for i, chunk in enumerate(_chunks(ordered, MAX_DEVICES))]
    return tuple(slices)
