"""Judging one admission review: a claim or template made, an allocation written, the probe.

- Made: a claim that alone asks for more of a policy's devices than the tenant's maxMemory is
  refused at once (it could never be allocated); a template's claims are judged as they are made.
- Allocated (``resourceclaims/status``): what the allocation holds of each policy's devices is
  charged to the tenant's ledger of that policy before it is admitted; the allocation is refused
  when it does not fit, saying what the namespace holds, its limit and what the claim asks. Only
  the claim as the API server holds it is charged (``planning.claim_review``: it exists, with that
  UID and spec, not allocated otherwise), only as its requests can be allocated (as many results
  as each asks, of devices its classes select, on one node), and a charge is only ever raised by a
  review.
- The controller's probe (a dry-run claim of a name only it uses, in its own namespace): refused
  with a fixed answer, which proves to the controller that the API server calls the webhook.

A maxMemory tenant is limited by the smaller of its ledger's limit (the one in force) and its
spec's maxMemory now: lowering a limit applies at once, raising it waits for the controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuslice.api.ledger import GpuSliceLedger
from gpuslice.coordinates import claim_path
from gpuslice.dra.names import MEMORY_PROBE, MEMORY_PROBE_ANSWER, class_policy
from gpuslice.dra.quantity import format_bytes
from gpuslice.dra.wire import MemoryPolicy
from gpuslice.kube.client import NotFound
from gpuslice.planning.claim_review import Published, not_as_asked, not_the_claim, over_consumed, policy_results
from gpuslice.planning.max_memory import (
    claim_policies,
    held_by_policy,
    least_asked,
    over_limit_message,
    too_large_message,
)
from gpuslice.webhook.ledger import Ledgers


@dataclass(frozen=True)
class Answer:
    allowed: bool
    message: str = ""
    code: int = 403


ALLOW = Answer(True)


def _who(request: Mapping[str, Any], obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName") or ""
    if request.get("operation") == "UPDATE":
        return f"allocation of ResourceClaim {name}"
    return f"ResourceClaim {name}"


class Reviewer:
    def __init__(self, ledgers: Ledgers) -> None:
        self.ledgers = ledgers
        self.state = ledgers.state

    def _limit(self, policy: str, namespace: str) -> int | None:
        view = self.state.policies.items.get(policy)
        return view.max_memory.get(namespace) if view is not None else None

    async def review(self, request: Mapping[str, Any]) -> Answer:
        obj: Mapping[str, Any] = request.get("object") or {}
        namespace = str(request.get("namespace") or "")
        meta = obj.get("metadata") or {}
        if namespace == self.state.home and meta.get("generateName") == MEMORY_PROBE:
            return Answer(False, MEMORY_PROBE_ANSWER)
        if request.get("operation") == "CREATE":
            return await self._made(request, obj, namespace)
        return await self._allocated(request, obj, namespace)

    async def _made(self, request: Mapping[str, Any], obj: Mapping[str, Any], namespace: str) -> Answer:
        spec = obj.get("spec") or {}
        for policy in sorted(claim_policies(spec)):
            view = self.state.policies.items.get(policy)
            ledger = self.state.ledgers.items.get(f"{policy}.{namespace}")
            limits = [b for b in (self._limit(policy, namespace),
                                  ledger.spec.limit_bytes if ledger is not None else None) if b is not None]
            if view is None or not limits:
                continue
            least = least_asked(spec, policy, view.classes)
            if least > min(limits):
                return Answer(False, too_large_message(_who(request, obj), namespace, policy, least, min(limits)))
        return ALLOW

    async def _allocated(self, request: Mapping[str, Any], obj: Mapping[str, Any], namespace: str) -> Answer:
        who = _who(request, obj)
        results = policy_results(obj)
        if not results:
            return ALLOW  # nothing of a policy's devices: nothing to charge
        meta = obj.get("metadata") or {}
        claim, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
        # Only the claim as the API server holds it is charged: read it before anything else, so that a
        # review of a claim that is not there learns nothing of the ledger either.
        stored = await self._stored(request, namespace, claim, uid)
        if (why := not_the_claim(request, obj, stored)) is not None:
            return Answer(False, f"{who}: {why}")
        # Every device must be published (a shared one's result is charged what it consumed, but no
        # more than the device's request policy gives the request).
        for pool in sorted({r["pool"] for r in results if self.state.device(r["pool"], r["device"]) is None}):
            await self.state.learn_pool(pool)  # published a moment ago: the watch is behind
        if unknown := next((r for r in results if self.state.device(r["pool"], r["device"]) is None), None):
            return Answer(False, f"{who}: device {unknown['pool']}/{unknown['device']} is not published by any"
                                 " ResourceSlice of driver gpu.gpuslice.dev, so its memory cannot be charged; the"
                                 " scheduler tries again")
        if (why := not_as_asked(obj, self._published, self._class_kind)) is not None:
            return Answer(False, f"{who}: {why}")
        try:
            held = held_by_policy(obj, self.state.device_memory)
        except ValueError as error:  # a consumedCapacity that is no quantity: never the API server's
            return Answer(False, f"{who}: {error}")
        if (why := over_consumed(obj, self._size)) is not None:
            return Answer(False, f"{who}: {why}")
        for policy, bytes_ in sorted(held.items()):
            if not bytes_:
                continue  # no memory held: a charge of 0 would only fill the ledger
            answer = await self._charge(request, who, namespace, policy, claim, uid, bytes_)
            if not answer.allowed:
                return answer
        return ALLOW

    async def _stored(self, request: Mapping[str, Any], namespace: str, name: str,
                      uid: str) -> Mapping[str, Any] | None:
        """The claim as the API server holds it: the watch's copy when it is of the very version the
        write is against (the review's oldObject: the API server refuses the write if the claim
        changed since), else read from the API server (a quorum read); None when there is none."""
        version = str(((request.get("oldObject") or {}).get("metadata") or {}).get("resourceVersion") or "")
        seen = self.state.claims.items.get((namespace, uid))
        meta = (seen or {}).get("metadata") or {}
        if seen is not None and version and meta.get("resourceVersion") == version and meta.get("name") == name:
            return seen
        try:
            return await self.state.kube.get(claim_path(namespace, name))
        except NotFound:
            return None

    def _published(self, pool: str, device: str) -> Published | None:
        found = self.state.device(pool, device)
        return found.published() if found is not None else None

    def _class_kind(self, device_class: str) -> str | None:
        """The kind of ``device_class`` as its policy has it in force; None when that is not known."""
        view = self.state.policies.items.get(class_policy(device_class) or "")
        found = view.classes.get(device_class) if view is not None else None
        return found.kind if found is not None else None

    def _size(self, pool: str, device: str) -> tuple[int, MemoryPolicy | None] | None:
        found = self.state.device(pool, device)
        return (found.memory, found.policy) if found is not None else None

    async def _charge(self, request: Mapping[str, Any], who: str, namespace: str, policy: str, claim: str, uid: str,
                      bytes_: int) -> Answer:
        spec_limit = self._limit(policy, namespace)

        def limit(ledger: GpuSliceLedger) -> int:
            return min(ledger.spec.limit_bytes, spec_limit) if spec_limit is not None else ledger.spec.limit_bytes

        charged = await self.ledgers.charge(policy, namespace, claim, uid, bytes_, limit,
                                            dry_run=bool(request.get("dryRun")))
        if charged is None:
            view = self.state.policies.items.get(policy)
            if spec_limit is None and (view is None or view.recorded.get(namespace) is None):
                return ALLOW  # not a maxMemory tenant of this policy: nothing to charge
            return Answer(False, f"{who}: namespace {namespace} has a maxMemory in GpuSlicePolicy {policy}, but its"
                                 f" ledger is not there yet ({self.state.home}/gpusliceledgers); try again in a moment")
        if not charged.ledger.in_force:
            return Answer(False, f"{who}: the maxMemory of namespace {namespace} in GpuSlicePolicy {policy} is not in"
                                 " force yet (its ledger has not counted what the namespace holds); try again in a"
                                 " moment")
        verdict = charged.verdict
        if verdict.allowed:
            return ALLOW
        if verdict.held + bytes_ <= charged.limit:
            return Answer(False, f"{who}: namespace {namespace} holds {len(charged.ledger.status.charges)}"
                                 f" allocations of GpuSlicePolicy {policy}, the most one ledger counts; release some"
                                 f" ({format_bytes(verdict.held)} held of its {format_bytes(charged.limit)} maxMemory)")
        return Answer(False, over_limit_message(who, namespace, policy, verdict.held, charged.limit, bytes_))
