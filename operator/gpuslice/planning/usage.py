"""Which devices belong to which policy, and who holds them: the numbers in status.

Pure: the controller feeds it what its watches saw of ResourceSlices and
ResourceClaims.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuslice.dra.names import ATTR_POLICY, ATTRIBUTE_DOMAIN, DRIVER
from gpuslice.planning.cluster_objects import DeviceRef
from gpuslice.planning.health import UNHEALTHY_TAINT_KEY
from gpuslice.planning.taints import MIG_FAILED_TAINT_KEY, PENDING_TAINT_KEY

__all__ = ["PENDING_TAINT_KEY"]


@dataclass(frozen=True)
class SliceView:
    """What the controller keeps of one of our ResourceSlices."""

    pool: str
    generation: int
    devices: tuple[tuple[str, str], ...]  # (device name, policy attribute)
    pending: frozenset[str] = frozenset()  # devices the agent holds back (allocated, change waiting)
    slice_count: int = 1  # the pool's resourceSliceCount at this generation
    failed: frozenset[str] = frozenset()  # devices of a GPU whose MIG reconfiguration failed (rolled back)
    unhealthy: frozenset[str] = frozenset()  # devices of a GPU the agent found unhealthy

    @classmethod
    def from_slice(cls, spec: Mapping[str, Any]) -> SliceView:
        devices: list[tuple[str, str]] = []
        pending: set[str] = set()
        failed: set[str] = set()
        unhealthy: set[str] = set()
        for device in spec.get("devices") or []:
            keys = {t.get("key") for t in device.get("taints") or []}
            for key, found in ((PENDING_TAINT_KEY, pending), (MIG_FAILED_TAINT_KEY, failed),
                               (UNHEALTHY_TAINT_KEY, unhealthy)):
                if key in keys:
                    found.add(str(device["name"]))
            # Fully qualified: a bare name would belong to the driver's domain, not ours.
            attribute = (device.get("attributes") or {}).get(f"{ATTRIBUTE_DOMAIN}/{ATTR_POLICY}") or {}
            devices.append((device["name"], str(attribute.get("string", ""))))
        pool = spec.get("pool") or {}
        return cls(str(pool.get("name", "")), int(pool.get("generation", 0)), tuple(devices), frozenset(pending),
                   int(pool.get("resourceSliceCount", 1)), frozenset(failed), frozenset(unhealthy))


@dataclass(frozen=True)
class ClaimView:
    """What the controller keeps of one allocated ResourceClaim: our devices in it."""

    namespace: str
    name: str
    devices: tuple[DeviceRef, ...]

    @classmethod
    def from_claim(cls, namespace: str, name: str, status: Mapping[str, Any]) -> ClaimView | None:
        results = (((status.get("allocation") or {}).get("devices") or {}).get("results")) or []
        ours = tuple(DeviceRef(r["pool"], r["device"]) for r in results if r.get("driver") == DRIVER)
        return cls(namespace, name, ours) if ours else None


def pending_devices(slices: Iterable[SliceView]) -> set[DeviceRef]:
    return {DeviceRef(view.pool, name) for view in slices for name in view.pending}


def failed_devices(slices: Iterable[SliceView]) -> set[DeviceRef]:
    """Devices of GPUs whose MIG reconfiguration failed and was rolled back (``gpuslice.dev/mig-failed``)."""
    return {DeviceRef(view.pool, name) for view in slices for name in view.failed}


def unhealthy_devices(slices: Iterable[SliceView]) -> set[DeviceRef]:
    return {DeviceRef(view.pool, name) for view in slices for name in view.unhealthy}


def _complete_pools(slices: list[SliceView]) -> tuple[dict[str, int], set[str]]:
    """Each pool's newest generation, and the pools whose newest generation has all its slices."""
    newest: dict[str, int] = {}
    for view in slices:
        newest[view.pool] = max(newest.get(view.pool, view.generation), view.generation)
    present: dict[str, int] = defaultdict(int)
    expected: dict[str, int] = {}
    for view in slices:
        if view.generation == newest[view.pool]:
            present[view.pool] += 1
            expected[view.pool] = view.slice_count
    return newest, {pool for pool, count in present.items() if count >= expected[pool]}


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


def devices_in_flux(slices: Iterable[SliceView]) -> dict[str, set[DeviceRef]]:
    """Devices of pools an agent is rewriting (the newest generation is not complete yet), of
    every generation present, by policy. Not for counting: for not dropping a taint rule of a
    device that is only between two generations."""
    slices = list(slices)
    _, complete = _complete_pools(slices)
    return _by_policy(v for v in slices if v.pool not in complete)


@dataclass
class Usage:
    allocated: int = 0
    by_namespace: dict[str, int] = field(default_factory=dict)
    holding_claims: list[str] = field(default_factory=list)


def usage(devices: set[DeviceRef], claims: Iterable[ClaimView]) -> Usage:
    """How many of ``devices`` are allocated, per namespace, and by which claims."""
    result = Usage()
    for claim in claims:
        held = sum(1 for ref in claim.devices if ref in devices)
        if not held:
            continue
        result.allocated += held
        result.by_namespace[claim.namespace] = result.by_namespace.get(claim.namespace, 0) + held
        result.holding_claims.append(f"{claim.namespace}/{claim.name}")
    result.holding_claims.sort()
    return result
