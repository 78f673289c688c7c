"""What an edit of a live policy would do to the published devices, before it is applied (pure).

The agent's own planner (``node_pool``) and safety layer (``pool_safety``) run on each
node's live pool and claims, with the edited policy in place of the live one. The
answer is the agent's: devices added at once; free devices that drain and then change
or go; allocated devices held as they are until their claims are released; GPUs whose
new layout waits until nothing on them is held (a change of mode).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuslice.api.resource import GpuSlicePolicy, ParseProblem, parse_policy
from gpuslice.dra.names import PENDING_TAINT_KEY
from gpuslice.dra.wire import device_policy
from gpuslice.inventory.gpus import Gpu
from gpuslice.inventory.nodes import catalog_model
from gpuslice.jsontypes import Body
from gpuslice.planning.devices import without_instance_uuid
from gpuslice.planning.node.node_pool import plan_node_pool
from gpuslice.planning.node.pool_safety import make_safe, normalized
from gpuslice.planning.reads.published import Holder, Pool, PublishedDevice, gpu_memory
from gpuslice.planning.reads.totals import inventory
from gpuslice.planning.selection import Problem, select
from gpuslice.planning.validation import validate


@dataclass(frozen=True)
class HeldDevice:
    name: str
    removed: bool  # the edit removes it; else it changes
    holders: tuple[Holder, ...]


@dataclass(frozen=True)
class NodeChange:
    node: str
    added: tuple[str, ...] = ()  # published at once
    waiting: tuple[str, ...] = ()  # new devices of GPUs that wait for held devices of another mode
    drain_change: tuple[str, ...] = ()  # free: drain, then change
    drain_remove: tuple[str, ...] = ()  # free: drain, then go
    held: tuple[HeldDevice, ...] = ()  # allocated: kept as they are until released
    unchanged: int = 0
    blocked_gpus: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    unknown_gpus: int = 0  # GPUs the node's labels count that the API shows nothing of

    @property
    def changes(self) -> bool:
        return bool(self.added or self.waiting or self.drain_change or self.drain_remove or self.held)


@dataclass(frozen=True)
class PolicyCount:
    policy: str
    before: int
    after: int


@dataclass(frozen=True)
class ChangePlan:
    policy: str
    new: bool  # no live policy of that name
    problems: tuple[Problem, ...]
    nodes: tuple[NodeChange, ...]
    counts: tuple[PolicyCount, ...] = field(default_factory=tuple)


def gpus_from_devices(devices: Sequence[PublishedDevice], pool: Pool) -> list[Gpu]:
    """The GPUs a pool's devices stand on, as the planner wants them (the catalog gives MIG profiles)."""
    by_uuid: dict[str, list[PublishedDevice]] = {}
    for device in devices:
        by_uuid.setdefault(device.device.gpu_uuid, []).append(device)
    found = []
    for uuid, mine in by_uuid.items():
        first = mine[0].device
        facts = first.facts  # what the agent published of the GPU (planning.attributes)
        model = catalog_model(first.product_name)
        found.append(Gpu(
            index=first.gpu_index, uuid=uuid, product_name=first.product_name,
            memory=gpu_memory(mine, pool.counter_sets), pci_bus_id=first.pci_bus_id,
            architecture=facts.architecture or (model.architecture if model else ""),
            compute_capability=facts.compute_capability or (model.compute_capability if model else ""),
            driver_version=facts.driver_version,
            minor=facts.minor if facts.minor is not None else first.gpu_index,
            # MIG mode as the GPU's published devices show it (planning.node.mig_mode: MIG devices only in it).
            mig_capable=bool(model and model.mig_capable), mig_enabled=any(d.device.traits.instances for d in mine),
            mig_profiles=model.mig_profiles if model else (), brand=facts.brand or "Unknown",
            cuda_driver_version=facts.cuda_driver_version, pcie_root=facts.pcie_root, numa_node=facts.numa_node,
            # A MIG device does not carry the NVLink domain (planning.attributes): any device that does says it.
            nvlink_domain=next((d.device.facts.nvlink_domain for d in mine if d.device.facts.nvlink_domain), None)))
    return sorted(found, key=lambda g: g.index)


