"""Whether an allocation review is about a claim as the API server holds it, pure.

The maxMemory webhook charges a ledger from what a review of an allocation write says, and a
review is only a request body: without client authentication (docs/install.md) anyone who reaches
the webhook's port can send one. Before the second December review one such POST charged another
tenant 30Gi for a claim it never had, and that tenant's real 1Gi allocation was refused. The API
server's own reviews of the scheduler's write always name a claim that exists, in the review's
namespace, with that UID and that spec, not yet allocated (or allocated exactly so: the same write
seen again); the allocation in it answers the claim's requests as the scheduler's allocator does
(each request met one way, with its count of devices, or for ``allocationMode: All`` each device
once, of the class's policy and kind, on one node; a shared device's result says what it
consumed); and what a result consumed of a shared device is what the request asks rounded up by
the device's request policy, never more. A review that says otherwise is not charged, whoever sent
it, and nothing in the refusal tells the sender what the claim or its ledger hold. Before the third
December review a copy of a tenant's waiting 1Gi claim with thirty results of 1Gi was charged 30Gi.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuslice.dra.names import DRIVER, class_policy
from gpuslice.dra.quantity import format_bytes, quantity_bytes
from gpuslice.dra.wire import (
    AllocationResult,
    ExactRequest,
    MemoryPolicy,
    admin_access,
    allocation_results,
    consumed_quantity,
    device_requests,
    request_ways,
)
from gpuslice.jsontypes import Body

# (pool, device) -> its memory, and its memory's request policy when shared; None when not known
SizeOf = Callable[[str, str], tuple[int, MemoryPolicy | None] | None]


@dataclass(frozen=True)
class Published:
    """What a device's ResourceSlice says it is: what an allocation of it must match."""

    owner: str | None  # the policy that publishes it (gpuslice.dev/policy)
    kind: str  # slice, full, shared or a MIG profile (planning.devices.published_kind)
    shared: bool  # several allocations may each take a part of it (consumable capacity)


Lookup = Callable[[str, str], Published | None]  # (pool, device) -> what it is; None when not published


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


def not_as_asked(review: Body, published: Lookup, class_kind: Callable[[str], str | None]) -> str | None:
    """Why the allocation in ``review`` is not one the scheduler could give the claim's requests
    (its spec being the claim's: ``not_the_claim``); None when it could be. For each request of a
    gpuslice class: its results all of one of its ways (a ``firstAvailable`` request is met by one
    subrequest), as many as its count (``All``: each device once, so no more than the node has),
    each a device of the class's policy and kind (``class_kind``: the kind its policy has in force;
    None: the policy only), a device that is not shared in one result only, a shared one's saying
    what it consumed; every gpuslice device of the allocation on one node (its pool)."""
    ways: dict[str, tuple[str, ExactRequest]] = {way["name"]: (request["name"], way)
                                                 for request in device_requests(review.get("spec") or {})
                                                 for way in request_ways(request)}
    results = allocation_results(review, None)
    by_request: dict[str, list[AllocationResult]] = {}
    for result in results:
        if result["request"] not in ways:
            return f"a result answers request {result['request']!r}, which the claim does not make"
        by_request.setdefault(ways[result["request"]][0], []).append(result)
    if len({r["pool"] for r in results if r["driver"] == DRIVER}) > 1:
        return "its results are devices of several nodes; an allocation is on one node"
    ours = {top for top, way in ways.values() if class_policy(way["deviceClassName"]) is not None}
    for top in sorted(ours):
        got = by_request.get(top, [])
        answered = sorted({r["request"] for r in got})
        if len(answered) > 1:
            return f"request {top} is answered by {', '.join(answered)}; one of its ways is allocated"
        if not got:
            continue
        why = _as_asked(got, ways[answered[0]][1], published, class_kind)
        if why is not None:
            return why
    taken = Counter((r["pool"], r["device"]) for r in results if r["driver"] == DRIVER)
    for (pool, device), times in sorted(taken.items()):
        facts = published(pool, device)
        if times > 1 and (facts is None or not facts.shared):
            return f"device {pool}/{device} is in {times} results; a device that is not shared is allocated once"
    return None


def _as_asked(got: list[AllocationResult], way: ExactRequest, published: Lookup,
              class_kind: Callable[[str], str | None]) -> str | None:
    """Why the results ``got`` do not meet one way of a request; None when they do."""
    klass = way["deviceClassName"]
    policy, kind = class_policy(klass), class_kind(klass)
    if way["allocationMode"] == "All":
        if len({(r["pool"], r["device"]) for r in got}) < len(got):
            return f"request {way['name']} (allocationMode All) names a device twice; All takes each once"
    elif len(got) != way["count"]:
        return f"request {way['name']} asks for {way['count']} device(s), and the review gives it {len(got)}"
    for result in got:
        facts = published(result["pool"], result["device"])
        if result["driver"] != DRIVER or facts is None:
            return (f"result {result['request']} is device {result['pool']}/{result['device']} of driver"
                    f" {result['driver']}, which DeviceClass {klass} does not select")
        if facts.owner != policy or (kind is not None and facts.kind != kind):
            return (f"result {result['request']} is device {result['pool']}/{result['device']}, a {facts.kind} of"
                    f" {facts.owner or 'no policy'}, which DeviceClass {klass} does not select")
        if facts.shared and consumed_quantity(result) is None and not admin_access(result):
            return (f"result {result['request']} on shared device {result['pool']}/{result['device']} does not say"
                    " what it consumed (the scheduler always does)")
    return None
