"""What the API server holds about gpuslice's devices, read into typed form (pure).

Everything a platform engineer looks at (``gpuslice status``, ``why``, ``plan --cluster``)
starts here: the ResourceSlices the agents published, the taints on their devices
(their own, and those DeviceTaintRules add), and the claims that hold them. Only the
newest generation of each pool counts, as for the scheduler; a pool whose newest
generation is not complete yet is read anyway and marked, so a map drawn while an
agent rewrites its pool shows that rather than an empty node.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpuslice.dra.names import DRAIN_OBJECT_PREFIX, DRIVER, PENDING_TAINT_KEY, SAFETY_TAINT_KEYS
from gpuslice.dra.quantity import quantity_bytes
from gpuslice.dra.slice_wire import slice_counter_sets, slice_devices, slice_node, slice_pool
from gpuslice.dra.wire import (
    admin_access,
    consumed_quantity,
    device_statuses,
    newest_generations,
    reserved_for,
    share_id,
    status_results,
)
from gpuslice.inventory.nodes import catalog_model
from gpuslice.jsontypes import Body
from gpuslice.planning.devices import Device
from gpuslice.planning.overuse import CONDITION

DeviceState = Literal["allocated", "held", "draining", "tainted", "free"]
# The agent's taints that say what state a GPU is in, by the word a human reads.
STATUS_TAINTS = {key: key.split("/", 1)[1] for key in SAFETY_TAINT_KEYS if key != PENDING_TAINT_KEY}
BLOCKING = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True)
class DeviceTaint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    @property
    def pending(self) -> bool:
        """The agent's own hold: an allocated device keeps its shape, or a free one drains."""
        return self.key == PENDING_TAINT_KEY

    @property
    def blocks(self) -> bool:
        """Keeps new claims off the device (``None`` only informs)."""
        return self.effect in BLOCKING

    @property
    def reason(self) -> str:
        """``unhealthy``, ``reconfiguring``, ``mig-failed``, or a policy taint's name such as
        ``maintenance``; with the value when there is one (``unhealthy: XID-79``)."""
        word = STATUS_TAINTS.get(self.key, self.key.rsplit("/", 1)[-1])
        return f"{word}: {self.value}" if self.value else word

    @classmethod
    def from_body(cls, body: Body) -> DeviceTaint:
        return cls(str(body.get("key", "")), str(body.get("value") or ""), str(body.get("effect") or "NoSchedule"))


@dataclass(frozen=True)
class Holder:
    """A claim that holds (part of) a device: where it is, and the pods it is reserved for."""

    namespace: str
    claim: str
    pods: tuple[str, ...] = ()
    memory: int | None = None  # shared devices: what this allocation consumed
    admin: bool = False  # adminAccess: sees the device, takes none of it
    # The node agent's GpuMemoryOveruse condition on this device of the claim, while True: what it says.
    overuse: str | None = None

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.claim}"

    @property
    def who(self) -> str:
        """``team-a/pod-0`` (the pod, when the claim is reserved for one), else the claim."""
        return f"{self.namespace}/{self.pods[0]}" if len(self.pods) == 1 else self.ref


@dataclass(frozen=True)
class PublishedDevice:
    """One device of a pool's newest generation, with its taints and holders."""

    node: str
    device: Device
    raw: Mapping[str, Any]
    taints: tuple[DeviceTaint, ...] = ()
    holders: tuple[Holder, ...] = ()
    draining_listed: bool = False  # named by the agent's drain record

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def users(self) -> tuple[Holder, ...]:
        """Holders that take the device (not adminAccess)."""
        return tuple(h for h in self.holders if not h.admin)

    @property
    def allocated(self) -> bool:
        return bool(self.users)

    @property
    def status_taints(self) -> tuple[DeviceTaint, ...]:
        """Taints that keep new claims off, other than the agent's hold."""
        return tuple(t for t in self.taints if t.blocks and not t.pending)

    @property
    def state(self) -> DeviceState:
        """``tainted`` (a status or policy taint), ``held`` (allocated, a change waits), ``draining``
        (free, about to change or go), ``allocated`` or ``free``."""
        if self.status_taints:
            return "tainted"
        if any(t.pending for t in self.taints) or self.draining_listed:
            return "held" if self.allocated else "draining"
        return "allocated" if self.allocated else "free"

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(t.reason for t in self.status_taints)

    @property
    def step(self) -> int:
        """A shared device's capacity step (its policy's sliceSize); 0 for other devices."""
        return _quantity(self.device.slice_size) if self.device.traits.consumable and self.device.slice_size else 0


@dataclass(frozen=True)
class Pool:
    node: str
    generation: int
    complete: bool
    devices: tuple[PublishedDevice, ...]
    counter_sets: Mapping[str, Mapping[str, int]]  # counter set -> counter -> value (bytes for memory)
    raw_counter_sets: tuple[Mapping[str, Any], ...] = ()  # as published


def _quantity(value: Any) -> int:
    try:
        return quantity_bytes(str(value))
    except ValueError:
        return 0




def overuse_of(status: Body) -> dict[tuple[str, str, str], str]:
    """(pool, device, share id) -> the message of the agent's overuse condition, where it is True."""
    found = {}
    for entry in device_statuses(status):
        for condition in entry["conditions"]:
            if condition.get("type") == CONDITION and condition.get("status") == "True":
                found[(entry["pool"], entry["device"], share_id(entry))] = str(condition.get("message", ""))
    return found


