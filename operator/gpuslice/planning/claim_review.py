"""Whether an allocation review is about a claim as the API server holds it, pure.

The maxMemory webhook charges a ledger from what a review of an allocation write says, and a
review is only a request body: without client authentication (docs/install.md) anyone who reaches
the webhook's port can send one. Before the second December review one such POST charged another
tenant 30Gi for a claim it never had, and that tenant's real 1Gi allocation was refused. The API
server's own reviews of the scheduler's write always name a claim that exists, in the review's
namespace, with that UID and that spec, not yet allocated (or allocated exactly so: the same write
seen again); and what a result consumed of a shared device is what the request asks rounded up
by the device's request policy, never more. A review that says otherwise is not charged, whoever
sent it, and nothing in the refusal tells the sender what the claim or its ledger hold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpuslice.dra.names import class_policy
from gpuslice.dra.quantity import format_bytes, quantity_bytes
from gpuslice.dra.wire import (
    AllocationResult,
    MemoryPolicy,
    admin_access,
    allocation_results,
    consumed_quantity,
    device_requests,
    request_ways,
)

Body = Mapping[str, Any]
# (pool, device) -> its memory, and its memory's request policy when shared; None when not known
SizeOf = Callable[[str, str], tuple[int, MemoryPolicy | None] | None]


def _meta(obj: Body) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def policy_results(claim: Body) -> list[AllocationResult]:
    """The results of an allocation that a policy's ledger is charged for: gpuslice's driver, not
    admin access, answering a request of one of gpuslice's classes."""
    classes = {way["name"]: way["deviceClassName"] for request in device_requests(claim.get("spec") or {})
               for way in request_ways(request)}
    return [r for r in allocation_results(claim)
            if not admin_access(r) and class_policy(classes.get(r["request"], "")) is not None]


def not_the_claim(request: Body, review: Body, stored: Body | None) -> str | None:
    """Why the claim in ``review`` (the review's ``object``) is not the claim the API server holds,
    ``stored`` (read just now, a quorum read; None: there is none); None when it is."""
    meta, namespace = _meta(review), str(request.get("namespace") or "")
    name = str(meta.get("name") or "")
    if request.get("name") not in (None, name) or meta.get("namespace") not in (None, namespace):
        return "the review names two different claims; only the API server's reviews are charged"
    if stored is None:
        return f"ResourceClaim {namespace}/{name} does not exist; only the API server's reviews are charged"
    if _meta(stored).get("uid") != meta.get("uid"):
        return (f"ResourceClaim {namespace}/{name} has another UID than the review says (deleted and made again?);"
                " the scheduler tries again")
    if (stored.get("spec") or {}) != (review.get("spec") or {}):
        return f"the review's spec of ResourceClaim {namespace}/{name} is not the claim's"
    held = (stored.get("status") or {}).get("allocation")
    if held and held != (review.get("status") or {}).get("allocation"):
        return f"ResourceClaim {namespace}/{name} is allocated already, and not as the review says"
    return None


def over_consumed(review: Body, size_of: SizeOf) -> str | None:
    """Why a result of ``review`` consumed more of a shared device than the device holds, or than
    its request can be given (the request's capacity rounded up by the device's request policy);
    None when none did. A device ``size_of`` does not know is the caller's to refuse."""
    ways = {way["name"]: way for request in device_requests(review.get("spec") or {}) for way in request_ways(request)}
    for result in policy_results(review):
        consumed, way, size = consumed_quantity(result), ways.get(result["request"]), size_of(result["pool"],
                                                                                               result["device"])
        if consumed is None or way is None or size is None:
            continue
        memory, policy = size
        asked = way.get("memory")
        try:
            most = min(memory, policy.consumed(quantity_bytes(asked) if asked is not None else None)
                       if policy is not None else memory)
            over = quantity_bytes(consumed) > most
        except ValueError:
            return f"result {result['request']} consumed memory {consumed!r}, which is no quantity"
        if over:
            return (f"result {result['request']} consumed {consumed} of device {result['pool']}/{result['device']},"
                    f" more than its request can be given there ({format_bytes(most)})")
    return None
