"""Which devices belong to which policy, and who holds them: the numbers in status.

Pure: the controller feeds it what its watches saw of ResourceSlices and
ResourceClaims.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from gpuslice.dra.names import MIG_FAILED_TAINT_KEY, PENDING_TAINT_KEY, UNHEALTHY_TAINT_KEY
from gpuslice.dra.slice_wire import slice_devices
from gpuslice.dra.wire import (
    admin_access,
    attribute,
    consumed_memory,
    device_gpu,
    device_memory,
    device_policy,
    newest_of,
    pool_mark,
    status_results,
    taint_keys,
    text_attribute,
)
from gpuslice.inventory.pci import PCIE_ROOT_ATTRIBUTE
from gpuslice.inventory.topology import NUMA_NODE_ATTRIBUTE, NVLINK_DOMAIN_ATTRIBUTE, alignment_name
from gpuslice.planning.cluster.cluster_objects import DeviceRef
from gpuslice.planning.devices import published_kind
from gpuslice.planning.left_out import LeftOut
from gpuslice.planning.left_out import decode as decode_left_out
from gpuslice.planning.reads.topology import Place, achieved

__all__ = ["PENDING_TAINT_KEY", "ClaimResult", "ClaimView", "DeviceInfo", "SliceView", "Usage", "device_info",
           "devices_by_policy", "failed_devices", "foreign_claims", "pending_devices", "unhealthy_devices", "usage"]


@dataclass(frozen=True)
class DeviceInfo:
    """What a published device is, for counting: its kind, the memory it stands for, and where its
    GPU sits (for counting allocations by the alignment they achieve)."""

    kind: str
    memory: int
    place: Place | None = None


@dataclass(frozen=True)
class SliceView:
    """What the controller keeps of one of our ResourceSlices."""

    pool: str
    generation: int
    devices: tuple[tuple[str, str], ...]  # (device name, policy attribute)
    pending: frozenset[str] = frozenset()  # devices the agent holds back (allocated, change waiting)
    slice_count: int = 1  # the pool's resourceSliceCount at this generation
    info: tuple[tuple[str, DeviceInfo], ...] = ()  # (device name, what it is)
    failed: frozenset[str] = frozenset()  # devices of a GPU whose MIG reconfiguration failed (rolled back)
    unhealthy: frozenset[str] = frozenset()  # devices of a GPU the agent found unhealthy
    left_out: tuple[LeftOut, ...] = ()  # GPUs the agent's plan left out, and why (planning.left_out)

    @classmethod
    def from_slice(cls, spec: Mapping[str, Any], annotations: Mapping[str, str] | None = None) -> SliceView:
        devices: list[tuple[str, str]] = []
        info: list[tuple[str, DeviceInfo]] = []
        pending: set[str] = set()
        failed: set[str] = set()
        unhealthy: set[str] = set()
        places: dict[str, Place] = {}  # one per GPU, shared by its devices
        for device in slice_devices(spec):
            keys = taint_keys(device)
            for key, found in ((PENDING_TAINT_KEY, pending), (MIG_FAILED_TAINT_KEY, failed),
                               (UNHEALTHY_TAINT_KEY, unhealthy)):
                if key in keys:
                    found.add(str(device["name"]))
            devices.append((device["name"], device_policy(device) or ""))
            info.append((str(device["name"]), DeviceInfo(published_kind(device), device_memory(device) or 0,
                                                         _place(device, places))))
        pool, generation, count = pool_mark(spec)
        return cls(pool, generation, tuple(devices), frozenset(pending), count, tuple(info), frozenset(failed),
                   frozenset(unhealthy), decode_left_out(annotations))

    @property
    def policies(self) -> frozenset[str]:
        """The policies this slice says something about: those of its devices, those left out."""
        return frozenset({p for _, p in self.devices if p} | {item.policy for item in self.left_out})


def _place(device: Mapping[str, Any], seen: dict[str, Place]) -> Place | None:
    """Where the device's GPU sits, as its attributes say (interned: a thousand nodes' devices repeat them)."""
    gpu = device_gpu(device)
    if gpu is None:
        return None
    numa = attribute(device, NUMA_NODE_ATTRIBUTE, "")
    pcie, nvlink = text_attribute(device, PCIE_ROOT_ATTRIBUTE, ""), text_attribute(device, NVLINK_DOMAIN_ATTRIBUTE, "")
    found = seen.get(gpu)
    if found is None or (nvlink and not found.nvlink):  # a MIG device carries no NVLink domain: another may
        found = Place(sys.intern(gpu), numa if isinstance(numa, int) and not isinstance(numa, bool) else None,
                      sys.intern(pcie) if pcie else None, sys.intern(nvlink) if nvlink else None)
        seen[gpu] = found
    return found


def slice_policies(spec: Mapping[str, Any], annotations: Mapping[str, str] | None = None) -> frozenset[str]:
    """The policies whose devices one of our ResourceSlices publishes, or says are left out (read
    without building a SliceView: the controller indexes every slice by them)."""
    found = {item.policy for item in decode_left_out(annotations)}
    found |= {policy for device in slice_devices(spec) if (policy := device_policy(device))}
    return frozenset(found)


@dataclass(frozen=True)
class ClaimResult:
    """One of our devices in a claim's allocation."""

    device: DeviceRef
    admin: bool = False  # allocated with adminAccess: the scheduler does not count it as taken
    consumed: int | None = None  # shared devices: the memory this allocation consumed