def holders_by_device(claims: Iterable[Body]) -> dict[tuple[str, str], list[Holder]]:
    """(pool, device) -> the claims that hold it."""
    found: dict[tuple[str, str], list[Holder]] = defaultdict(list)
    for claim in claims:
        meta, status = claim.get("metadata") or {}, claim.get("status") or {}
        overused = overuse_of(status)
        pods = tuple(sorted(r["name"] for r in reserved_for(status) if r["resource"] == "pods" and r["name"]))
        for result in status_results(status):
            consumed = consumed_quantity(result)
            key = (result["pool"], result["device"])
            found[key].append(Holder(
                str(meta.get("namespace", "")), str(meta.get("name", "")), pods,
                _quantity(consumed) if consumed is not None else None, admin_access(result),
                overused.get((*key, share_id(result)))))
    return found


def rule_taints(rules: Iterable[Body]) -> list[tuple[Mapping[str, Any], DeviceTaint]]:
    """DeviceTaintRules as (selector, taint); a selector field that is absent matches anything."""
    found = []
    for rule in rules:
        spec = rule.get("spec") or {}
        selector = spec.get("deviceSelector") or {}
        if selector.get("driver") not in (None, DRIVER):
            continue
        found.append((selector, DeviceTaint.from_body(spec.get("taint") or {})))
    return found


def _matches(selector: Mapping[str, Any], pool: str, device: str) -> bool:
    return selector.get("pool") in (None, pool) and selector.get("device") in (None, device)


def drain_lists(objects: Iterable[Body]) -> dict[str, list[str]]:
    """The devices each node's agent drains, from the drain objects (ConfigMaps
    ``gpuslice-draining-<node>``): each counts only for the node it is named after, as the drain
    rule reads it, so one agent's object says nothing of another node."""
    listed: dict[str, list[str]] = {}
    for body in objects:
        name = str(body["metadata"]["name"])
        if name.startswith(DRAIN_OBJECT_PREFIX):
            node = name.removeprefix(DRAIN_OBJECT_PREFIX)
            listed[node] = str((body.get("data") or {}).get(node) or "").split()
    return listed


def own_pool(spec: Mapping[str, Any]) -> bool:
    """A slice of gpuslice's driver in its own node's pool, as the agents publish them. A kubelet may
    publish a slice of its node under any pool name (NodeRestriction checks only spec.nodeName): one
    named after another node is no device of that node (the tenancy rule allocates none of it), so
    it holds no policy's deletion, changes no device's policy, and counts in no reading of a pool."""
    return spec.get("driver") == DRIVER and slice_node(spec) == slice_pool(spec)


def read_pools(slices: Iterable[Body], claims: Iterable[Body] = (), rules: Iterable[Body] = (),
               draining: Mapping[str, Iterable[str]] | None = None) -> list[Pool]:
    """Each node's pool from our ResourceSlices, newest generation: other drivers' slices are
    ignored, and so are slices a node published under another node's pool name (``own_pool``)."""
    generations = newest_generations(s["spec"] for s in slices if own_pool(s.get("spec") or {}))
    holders = holders_by_device(claims)
    taint_rules = rule_taints(rules)
    listed = {node: set(names) for node, names in (draining or {}).items()}
    pools = []
    for name in sorted(generations):
        newest = generations[name]
        current = newest.slices
        raw_sets = tuple(c for s in current for c in slice_counter_sets(s))
        counter_sets = {str(c.get("name")): {k: _quantity((v or {}).get("value", "0"))
                                             for k, v in (c.get("counters") or {}).items()} for c in raw_sets}
        devices = []
        for spec in current:
            node = slice_node(spec) or name
            for raw in slice_devices(spec):
                device = Device.from_manifest(raw)
                if device is None:
                    continue
                taints = [DeviceTaint.from_body(t) for t in raw.get("taints") or []]
                taints += [t for sel, t in taint_rules if _matches(sel, name, device.name) and t not in taints]
                devices.append(PublishedDevice(
                    node, device, raw, tuple(taints), tuple(holders.get((name, device.name), ())),
                    device.name in listed.get(name, set())))
        pools.append(Pool(name, newest.generation, newest.complete,
                          tuple(sorted(devices, key=lambda d: (d.device.gpu_index, d.device.memory, d.name))),
                          counter_sets, raw_sets))
    return pools


def gpu_memory(devices: Iterable[PublishedDevice], counter_sets: Mapping[str, Mapping[str, int]]) -> int:
    """The GPU's memory: its memory counter set, else a whole-GPU device, else the catalog by
    product name, else the largest device (MIG-only GPUs of a product the catalog lacks)."""
    devices = list(devices)
    for d in devices:
        if d.device.counter_set and (memory := counter_sets.get(d.device.counter_set, {}).get("memory")):
            return memory
    whole = [d.device.memory for d in devices if d.device.whole_gpu]
    if whole:
        return max(whole)
    product = devices[0].device.product_name if devices else ""
    model = catalog_model(product)
    if model is not None:
        return model.memory
    return max((d.device.memory for d in devices), default=0)