def _valid_now(policy: GpuSlicePolicy) -> bool:
    """As the agent plans: the controller found this generation valid."""
    valid = next((c for c in policy.status.conditions if c.type == "Valid"), None)
    return (policy.status.observed_generation == policy.metadata.generation and valid is not None
            and valid.status == "True")


def _clean(device: Mapping[str, Any]) -> Any:
    taints = [t for t in device.get("taints") or [] if t.get("key") != PENDING_TAINT_KEY]
    body = {k: v for k, v in device.items() if k != "taints"}
    return normalized({**body, "taints": taints} if taints else body)


def plan_change(edited: GpuSlicePolicy, policies: Iterable[Body], pools: Sequence[Pool], nodes: Iterable[Body],
                gpus: Mapping[str, Sequence[Gpu]]) -> ChangePlan:
    """``gpus``: each node's GPUs (from its published devices, or its fake-GPU labels)."""
    nodes = list(nodes)
    known = inventory(nodes)
    live: list[GpuSlicePolicy] = []
    frozen: set[str] = set()
    new = True
    for body in policies:
        name = str(body["metadata"]["name"])
        if name == edited.name:
            new = False
            continue
        parsed = parse_policy(body)
        if isinstance(parsed, ParseProblem) or not _valid_now(parsed):
            frozen.add(name)
        elif not parsed.metadata.deletion_timestamp:
            live.append(parsed)
    others = [(p, select(p, known)) for p in live]
    problems = validate(edited, select(edited, known), others)
    plannable = [*live, edited]
    labels = {str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {}) for n in nodes}
    pools_by_node = {p.node: p for p in pools}
    changes = []
    before: Counter[str] = Counter()
    after: Counter[str] = Counter()
    for node in sorted(set(labels) | set(pools_by_node)):
        pool = pools_by_node.get(node, Pool(node, 0, True, (), {}))
        node_gpus = list(gpus.get(node) or gpus_from_devices(pool.devices, pool))
        plan = plan_node_pool({"kubernetes.io/hostname": node, **labels.get(node, {})}, node_gpus, plannable)
        # As the plan can know them: a static MIG instance's UUID is the agent's to add.
        published = [without_instance_uuid(d.raw) for d in pool.devices]
        allocated = {d.name for d in pool.devices if d.holders}
        frozen_devices = {d.name for d in pool.devices if d.device.policy in frozen}
        safe = make_safe(plan, published, pool.raw_counter_sets, allocated, drained=set(), frozen=frozen_devices)
        planned = {d["name"]: d for d in plan.devices if d["name"] not in frozen_devices}
        first = {d["name"] for s in safe.slices for d in s.devices}
        by_name = {d.name: d for d in pool.devices}
        held, drain_change, drain_remove, unchanged = [], [], [], 0
        for device in pool.devices:
            if device.name in frozen_devices:
                unchanged += 1
                continue
            wanted = planned.get(device.name)
            if wanted is not None and _clean(wanted) == _clean(without_instance_uuid(device.raw)):
                unchanged += 1
            elif device.name in allocated:
                held.append(HeldDevice(device.name, wanted is None, device.holders))
            elif wanted is None:
                drain_remove.append(device.name)
            else:
                drain_change.append(device.name)
        added = sorted(n for n in planned if n not in by_name and n in first)
        waiting = sorted(n for n in planned if n not in by_name and n not in first)
        for device in pool.devices:
            before[device.device.policy] += 1
        for name in planned:
            after[str(device_policy(planned[name]))] += 1
        for name in frozen_devices:
            after[by_name[name].device.policy] += 1
        counted = len({d.device.gpu_uuid for d in pool.devices})
        missing = max(0, (known_count(known, node) or counted) - len(node_gpus))
        changes.append(NodeChange(node, tuple(added), tuple(waiting), tuple(sorted(drain_change)),
                                  tuple(sorted(drain_remove)), tuple(sorted(held, key=lambda h: h.name)), unchanged,
                                  safe.blocked_gpus, plan.notes, missing))
    counts = tuple(PolicyCount(p, before[p], after[p]) for p in sorted(set(before) | set(after)))
    return ChangePlan(edited.name, new, tuple(problems), tuple(c for c in changes if c.changes or c.notes
                                                                 or c.unknown_gpus), counts)


def known_count(known: Sequence[tuple[dict[str, str], Any]], node: str) -> int | None:
    return next((g.count for _, g in known if g.node == node), None)