@dataclass(frozen=True)
class ClaimView:
    """What the controller keeps of one allocated ResourceClaim: our devices in it."""

    namespace: str
    name: str
    results: tuple[ClaimResult, ...]

    @property
    def devices(self) -> tuple[DeviceRef, ...]:
        return tuple(r.device for r in self.results)

    @property
    def taken(self) -> tuple[DeviceRef, ...]:
        """The devices it takes: not those it has with adminAccess, which takes no device from anyone."""
        return tuple(r.device for r in self.results if not r.admin)

    @classmethod
    def from_claim(cls, namespace: str, name: str, status: Mapping[str, Any]) -> ClaimView | None:
        ours = [ClaimResult(DeviceRef(r["pool"], r["device"]), admin_access(r), consumed_memory(r))
                for r in status_results(status)]
        return cls(namespace, name, tuple(ours)) if ours else None


def pending_devices(slices: Iterable[SliceView]) -> set[DeviceRef]:
    return {DeviceRef(view.pool, name) for view in slices for name in view.pending}


def failed_devices(slices: Iterable[SliceView]) -> set[DeviceRef]:
    """Devices of GPUs whose MIG reconfiguration failed and was rolled back (``gpuslice.dev/mig-failed``)."""
    return {DeviceRef(view.pool, name) for view in slices for name in view.failed}


def unhealthy_devices(slices: Iterable[SliceView]) -> set[DeviceRef]:
    return {DeviceRef(view.pool, name) for view in slices for name in view.unhealthy}


def _complete_pools(slices: list[SliceView]) -> tuple[dict[str, int], set[str]]:
    """Each pool's newest generation, and the pools whose newest generation has all its slices."""
    found = newest_of((v.pool, v.generation, v.slice_count) for v in slices)
    return {pool: generation for pool, (generation, _) in found.items()}, {p for p, (_, ok) in found.items() if ok}


def _by_policy(views: Iterable[SliceView]) -> dict[str, set[DeviceRef]]:
    grouped: dict[str, set[DeviceRef]] = defaultdict(set)
    for view in views:
        for device, policy in view.devices:
            if policy:
                grouped[policy].add(DeviceRef(view.pool, device))
    return grouped


def devices_by_policy(slices: Iterable[SliceView]) -> dict[str, set[DeviceRef]]:
    """Devices the scheduler can see, grouped by the policy that made them: those of the
    newest generation of each pool, and only of complete pools (all its slices present),
    as the scheduler ignores the others."""
    slices = list(slices)
    newest, complete = _complete_pools(slices)
    return _by_policy(v for v in slices if v.pool in complete and v.generation == newest[v.pool])


def published_by_policy(slices: Iterable[SliceView]) -> dict[str, set[DeviceRef]]:
    """Every device any slice still publishes (every generation, complete pool or not), by policy.
    Not for counting: for knowing whether a policy's devices are all gone."""
    return _by_policy(slices)


def device_info(slices: Iterable[SliceView]) -> dict[DeviceRef, DeviceInfo]:
    """Kind and memory of every device of complete pools' newest generations (as counted)."""
    slices = list(slices)
    newest, complete = _complete_pools(slices)
    return {DeviceRef(v.pool, name): info for v in slices if v.pool in complete and v.generation == newest[v.pool]
            for name, info in v.info}


@dataclass
class Usage:
    allocated: int = 0
    by_namespace: dict[str, int] = field(default_factory=dict)
    holding_claims: list[str] = field(default_factory=list)
    bytes_by_namespace: dict[str, int] = field(default_factory=dict)
    kinds_by_namespace: dict[str, dict[str, int]] = field(default_factory=dict)
    # Claims holding devices of two or more GPUs, by (GPUs, what the GPUs share: planning.reads.topology)
    alignments: dict[tuple[int, str], int] = field(default_factory=dict)


def usage(devices: set[DeviceRef], claims: Iterable[ClaimView],
          info: Mapping[DeviceRef, DeviceInfo] | None = None) -> Usage:
    """How many of ``devices`` are allocated, per namespace (in devices, bytes and kinds), and by
    which claims. Admin-access results take no device (the scheduler does not count them as taken)
    and hold nothing back: a claim that has the devices only with admin access is not listed, and
    deletion does not wait for it."""
    info = info or {}
    result = Usage()
    for claim in claims:
        held = [r for r in claim.results if r.device in devices and not r.admin]
        if not held:
            continue
        result.holding_claims.append(f"{claim.namespace}/{claim.name}")
        places = [p for r in held if (p := getattr(info.get(r.device), "place", None)) is not None]
        gpus = len({p.gpu for p in places})
        if gpus >= 2:
            key = (gpus, alignment_name(achieved(places)))
            result.alignments[key] = result.alignments.get(key, 0) + 1
        for r in held:
            what = info.get(r.device)
            result.allocated += 1
            result.by_namespace[claim.namespace] = result.by_namespace.get(claim.namespace, 0) + 1
            memory = r.consumed if r.consumed is not None else (what.memory if what else 0)
            result.bytes_by_namespace[claim.namespace] = result.bytes_by_namespace.get(claim.namespace, 0) + memory
            kinds = result.kinds_by_namespace.setdefault(claim.namespace, {})
            if what is not None:
                kinds[what.kind] = kinds.get(what.kind, 0) + 1
    result.holding_claims.sort()
    return result


def foreign_claims(devices: set[DeviceRef], claims: Iterable[ClaimView], tenants: Set[str],
                   admins: Set[str]) -> list[str]:
    """Claims holding ``devices`` from outside the policy's tenants: allocated before their namespace
    left spec.tenants (admission refuses any new such allocation). Admin namespaces may hold them
    with adminAccess only."""
    found = []
    for claim in claims:
        held = [r for r in claim.results if r.device in devices]
        if held and claim.namespace not in tenants and not (claim.namespace in admins and all(r.admin for r in held)):
            found.append(f"{claim.namespace}/{claim.name}")
    return sorted(found)
