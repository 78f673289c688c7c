"""What the webhook keeps in memory, from its own watches: policies, ledgers, devices, claims.

It judges from these and writes only its ledgers. A cache may be behind the API server: a ledger
read from it is written back with its resourceVersion, so a stale one is refused (409) and read
again; a device it does not know is looked up (a quorum list of that pool); a charge is lowered
or released only after its claim is read again from the API server (planning.max_memory.reckon).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import pydantic
import structlog

from gpuslice.api.ledger import GpuSliceLedger, ledgers
from gpuslice.api.status import ClassInForce
from gpuslice.coordinates import CLAIMS, POLICIES, SLICES
from gpuslice.dra.names import CONTROLLER_NAMESPACE, DRIVER
from gpuslice.dra.policy_wire import tenants
from gpuslice.dra.quantity import quantity_bytes
from gpuslice.dra.slice_wire import slice_devices, slice_node
from gpuslice.dra.wire import MemoryPolicy, device_memory, device_policy, memory_policy, pool_mark
from gpuslice.kube.client import KubeClient
from gpuslice.kube.watch import watch
from gpuslice.planning.claim_review import Published
from gpuslice.planning.devices import published_kind
from gpuslice.planning.max_memory import claim_policies

log = structlog.get_logger(__name__)
LOOK_AGAIN = 2.0  # seconds before a pool read from the API server is read again
MAX_LOOKED = 4096  # pools remembered as read, at most (more are forgotten once their LOOK_AGAIN is over)
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class PolicyView:
    """What the webhook reads of a policy: each tenant's maxMemory as the spec says it now (a
    lowering applies at once), the maxMemory its admission record holds, and the classes in force."""

    name: str
    max_memory: Mapping[str, int]  # namespace -> bytes, spec.tenants[].maxMemory
    recorded: Mapping[str, str | None]  # namespace -> maxMemory in status.admittedTenants[].limits
    classes: Mapping[str, ClassInForce]  # status.classesInForce by class name

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PolicyView:
        status = body.get("status") or {}
        limits: dict[str, int] = {}
        for tenant in tenants(body):
            if tenant.max_memory is not None:
                try:
                    limits[tenant.namespace] = quantity_bytes(tenant.max_memory)
                except ValueError:
                    limits[tenant.namespace] = 0  # the CRD refuses this; if not, nothing fits
        recorded = {str(a.get("namespace")): (a.get("limits") or {}).get("maxMemory")
                    for a in status.get("admittedTenants") or []}
        classes: dict[str, ClassInForce] = {}
        for entry in status.get("classesInForce") or []:
            try:
                found = ClassInForce.model_validate(entry)
            except pydantic.ValidationError:
                continue
            classes[found.name] = found
        return cls(str(body["metadata"]["name"]), limits, recorded, classes)


class Mirror(Generic[K, V]):
    """One watched collection, as a dict kept by a LIST+WATCH: a relist drops what it no longer
    lists (a deletion missed while the watch was down)."""

    def __init__(self, key: Callable[[dict[str, Any]], K | None], value: Callable[[dict[str, Any]], V | None],
                 changed: Callable[[K, V | None], None] | None = None) -> None:
        self.items: dict[K, V] = {}
        self._key, self._value, self._changed = key, value, changed
        self._listed: set[K] = set()
        self.synced = asyncio.Event()

    def handle(self, kind: str | None, obj: dict[str, Any]) -> None:
        key = self._key(obj)
        if key is None:
            return
        value = None if kind == "DELETED" else self._value(obj)
        if kind is None:
            self._listed.add(key)
        if value is None:
            self.items.pop(key, None)
        else:
            self.items[key] = value
        if self._changed is not None:
            self._changed(key, value)

    def listed(self) -> None:
        for key in set(self.items) - self._listed:
            del self.items[key]
            if self._changed is not None:
                self._changed(key, None)
        self._listed.clear()
        self.synced.set()


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


@dataclass(frozen=True)
class DeviceSize:
    """What the webhook knows of a published device: its memory, for a shared one how the
    scheduler rounds what a request consumes of it, and the policy and kind it is of."""

    memory: int
    policy: MemoryPolicy | None = None
    owner: str | None = None  # the policy that publishes it
    kind: str = ""  # planning.devices.published_kind

    def published(self) -> Published:
        return Published(self.owner, self.kind, self.policy is not None)


def _slice_devices(obj: dict[str, Any]) -> dict[tuple[str, str], DeviceSize]:
    """The memory of each device of a slice, by (pool, device). Only a slice of its own node's pool
    counts: the agents publish only those, and a kubelet may publish a slice of its node under any
    pool name (NodeRestriction checks only spec.nodeName), which must not resize another node's
    devices here (nor are its own ever allocated: the tenancy rule takes a device only from the
    pool of the node the allocation is for)."""
    spec = obj.get("spec") or {}
    pool = pool_mark(spec)[0]
    if slice_node(spec) != pool:
        return {}
    return {(pool, str(device.get("name", ""))): DeviceSize(memory, memory_policy(device), device_policy(device),
                                                          published_kind(device))
            for device in slice_devices(spec) if (memory := device_memory(device)) is not None}


def _ledger(obj: dict[str, Any]) -> GpuSliceLedger | None:
    try:
        return GpuSliceLedger.from_body(obj)
    except pydantic.ValidationError:
        log.warning("a ledger does not parse; it is not judged by", ledger=_name(obj))
        return None


def _claim_key(obj: dict[str, Any]) -> tuple[str, str] | None:
    meta = obj.get("metadata") or {}
    if not claim_policies(obj.get("spec") or {}):
        return None  # not a claim of gpuslice's classes: never charged, never kept
    return str(meta.get("namespace", "")), str(meta.get("uid", ""))


@dataclass
class State:
    """The webhook's caches, and an event set whenever something a ledger depends on changed."""

    kube: KubeClient
    home: str = CONTROLLER_NAMESPACE  # gpuslice's own namespace (the `namespace` setting): the ledgers'
    clock: Callable[[], float] = time.monotonic
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    dirty: set[str] = field(default_factory=set)  # namespaces whose ledgers to look at again

    def __post_init__(self) -> None:
        self._by_namespace: dict[str, set[tuple[str, str]]] = {}
        self.policies: Mirror[str, PolicyView] = Mirror(_name, PolicyView.from_body, self._policy_changed)
        self.ledgers: Mirror[str, GpuSliceLedger] = Mirror(_name, _ledger, self._ledger_changed)
        self.slices: Mirror[str, dict[tuple[str, str], DeviceSize]] = Mirror(_name, _slice_devices,
                                                                             self._slice_changed)
        self._devices: dict[tuple[str, str], DeviceSize] = {}  # (pool, device), from every slice seen
        self._looked: dict[str, float] = {}  # pool -> when it was last read from the API server
        self._slice_keys: dict[str, set[tuple[str, str]]] = {}
        self.claims: Mirror[tuple[str, str], dict[str, Any]] = Mirror(_claim_key, lambda o: o, self._claim_changed)

    def _policy_changed(self, name: str, view: PolicyView | None) -> None:
        self.changed.set()

    def _ledger_changed(self, name: str, ledger: GpuSliceLedger | None) -> None:
        if ledger is not None:
            self.dirty.add(ledger.spec.namespace)
            self.changed.set()

    def _claim_changed(self, key: tuple[str, str], claim: dict[str, Any] | None) -> None:
        keys = self._by_namespace.setdefault(key[0], set())
        if claim is None:
            keys.discard(key)
        else:
            keys.add(key)
        self.dirty.add(key[0])
        self.changed.set()

    def _slice_changed(self, name: str, devices: dict[tuple[str, str], DeviceSize] | None) -> None:
        """Keep the flat index of device memory. A device's name fixes its size, so an entry another
        slice (an older generation of the pool) still names can stay."""
        for key in self._slice_keys.pop(name, set()) - set(devices or {}):
            if not any(key in keys for keys in self._slice_keys.values()):
                self._devices.pop(key, None)
        if devices:
            self._slice_keys[name] = set(devices)
            self._devices.update(devices)

    def device_memory(self, pool: str, device: str) -> int | None:
        found = self._devices.get((pool, device))
        return found.memory if found is not None else None

    def device(self, pool: str, device: str) -> DeviceSize | None:
        return self._devices.get((pool, device))

    async def learn_pool(self, pool: str) -> None:
        """Read ``pool``'s slices from the API server (a device the watch has not brought yet), at
        most once every ``LOOK_AGAIN`` seconds: a review naming pools that do not exist (anyone's to
        send, without client authentication) costs no LIST each."""
        now = self.clock()
        if (last := self._looked.get(pool)) is not None and now - last < LOOK_AGAIN:
            return
        self._looked[pool] = now
        if len(self._looked) > MAX_LOOKED:
            self._looked = {p: t for p, t in self._looked.items() if now - t < LOOK_AGAIN}
        for item in await self.kube.list(SLICES, fieldSelector=f"spec.driver={DRIVER},spec.pool.name={pool}"):
            self.slices.handle("MODIFIED", item)

    def namespace_claims(self, namespace: str) -> list[dict[str, Any]]:
        return [c for key in self._by_namespace.get(namespace, ()) if (c := self.claims.items.get(key)) is not None]

    def keep_ledger(self, ledger: GpuSliceLedger) -> None:
        """A ledger this process just wrote: newer than the watch may have brought yet."""
        held = self.ledgers.items.get(ledger.name)
        if held is None or int(held.resource_version or 0) < int(ledger.resource_version or 0):
            self.ledgers.items[ledger.name] = ledger

    async def run(self, stop: asyncio.Event) -> None:
        def failed(what: str) -> Callable[[BaseException], None]:
            return lambda error: log.warning("watch failed; listing again", what=what, error=str(error))

        await asyncio.gather(
            watch(self.kube, POLICIES, self.policies.handle, stop, on_listed=self.policies.listed,
                  on_error=failed("policies")),
            watch(self.kube, ledgers(self.home), self.ledgers.handle, stop, on_listed=self.ledgers.listed,
                  on_error=failed("ledgers")),
            watch(self.kube, SLICES, self.slices.handle, stop, query={"fieldSelector": f"spec.driver={DRIVER}"},
                  on_listed=self.slices.listed, on_error=failed("slices")),
            watch(self.kube, CLAIMS, self.claims.handle, stop, on_listed=self.claims.listed,
                  on_error=failed("claims")),
        )

    @property
    def synced(self) -> bool:
        return all(m.synced.is_set() for m in (self.policies, self.ledgers, self.slices, self.claims))
