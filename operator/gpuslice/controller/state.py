"""What the controller remembers between reconciles, kept in one place.

Per policy, one :class:`PolicyState` (its lock, its converge backoff, what the controller last
recorded in its status, its last tenancy probe), so that a deleted policy is forgotten in one
``pop``; across policies, the few things that are not any one policy's (the quotas and ledgers
last seen, the maxMemory webhook's last probe, the UIDs of deleted policies).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuslice.api.status import AdmittedTenant, ClassInForce
from gpuslice.backoff import Backoff
from gpuslice.controller.metrics import POLICY_METRICS
from gpuslice.controller.tenancy import LedgerView, QuotaView
from gpuslice.dra.names import CONTROLLER_NAMESPACE
from gpuslice.kube.client import KubeClient

GONE_KEPT = 10_000  # deleted policies remembered (a reconcile of one is at most seconds behind)
# Backoff between converges that failed: bounded, so bad input is retried now and then, never in a loop.
FIRST_RETRY, LAST_RETRY = 2.0, 300.0
# An API server that is restarting, overloaded or not ready yet is asked again within this long.
TRANSIENT_RETRY = 10.0
TRANSIENT_REPORTED = 3  # transient failures in a row before the status says so


@dataclass
class PolicyState:
    """What the controller remembers of one policy. The records (``None``: none kept yet) are
    fresher than any body a handler is given: the status as the controller last wrote it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # two triggers never interleave
    # The last converge failed. Event handlers (a namespace appeared, a slice changed) are not
    # retried by Kopf, so the status timer converges it again once ``retry_at`` is up.
    unconverged: bool = False
    failures: tuple[int, int] | None = None  # (generation, failed converges of it in a row)
    retry_at: float = 0.0
    # Why the last converge failed, kept until one succeeds: a status refresh in between (which does
    # not converge) reports it too, so a converge that keeps failing shows in the conditions.
    failed_because: list[str] = field(default_factory=list)
    label_record: frozenset[str] | None = None  # status.adminAccessLabels
    admitted: list[AdmittedTenant] | None = None  # status.admittedTenants
    in_force: list[ClassInForce] | None = None  # status.classesInForce
    tenancy: tuple[int, str | None] | None = None  # last probe: (generation, what is wrong, or None)
    tenancy_epoch: int = 0  # Context.tenancy_epoch when it was last probed
    # A tenant waits only for its quota's second to pass, longer than a reconcile waits (a clock
    # behind the apiserver's), or for the maxMemory webhook to answer its probe: the status timer
    # refreshes the policy though nothing changed.
    clock_wait: bool = False
    # The newest (uid, generation) reconciled: an event handler that held a body across awaits
    # (one policy after another) must not converge an older spec over a newer one.
    newest: tuple[str, int] | None = None


