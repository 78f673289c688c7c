"""Writing the ledgers: a charge per admitted allocation, and the recalculation that releases them.

Every write is a PUT of the ledger's status with the resourceVersion it was judged on, as the
API server's own quota admission writes a ResourceQuota: of two webhooks (or two requests) that
judged the same ledger, one write wins and the other is refused (409), reads the ledger again and
is judged again. A charge is written before the allocation is admitted, so the ledger is never
behind what is allocated; it may be ahead for a moment (the allocation write that follows fails,
or another admission refuses it), which the recalculation (``reckon_ledger``) releases.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from gpuslice.api.ledger import MAX_CHARGES, Charge, GpuSliceLedger, ledger_path, ledger_status_path
from gpuslice.backoff import Backoff
from gpuslice.coordinates import claims_in
from gpuslice.dra.quantity import quantity_bytes
from gpuslice.dra.wire import allocation_results, consumed_quantity
from gpuslice.kube.client import Conflict, NotFound
from gpuslice.observability.failpoints import failpoint
from gpuslice.planning.max_memory import (
    ClaimState,
    UnknownDevice,
    Verdict,
    held_by_policy,
    judge,
    reckon,
)
from gpuslice.webhook.metrics import CONFLICTS, RELEASED
from gpuslice.webhook.state import State

log = structlog.get_logger(__name__)
# Webhooks racing for one ledger: a few milliseconds, spread, so the losers do not collide again.
CONFLICT_BACKOFF = Backoff(0.005, 0.05)
TRIES = 12  # writes of one charge before the request is refused (as busy): far more than contention needs


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def stamp(when: datetime.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Charged:
    verdict: Verdict
    limit: int
    ledger: GpuSliceLedger


class Ledgers:
    """The ledgers this process writes, one writer at a time per ledger within the process (across
    processes, optimistic concurrency decides)."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def read(self, policy: str, namespace: str, fresh: bool = False) -> GpuSliceLedger | None:
        """The ledger from the cache, or (``fresh``, or not in the cache) from the API server."""
        name = f"{policy}.{namespace}"
        found = None if fresh else self.state.ledgers.items.get(name)
        if found is not None:
            return found
        try:
            body = await self.state.kube.get(ledger_path(policy, namespace, self.state.home))
        except NotFound:
            return None
        ledger = GpuSliceLedger.from_body(body)
        self.state.keep_ledger(ledger)
        return ledger

    async def _write(self, ledger: GpuSliceLedger, charges: list[Charge], extra: dict[str, Any] | None = None,
                     ) -> GpuSliceLedger:
        status = {**ledger.status.model_dump(by_alias=True, exclude_none=True, mode="json"), **(extra or {}),
                  "charges": [c.model_dump(by_alias=True, mode="json") for c in charges],
                  "heldBytes": sum(c.bytes for c in charges)}
        body = {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSliceLedger",
                "metadata": {**ledger.metadata}, "spec": ledger.spec.model_dump(by_alias=True, mode="json"),
                "status": status}
        written = GpuSliceLedger.from_body(
            await self.state.kube.replace(
                ledger_status_path(ledger.spec.policy, ledger.spec.namespace, self.state.home), body))
        self.state.keep_ledger(written)
        return written

    async def charge(self, policy: str, namespace: str, claim: str, uid: str, bytes_: int,
                     limit: Callable[[GpuSliceLedger], int], dry_run: bool = False) -> Charged | None:
        """Judge and charge an allocation; None when the tenant has no ledger. ``limit``: what to
        judge a ledger against (its spec, or less if the policy's spec was lowered since)."""
        name = f"{policy}.{namespace}"
        async with self.lock(name):
            ledger = await self.read(policy, namespace)
            if ledger is None or not ledger.in_force:
                ledger = await self.read(policy, namespace, fresh=True)  # the watch may be behind
            for attempt in range(TRIES):
                if ledger is None:
                    return None
                cap = limit(ledger)
                verdict = judge(ledger.status.charges, cap, claim, uid, bytes_, stamp(_now()), MAX_CHARGES)
                if not verdict.allowed or dry_run or not ledger.in_force:
                    return Charged(verdict, cap, ledger)
                try:
                    written = await self._write(ledger, list(verdict.charges))
                except Conflict:
                    CONFLICTS.inc()
                    await asyncio.sleep(CONFLICT_BACKOFF.after(attempt + 1))
                    ledger = await self.read(policy, namespace, fresh=True)
                    continue
                failpoint("webhook.charged")  # the charge is written, the answer not yet given
                return Charged(verdict, cap, written)
        raise TimeoutError(f"ledger {name} changed under every one of {TRIES} tries")

    async def reckon_ledger(self, ledger_name: str, grace: datetime.timedelta) -> None:
        """Bring one ledger in line with the claims: count a namespace not yet counted (a quorum
        list), then charge what is allocated and not charged, and release what is charged and not
        allocated (each release confirmed by a read of the claim)."""
        async with self.lock(ledger_name):
            for _ in range(TRIES):
                ledger = self.state.ledgers.items.get(ledger_name)
                if ledger is None:
                    return
                try:
                    await self._reckon(ledger, grace)
                    return
                except Conflict:
                    CONFLICTS.inc()
                    fresh = await self.read(ledger.spec.policy, ledger.spec.namespace, fresh=True)
                    if fresh is None:
                        return
                except NotFound:
                    return

    def _states(self, ledger: GpuSliceLedger, claims: list[dict[str, Any]]) -> dict[str, ClaimState]:
        """Each claim (by UID) and what its allocation holds of the ledger's policy."""
        policy = ledger.spec.policy
        view = self.state.policies.items.get(policy)
        classes = view.classes if view is not None else {}

        def most(klass: str) -> int | None:
            found = classes.get(klass)
            return quantity_bytes(found.memory) if found is not None else None

        charged = {c.uid: c.bytes for c in ledger.status.charges}
        states = {}
        for claim in claims:
            meta = claim.get("metadata") or {}
            uid = str(meta.get("uid", ""))
            try:
                held: int | None = held_by_policy(claim, self.state.device_memory, most).get(policy)
            except UnknownDevice:
                held = charged.get(uid)  # nothing tells its size: what was charged stands
            states[uid] = ClaimState(str(meta.get("name", "")), uid, held)
        return states

    async def learn_devices(self, claims: list[dict[str, Any]]) -> None:
        """Read the pools of devices in these claims' allocations that the watch has not brought."""
        pools = {r["pool"] for c in claims for r in allocation_results(c)
                 if consumed_quantity(r) is None and self.state.device_memory(r["pool"], r["device"]) is None}
        for pool in sorted(pools):
            await self.state.learn_pool(pool)

    async def _reckon(self, ledger: GpuSliceLedger, grace: datetime.timedelta) -> None:
        kube, spec = self.state.kube, ledger.spec
        claims_path = claims_in(spec.namespace)
        if not ledger.in_force:
            # Count the namespace from the API server itself (a quorum list, not the watch): from
            # here on every allocation is charged, and the tenancy rule admits none until then.
            claims = await kube.list(claims_path)
            await self.learn_devices(claims)
            now = _now()
            charges = [Charge(claim=s.name, uid=uid, bytes=s.held, at=stamp(now))
                       for uid, s in self._states(ledger, claims).items() if s.held]
            await self._write(ledger, charges, {"since": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                                "namespaceUid": spec.namespace_uid})
            log.info("ledger counted", ledger=ledger.name, held=sum(c.bytes for c in charges), claims=len(charges))
            return
        states = self._states(ledger, self.state.namespace_claims(spec.namespace))
        now = _now()
        result = reckon(ledger.status.charges, states, now, grace)
        if result.confirm:
            confirmed: list[str] = []
            for name in sorted(set(result.confirm)):
                try:
                    fresh = await kube.get(f"{claims_path}/{name}")
                except NotFound:
                    fresh = None
                confirmed.append(name)
                for uid in [u for u, s in states.items() if s.name == name]:
                    del states[uid]
                if fresh is not None:
                    states.update(self._states(ledger, [fresh]))
            result = reckon(ledger.status.charges, states, now, grace, confirmed)
        if not result.changed:
            return
        before = {c.uid: c.bytes for c in ledger.status.charges}
        after = {c.uid: c.bytes for c in result.charges}
        released = [c.claim for c in ledger.status.charges if c.uid not in after]
        await self._write(ledger, result.charges)
        RELEASED.inc(len(released))
        log.info("ledger recounted", ledger=ledger.name, held=sum(after.values()), released=released,
                 changed=sorted(u for u in after if before.get(u) != after[u]))

