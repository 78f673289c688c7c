"""What the controller does about pods a node agent marked as using more GPU memory than their claim
was allocated (``planning.overuse``): the Events on the pod, and the eviction where the policy of the
device says ``onOveruse: Evict`` of the pods the mark chose (a claim several pods share: its largest
users until the rest fit; the agent chooses, as it alone sees each pod's use).

The agents measure but may neither evict nor post Events outside ``default``: a stolen agent token
must hurt one node only (docs/agent.md, "A compromised node"). The controller acts only on pods
:func:`~gpuslice.planning.overuse.overusing_pods` accepts (named in a mark the claim's own node
could write, reserving the claim) and, before evicting, reads the pod: the same UID, not being
deleted, and running on the node the claim is allocated on.

- ``GpuMemoryOveruse`` (Warning), once per overuse: the agent's words;
- ``GpuMemoryOveruseEvicted`` (Warning) once the Eviction API took the pod (with the pod's UID as a
  precondition), or ``GpuMemoryOveruseEvictionBlocked`` (Warning) once when a PodDisruptionBudget
  refused it (429): tried again while the mark stands, after 5 s doubling to 60 s, jittered;
- ``GpuMemoryOveruseEnded`` (Normal) when the mark no longer names a pod that still holds the claim.

Events are named by the pod's UID and the overuse's start (the agent's), so a controller that
starts over, or a new leader, does not post one twice. Everything here runs only in the leader
(Kopf runs there) and writes through its guarded client.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpuslice.backoff import Backoff
from gpuslice.coordinates import eviction_path, pod_path
from gpuslice.dra.wire import device_condition, device_statuses
from gpuslice.kube.client import (
    Forbidden,
    KubeClient,
    KubeError,
    NotFound,
    ServerError,
    TooManyRequests,
    refused_by_disruption_budget,
)
from gpuslice.kube.events import create_event, pod_ref
from gpuslice.observability.metrics import OVERUSE_ACTIONS
from gpuslice.planning.overuse import CONDITION, OverusingPod, overusing_pods, reserved_pods

log = structlog.get_logger(__name__)
RETRY = Backoff(5.0, 60.0)  # an eviction that failed: 5 s doubling to a minute, with jitter
EVICTION_RETRY = 5.0  # how often an Evict policy's timer looks for evictions due
COMPONENT = "gpuslice-controller"


@dataclass(frozen=True)
class Policies:
    """Which policy a device belongs to (its slice says) and what that policy says about overuse."""

    policy_of: Callable[[str, str], str | None]  # (pool, device) -> policy
    on_overuse: Callable[[str], str]  # policy -> "Report" | "Evict"


@dataclass
class _Eviction:
    done: bool = False
    told_blocked: bool = False
    failures: int = 0
    next_at: float = 0.0


@dataclass
class OveruseEnforcer:
    clock: Callable[[], float] = time.monotonic
    # Claim (namespace, name) -> the pods its marks name now, by UID.
    named: dict[tuple[str, str], dict[str, OverusingPod]] = field(default_factory=dict)
    evictions: dict[str, _Eviction] = field(default_factory=dict)  # pod UID -> where its eviction is

    async def claim_seen(self, kube: KubeClient, key: tuple[str, str], status: Mapping[str, Any] | None,
                         policies: Policies) -> None:
        """A claim came, changed or went (None): Events for pods newly named or no longer named, and
        the evictions now due."""
        if status is None and key not in self.named:
            return
        marked = status is not None and any(device_condition(d, CONDITION) for d in device_statuses(status, None))
        if not marked and key not in self.named:
            return  # the common case: a claim no agent ever marked
        before = self.named.pop(key, {})
        now = {p.uid: p for p in overusing_pods(key[0], key[1], status)} if status is not None else {}
        if now:
            self.named[key] = now
        reserved = reserved_pods(status) if status is not None else {}
        for uid, pod in now.items():
            if uid not in before or before[uid].since != pod.since:
                await self._event(kube, pod, "GpuMemoryOveruse", pod.message)
        for uid, pod in before.items():
            if uid in now or self._named(uid):
                continue
            self.evictions.pop(uid, None)
            if uid in reserved:  # still holds the claim: back within, not gone
                await self._event(kube, pod, "GpuMemoryOveruseEnded", self._ended(pod, status), kind="Normal")
        await self.act(kube, policies)

    def _named(self, uid: str) -> bool:
        return any(uid in pods for pods in self.named.values())

    @staticmethod
    def _ended(pod: OverusingPod, status: Mapping[str, Any] | None) -> str:
        """The agent's words where its condition speaks of this pod, else the controller's."""
        for entry in device_statuses(status or {}, None):
            for condition in entry["conditions"]:
                said = str(condition.get("message") or "")
                if condition.get("type") == CONDITION and said.startswith(f"pod {pod.ref} "):
                    return said
        return f"pod {pod.ref} is back within its GPU memory allocation on node {pod.node} (claim {pod.claim})"

    async def act(self, kube: KubeClient, policies: Policies, only: str | None = None) -> None:
        """Evict each pod the marks chose whose device's policy (``only`` that one) says Evict, when it
        is due. The others of the claim stay: the overuse ends once the chosen ones are gone."""
        for pods in list(self.named.values()):
            for pod in list(pods.values()):
                if not pod.evict:
                    continue
                policy = policies.policy_of(pod.node, pod.device)
                if policy is None or (only is not None and policy != only) or policies.on_overuse(policy) != "Evict":
                    continue
                state = self.evictions.setdefault(pod.uid, _Eviction())
                if not state.done and self.clock() >= state.next_at:
                    await self._evict(kube, pod, policy, state)

    async def _evict(self, kube: KubeClient, pod: OverusingPod, policy: str, state: _Eviction) -> None:
        path = pod_path(pod.namespace, pod.name)
        try:
            body = await kube.get(path)
            why_not = self._refused(pod, body)
            if why_not:
                state.done = True
                log.warning("not evicting a pod a node agent marked", pod=pod.ref, claim=pod.claim, reason=why_not)
                return
            await kube.create(eviction_path(pod.namespace, pod.name), {
                "apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod.name, "namespace": pod.namespace},
                "deleteOptions": {"preconditions": {"uid": pod.uid}}})
        except NotFound:
            state.done = True  # gone already
            return
        except (TooManyRequests, Forbidden, ServerError) as error:
            self._later(state)
            if not refused_by_disruption_budget(error):  # the server shedding load or failing, not a budget
                log.warning("could not evict an overusing pod; will try again", pod=pod.ref, policy=policy,
                            error=str(error))
                return
            log.warning("a PodDisruptionBudget holds the eviction of an overusing pod; will try again", pod=pod.ref,
                        policy=policy, error=error.message)
            OVERUSE_ACTIONS.labels(pod.node, policy, pod.namespace, "eviction_blocked").inc()
            if not state.told_blocked:
                state.told_blocked = True
                await self._event(kube, pod, "GpuMemoryOveruseEvictionBlocked", (
                    f"pod {pod.ref} uses more GPU memory than it was allocated and its policy {policy} says onOveruse:"
                    f" Evict, but the eviction was refused ({error.message}); a PodDisruptionBudget holds it;"
                    " gpuslice tries again"))
            return
        except KubeError as error:
            self._later(state)
            log.warning("could not evict an overusing pod; will try again", pod=pod.ref, policy=policy,
                        error=str(error))
            return
        state.done = True
        OVERUSE_ACTIONS.labels(pod.node, policy, pod.namespace, "evicted").inc()
        log.warning("evicted a pod that used more GPU memory than it was allocated", pod=pod.ref, node=pod.node,
                    policy=policy, claim=pod.claim)
        await self._event(kube, pod, "GpuMemoryOveruseEvicted", (
            f"pod {pod.ref} was evicted: it used more GPU memory than its claim {pod.claim} was allocated on node"
            f" {pod.node} (with the claim's other pods, if it shares it: the largest users go until the rest fit),"
            f" and its policy {policy} says onOveruse: Evict"))

    @staticmethod
    def _refused(pod: OverusingPod, body: Mapping[str, Any]) -> str:
        """Why this pod is not the one the mark may evict, or ''."""
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        if meta.get("uid") != pod.uid:
            return "another pod of that name now"
        if meta.get("deletionTimestamp"):
            return "already being deleted"
        if spec.get("nodeName") != pod.node:
            return f"it runs on {spec.get('nodeName') or 'no node'}, not on {pod.node}, where its claim is allocated"
        return ""

    def _later(self, state: _Eviction) -> None:
        state.failures += 1
        state.next_at = self.clock() + RETRY.after(state.failures)

    async def _event(self, kube: KubeClient, pod: OverusingPod, reason: str, message: str,
                     kind: str = "Warning") -> None:
        try:
            await create_event(kube, pod_ref(pod.namespace, pod.name, pod.uid), reason, message, kind=kind,
                               component=COMPONENT, key=(pod.uid, reason, pod.since))
        except KubeError as error:  # an Event is worth a log line, never a failed handler
            log.warning("could not post an Event on an overusing pod", pod=pod.ref, reason=reason, error=str(error))