@dataclass
class Context:
    """What every handler shares: the API client, each policy's :class:`PolicyState`, and what is
    not any one policy's."""

    kube: KubeClient
    username: str
    namespace: str = CONTROLLER_NAMESPACE
    # Where DeviceTaintRule is served (dra.support.taint_rule_api); None: nowhere (a stock 1.36), so not asked.
    taint_rule_api: str | None = "resource.k8s.io/v1"
    policies: dict[str, PolicyState] = field(default_factory=dict)
    # What each live gpuslice quota enforced when last seen, to act only when that changes.
    quotas_seen: dict[tuple[str, str], QuotaView] = field(default_factory=dict)
    ledgers_seen: dict[str, LedgerView] = field(default_factory=dict)  # the same for maxMemory ledgers
    # The last probe of the maxMemory webhook: (when, by the clock; what is wrong, or None when it answers).
    memory_probe: tuple[float, str | None] | None = None
    # UIDs of policies whose deletion finished: a reconcile that waited on the policy's lock, or an
    # event handler's body read before the deletion, must not bring its status and series back.
    gone: dict[str, None] = field(default_factory=dict)
    tenancy_labels: asyncio.Lock = field(default_factory=asyncio.Lock)  # controller.tenancy_labels
    # The routing labels this controller last wrote, and the namespace's resourceVersion then.
    routes_written: dict[tuple[str, str], tuple[str | None, int]] = field(default_factory=dict)
    # The objects a converge last applied (their APPLIED digest, None once deleted) and their
    # resourceVersion then: the watches may not have caught up with them yet (controller.apply).
    applied: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    # The generation of each policy whose DeviceTaintRules of an earlier version this controller has
    # pruned (the kind is listed once per generation, not at every drift repair).
    taint_rules_pruned: dict[str, int] = field(default_factory=dict)
    # The tenancy probe: each generation of each policy is probed once it converges; after that one
    # policy's probe every ``canary_every`` seconds stands for all (what it proves, that the rule is in
    # force, is the same for every policy: its objects were deleted or changed, or the API server
    # lost them). When that canary finds tenancy not enforced, ``tenancy_epoch`` moves and every
    # policy is probed again at its next status refresh.
    # The digest of each policy's agent view as this controller last wrote it, and when on ``clock``
    # (controller.agent_views).
    views: dict[str, tuple[str, float]] = field(default_factory=dict)
    canary_every: float = 120.0
    canary_at: float | None = None
    tenancy_epoch: int = 0
    clock: Callable[[], float] = time.monotonic
    first_retry: float = FIRST_RETRY  # ControllerSettings.first_retry
    last_retry: float = LAST_RETRY

    def policy(self, name: str) -> PolicyState:
        """``name``'s state, by name: never held across an await that ``forget`` may pass."""
        return self.policies.setdefault(name, PolicyState())

    def lock(self, name: str) -> asyncio.Lock:
        return self.policy(name).lock

    @property
    def unconverged(self) -> set[str]:
        return {name for name, state in self.policies.items() if state.unconverged}

    @property
    def clock_waits(self) -> set[str]:
        return {name for name, state in self.policies.items() if state.clock_wait}

    def label_records(self) -> dict[str, frozenset[str]]:
        """The admin-access labels each policy set, as the controller recorded them."""
        return {name: state.label_record for name, state in self.policies.items() if state.label_record is not None}

    def forget(self, name: str, uid: str = "") -> None:
        """A deleted policy's state goes with it (and, by ``uid``, anything reconciled of it later)."""
        if uid:
            self.gone[uid] = None
            while len(self.gone) > GONE_KEPT:
                del self.gone[next(iter(self.gone))]
        self.policies.pop(name, None)
        self.taint_rules_pruned.pop(name, None)
        POLICY_METRICS.forget(name)

    def probe_due(self, name: str, generation: int) -> bool:
        """Whether ``name`` is to be probed now: a generation not probed (or not proved), a canary that
        failed since it was, or the canary's turn (taken by this call)."""
        state = self.policy(name)
        if (state.tenancy is None or state.tenancy != (generation, None)
                or state.tenancy_epoch < self.tenancy_epoch):
            return True
        if self.canary_at is None or self.clock() - self.canary_at >= self.canary_every:
            self.canary_at = self.clock()
            return True
        return False

    def probed(self, name: str, generation: int, unenforced: str | None) -> None:
        """Record a probe's verdict; a policy proved before and not now fails the canary for all."""
        state = self.policy(name)
        if unenforced and state.tenancy == (generation, None):
            self.tenancy_epoch += 1
        state.tenancy, state.tenancy_epoch = (generation, unenforced), self.tenancy_epoch
        self.canary_at = self.clock()  # any probe's answer is as good as the canary's

    def stale_probe(self, name: str) -> bool:
        """A policy proved before a canary failed: probed again at its next refresh."""
        return self.policy(name).tenancy_epoch < self.tenancy_epoch

    def due(self, name: str) -> bool:
        return self.clock() >= self.policy(name).retry_at

    def failed(self, name: str, generation: int, transient: bool = False, why: str = "") -> float:
        """Count a failed converge; the seconds until the next try (doubling, bounded; a transient
        failure of the API server is not the policy's fault and is retried sooner). ``why``, when
        given, is what the status reports until a converge succeeds (a transient failure from its
        third in a row: the API server restarting is no news)."""
        state = self.policy(name)
        seen, count = state.failures or (generation, 0)
        count = count + 1 if seen == generation else 1
        state.failures = (generation, count)
        if why and (not transient or count >= TRANSIENT_REPORTED):
            state.failed_because = [f"reconciling failed ({count} in a row): {why}"]
        # Not spread: one controller retries one policy, no fleet arrives in step.
        limit = min(TRANSIENT_RETRY, self.last_retry) if transient else self.last_retry
        delay = Backoff(self.first_retry, limit, jitter=False).after(count)
        state.retry_at = self.clock() + delay
        state.unconverged = True
        return delay

    def succeeded(self, name: str) -> None:
        state = self.policy(name)
        state.failures, state.retry_at, state.unconverged = None, 0.0, False
        state.failed_because = []
