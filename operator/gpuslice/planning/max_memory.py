"""maxMemory, pure: what an allocation holds, the least a claim asks, and a ledger's arithmetic.

The webhook (gpuslice.webhook) judges with these, and the controller and ``gpuslice why``
count with them, so what is charged and what is reported are the same figure.

What an allocation holds of a policy: each result of driver ``gpu.gpuslice.dev`` that is not
admin access (admin access takes no device from anyone), of a request whose DeviceClass is one
of the policy's (``gpuslice-device-classes`` lets gpuslice's devices go only through gpuslice's
classes, and a class selects only its policy's devices), counted as the memory the scheduler says
it consumed (a shared device) or else the memory the device stands for (published in its
``capacity``; a device's name fixes its size, so a device of that name always holds that much).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuslice.api.ledger import Charge
from gpuslice.api.status import ClassInForce
from gpuslice.dra.names import class_policy
from gpuslice.dra.quantity import format_bytes, quantity_bytes
from gpuslice.dra.wire import (
    ExactRequest,
    admin_access,
    allocation_results,
    consumed_quantity,
    device_requests,
    request_ways,
)
from gpuslice.errors import GpusliceError
from gpuslice.jsontypes import Body

MemoryOf = Callable[[str, str], int | None]  # (pool, device) -> bytes, None when not known


class UnknownDevice(GpusliceError):
    """A device in an allocation that no published slice (yet) describes."""

    def __init__(self, pool: str, device: str) -> None:
        super().__init__(f"{pool}/{device}")
        self.pool, self.device = pool, device


def request_classes(spec: Body) -> dict[str, str]:
    """The DeviceClass of each request and subrequest, by the name an allocation result gives it
    (``<request>`` or ``<request>/<subrequest>``)."""
    found: dict[str, str] = {}
    for request in device_requests(spec):
        for way in ([request["exactly"]] if "exactly" in request else []) + request["firstAvailable"]:
            found[way["name"]] = way["deviceClassName"]
    return found


def claim_policies(spec: Body) -> set[str]:
    """The policies whose classes a claim (or template) names anywhere."""
    return {p for c in request_classes(spec).values() if (p := class_policy(c))}


def held_by_policy(claim: Body, memory_of: MemoryOf,
                   upper_bound: Callable[[str], int | None] | None = None) -> dict[str, int]:
    """What the claim's allocation holds of each policy's devices, in bytes (empty when it has none).
    ``upper_bound`` (a DeviceClass -> the most one of its devices holds) answers for a device
    ``memory_of`` does not know (its slice gone with its node), never less than it holds. Raises
    UnknownDevice for a device whose memory neither can tell."""
    classes = request_classes(claim.get("spec") or {})
    held: dict[str, int] = {}
    for result in allocation_results(claim):
        if admin_access(result):
            continue
        policy = class_policy(classes.get(result["request"], ""))
        if policy is None:
            continue  # gpuslice-device-classes refuses that allocation; nothing of a policy's to charge
        consumed = consumed_quantity(result)
        if consumed is not None:
            memory: int | None = quantity_bytes(consumed)
        else:
            memory = memory_of(result["pool"], result["device"])
            if memory is None and upper_bound is not None:
                memory = upper_bound(classes.get(result["request"], ""))
        if memory is None:
            raise UnknownDevice(result["pool"], result["device"])
        held[policy] = held.get(policy, 0) + memory
    return held


def request_least(request: ExactRequest, klass: ClassInForce) -> int:
    """The least one request of ``klass`` can be allocated: its count of devices (allocationMode
    All: at least one), each the least a device of the class holds, or in shared mode what it asks
    rounded up to the step (the class's memory)."""
    count = 1 if request["allocationMode"] == "All" else request["count"]
    least = quantity_bytes(klass.least_memory)
    asked = request.get("memory")
    if klass.shared and asked is not None:
        step = quantity_bytes(klass.memory) or 1
        least = max(step, -(-quantity_bytes(asked) // step) * step)
    return count * least


def least_asked(spec: Body, policy: str, classes: Mapping[str, ClassInForce]) -> int:
    """The least memory of ``policy``'s devices a claim with this spec can be allocated: the sum over
    its requests of that policy's classes; a firstAvailable request counts its cheapest way (none,
    when one of its subrequests is of another policy or of a class not in force)."""
    total = 0
    for request in device_requests(spec):
        ways = []
        for way in request_ways(request):
            klass = classes.get(way["deviceClassName"])
            ways.append(request_least(way, klass) if klass is not None and class_policy(klass.name) == policy
                        else 0)
        total += min(ways, default=0)
    return total


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    held: int  # what the ledger holds for the namespace's other claims
    charges: tuple[Charge, ...] = ()  # the charges to write when allowed (unchanged when nothing to write)
    changed: bool = False


def judge(charges: Sequence[Charge], limit: int, claim: str, uid: str, bytes_: int, now: str,
          max_charges: int) -> Verdict:
    """Whether an allocation of ``bytes_`` for claim ``uid`` fits: the other charges plus it at most
    ``limit``. The claim's own earlier charge (a write that failed, tried again) is never added to,
    so a retried allocation is charged once, and never lowered: a review only raises a charge (the
    larger of the two is judged and kept). Lowering is the recount's, from the claim read again
    (``reckon``): before the second December review a review that said a held claim consumed 0
    lowered its charge, and a tenant with 20Gi held 30Gi."""
    others = [c for c in charges if c.uid != uid]
    held = sum(c.bytes for c in others)
    mine = next((c for c in charges if c.uid == uid), None)
    charged = max(bytes_, mine.bytes) if mine is not None else bytes_
    if held + charged > limit or (mine is None and len(others) >= max_charges):
        return Verdict(False, held)
    if mine is not None and mine.bytes == charged:
        # The same allocation again (or a smaller one): keep the charge, renew its time (its write is in flight again).
        fresh = Charge(claim=claim, uid=uid, bytes=charged, at=now)
        return Verdict(True, held, tuple(fresh if c.uid == uid else c for c in charges), changed=True)
    return Verdict(True, held, (*others, Charge(claim=claim, uid=uid, bytes=charged, at=now)), changed=True)


def shown(value: int) -> str:
    """Bytes as a person reads them: exact when short (28Gi, 10G), else to a tenth of a GiB (79.6Gi)."""
    exact = format_bytes(value)
    if value < 2**30 or exact.endswith(("Gi", "G", "Ti", "T", "Pi", "P")):
        return exact
    return f"{value / 2**30:.1f}Gi"


def over_limit_message(who: str, namespace: str, policy: str, held: int, limit: int, asked: int) -> str:
    return (f"{who}: namespace {namespace} holds {shown(held)} of its {shown(limit)} maxMemory in"
            f" GpuSlicePolicy {policy}; this claim asks {shown(asked)}, and"
            f" {shown(max(limit - held, 0))} is left. It is allocated once the namespace's other claims"
            f" release enough (delete pods or claims it no longer needs), or ask the platform team to raise"
            f" spec.tenants[].maxMemory of GpuSlicePolicy {policy}")


def too_large_message(who: str, namespace: str, policy: str, least: int, limit: int) -> str:
    return (f"{who}: asks for at least {shown(least)} of the devices of GpuSlicePolicy {policy}, more than"
            f" namespace {namespace} may hold at once (spec.tenants[].maxMemory: {shown(limit)}), so it"
            f" could never be allocated; ask for less (fewer or smaller devices, a smaller capacity.requests),"
            f" or ask the platform team to raise spec.tenants[].maxMemory of GpuSlicePolicy {policy}")


# --- Releasing charges: the recalculation from the objects themselves --------------------------


@dataclass(frozen=True)
class ClaimState:
    """What is known of one claim: its UID and name, and what its allocation holds of the policy
    (None: not allocated)."""

    name: str
    uid: str
    held: int | None


@dataclass
class Reckoning:
    """What a pass over a ledger decided: the charges to keep, and the claims to read again from the
    API server before a charge of theirs may be lowered or released (a watch can be behind)."""

    charges: list[Charge] = field(default_factory=list)
    confirm: list[str] = field(default_factory=list)  # claim names
    changed: bool = False


def _at(stamp: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def reckon(charges: Sequence[Charge], claims: Mapping[str, ClaimState], now: datetime.datetime,
           grace: datetime.timedelta, confirmed: Iterable[str] = ()) -> Reckoning:
    """The charges as the claims say they should be. ``claims``: the namespace's claims by UID as
    seen; ``confirmed``: names of claims read just now from the API server (a quorum read), whose
    state may lower or release a charge. Raising is always safe (over-counting for a moment is
    fine, under-counting never), so:

    - an allocated claim with no charge, or a larger allocation than charged, is charged what it holds;
    - a charge is lowered to what an allocated claim holds, or released when its claim is gone or
      holds nothing of the policy, only from a confirmed read;
    - a charge whose claim is unallocated is released only ``grace`` after it was made: its
      allocation write may still be in flight (admitted, not yet committed).
    """
    sure = set(confirmed)
    result = Reckoning()
    by_uid = {c.uid: c for c in charges}
    for charge in charges:
        state = claims.get(charge.uid)
        if state is not None and state.held is not None:
            if state.held >= charge.bytes or state.name in sure:
                result.charges.append(charge.model_copy(update={"bytes": state.held}))
                result.changed |= state.held != charge.bytes
            else:
                result.charges.append(charge)
                result.confirm.append(state.name)
            continue
        made = _at(charge.at)
        young = made is not None and now - made < grace
        if state is not None and young:
            result.charges.append(charge)  # an allocation write that may still commit
            continue
        if charge.claim in sure:
            result.changed = True  # gone, or unallocated past the grace: released
            continue
        result.charges.append(charge)
        if state is None or not young:
            result.confirm.append(charge.claim)
    for uid, state in claims.items():
        if uid not in by_uid and state.held:
            result.charges.append(Charge(claim=state.name, uid=uid, bytes=state.held,
                                         at=now.strftime("%Y-%m-%dT%H:%M:%SZ")))
            result.changed = True
    return result
