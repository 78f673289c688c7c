"""What the defragmenter needs to know about pods, claims and disruption budgets, typed (pure).

Which pods may be moved to free a GPU is decided here, once, for ``gpuslice defrag``, the
controller's Auto mode and ``gpuslice why`` alike. A pod is *movable* only if evicting it gives
its device back and something will make it again:

- a controller that replaces it owns it: a ReplicaSet (Deployments), a StatefulSet or a
  ReplicationController. Never a bare pod (nothing makes it again), a mirror pod (the kubelet's
  static pod: eviction does not remove it), a DaemonSet's pod (its replacement comes back to the
  same node), or a Job's: evicting a Job's pod throws its work away and, unless the Job has a pod
  failure policy that ignores disruptions, counts against its ``backoffLimit``. A pod of any other
  owner (a custom controller) is not moved either: gpuslice cannot tell that it will be replaced;
- its gpuslice claims were made for it (from a template, or by the scheduler for extended
  resources): a standalone ResourceClaim that pods share keeps its device while any of them uses
  it, and the replacement asks for the same claim;
- neither the pod nor its namespace carries ``gpuslice.dev/defrag: "false"`` (label or annotation);
- its namespace is a tenant of the policy whose GPU is being freed;
- it is not already terminating, and no PodDisruptionBudget that selects it allows no disruption
  (nor do two select it: the Eviction API refuses such a pod outright, with a 500).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuslice.dra.names import DEFRAG_OPT_OUT
from gpuslice.dra.wire import admin_access, is_allocated, reserved_for, status_results
from gpuslice.jsontypes import Body
from gpuslice.planning.reads.node_fit import Placement
from gpuslice.planning.reads.pending import Request, claim_requests, pod_claim_names
from gpuslice.planning.reads.scheduler_said import SchedulerSaid

MOVABLE_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController"})
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def _opted_out(meta: Body) -> bool:
    return any(str((meta.get(where) or {}).get(DEFRAG_OPT_OUT, "")).lower() == "false"
               for where in ("labels", "annotations"))


def _controller(meta: Body) -> tuple[str, str, str] | None:
    """(kind, name, uid) of the owner reference marked controller."""
    for owner in meta.get("ownerReferences") or []:
        if owner.get("controller"):
            return str(owner.get("kind", "")), str(owner.get("name", "")), str(owner.get("uid", ""))
    return None


@dataclass(frozen=True)
class PodFacts:
    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    owner: tuple[str, str] | None = None  # (kind, name) of the controller
    mirror: bool = False
    opted_out: bool = False
    node: str = ""
    phase: str = ""
    deleting: bool = False
    created: str = ""
    placement: Placement = field(default_factory=Placement)  # what it says about nodes
    claims: Mapping[str, str] = field(default_factory=dict)  # the pod's claim entry -> the claim it got
    scheduler: SchedulerSaid = field(default_factory=SchedulerSaid)  # its gates, and why it is not placed

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_body(cls, body: Body) -> PodFacts:
        meta, spec, status = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
        owner = _controller(meta)
        return cls(
            str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")),
            dict(meta.get("labels") or {}), (owner[0], owner[1]) if owner else None,
            MIRROR_ANNOTATION in (meta.get("annotations") or {}), _opted_out(meta), str(spec.get("nodeName") or ""),
            str(status.get("phase", "")), bool(meta.get("deletionTimestamp")), str(meta.get("creationTimestamp", "")),
            Placement.from_spec(spec), pod_claim_names(body), SchedulerSaid.from_body(body),
        )


@dataclass(frozen=True)
class ClaimFacts:
    """A ResourceClaim: who made it for which pod, who uses it, and gpuslice's devices in it."""

    namespace: str
    name: str
    uid: str
    owner_pod: str | None = None  # UID of the pod it was made for (its controller owner is that pod)
    reserved: tuple[tuple[str, str], ...] = ()  # (pod name, pod UID) it is reserved for
    results: tuple[tuple[str, str, bool], ...] = ()  # (pool, device, adminAccess) of driver gpu.gpuslice.dev
    requests: tuple[Request, ...] = ()
    allocated: bool = False
    created: str = ""

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def selectors(self) -> tuple[str, ...]:
        """The CEL selectors of its requests, which narrow their classes to some devices."""
        return tuple(e for r in self.requests for e in r.selectors)

    @classmethod
    def from_body(cls, body: Body) -> ClaimFacts:
        meta, status = body.get("metadata") or {}, body.get("status") or {}
        owner = _controller(meta)
        results = tuple((r["pool"], r["device"], admin_access(r)) for r in status_results(status))
        reserved = tuple((r["name"], r["uid"]) for r in reserved_for(status) if r["resource"] == "pods")
        name = str(meta.get("name", ""))
        return cls(str(meta.get("namespace", "")), name, str(meta.get("uid", "")),
                   owner[2] if owner and owner[0] == "Pod" else None, reserved, results,
                   tuple(claim_requests(body.get("spec") or {}, name)), is_allocated(body),
                   str(meta.get("creationTimestamp", "")))


def _selects(selector: Body | None, labels: Mapping[str, str]) -> bool:
    """A policy/v1 label selector: a missing one selects nothing, an empty one every pod."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for term in selector.get("matchExpressions") or []:
        key, values, present = term.get("key"), term.get("values") or [], term.get("key") in labels
        ok = {"In": present and labels.get(key) in values, "NotIn": not present or labels.get(key) not in values,
              "Exists": present, "DoesNotExist": not present}.get(str(term.get("operator")), False)
        if not ok:
            return False
    return True


@dataclass(frozen=True)
class DisruptionBudget:
    namespace: str
    name: str
    selector: Mapping[str, Any] | None
    allowed: int  # disruptions allowed now (0 until the disruption controller has looked at it)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, pod: PodFacts) -> bool:
        return pod.namespace == self.namespace and _selects(self.selector, pod.labels)

    @classmethod
    def from_body(cls, body: Body) -> DisruptionBudget:
        meta, status = body.get("metadata") or {}, body.get("status") or {}
        current = int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
        return cls(str(meta.get("namespace", "")), str(meta.get("name", "")),
                   (body.get("spec") or {}).get("selector"),
                   int(status.get("disruptionsAllowed") or 0) if current else 0)


@dataclass(frozen=True)
class Blocker:
    """Why one pod (or claim) on a GPU cannot be moved, or why a set of moves cannot be made."""

    code: str  # Bare, Mirror, DaemonSet, Job, Owner, OptedOut, NotATenant, StandaloneClaim, NoPod,
    # Terminating, Disruption, NowhereToGo, Tainted
    subject: str  # namespace/pod (or namespace/claim)
    message: str


def pod_blocker(pod: PodFacts, tenants: Iterable[str], opted_out_namespaces: Iterable[str],
                budgets: Sequence[DisruptionBudget]) -> Blocker | None:
    """None when ``pod`` may be moved (module docstring); else why not."""
    ref = pod.ref
    if pod.mirror:
        return Blocker("Mirror", ref, f"{ref} is a static (mirror) pod: eviction cannot move it")
    if pod.owner is None:
        return Blocker("Bare", ref, f"{ref} is a bare pod: nothing would make it again")
    kind, name = pod.owner
    if kind == "DaemonSet":
        return Blocker("DaemonSet", ref, f"{ref} belongs to DaemonSet {name}: it would come back to the same node")
    if kind == "Job":
        return Blocker("Job", ref, f"{ref} belongs to Job {name}: moving it would throw its work away and count"
                                   " against the Job's backoffLimit")
    if kind not in MOVABLE_OWNERS:
        return Blocker("Owner", ref, f"{ref} belongs to {kind} {name}: gpuslice cannot tell that it would be"
                                     " replaced (only ReplicaSet, StatefulSet and ReplicationController pods move)")
    if pod.namespace not in set(tenants):
        return Blocker("NotATenant", ref, f"{ref} is in namespace {pod.namespace}, not a tenant of the policy")
    if pod.opted_out:
        return Blocker("OptedOut", ref, f"{ref} carries {DEFRAG_OPT_OUT}=false")
    if pod.namespace in set(opted_out_namespaces):
        return Blocker("OptedOut", ref, f"namespace {pod.namespace} carries {DEFRAG_OPT_OUT}=false")
    if pod.deleting:
        return Blocker("Terminating", ref, f"{ref} is terminating already: its device comes back when it is gone")
    selecting = [b for b in budgets if b.selects(pod)]
    if len(selecting) > 1:
        return Blocker("Disruption", ref, f"PodDisruptionBudgets {' and '.join(b.ref for b in selecting)} both select"
                                          f" {ref}: the Eviction API evicts no pod that two budgets select")
    for budget in selecting:
        if budget.allowed <= 0:
            return Blocker("Disruption", ref, f"PodDisruptionBudget {budget.ref} allows no disruption of {ref} now")
    return None


def opted_out_namespaces(namespaces: Iterable[Body]) -> frozenset[str]:
    return frozenset(str((n.get("metadata") or {}).get("name")) for n in namespaces
                     if _opted_out(n.get("metadata") or {}))


def budget_excess(pods: Iterable[PodFacts], budgets: Sequence[DisruptionBudget]) -> Blocker | None:
    """A budget that the moves of ``pods`` together would exceed (each alone it allows)."""
    chosen = list(pods)
    for budget in budgets:
        covered = [p for p in chosen if budget.selects(p)]
        if len(covered) > budget.allowed:
            return Blocker("Disruption", budget.ref, f"PodDisruptionBudget {budget.ref} allows {budget.allowed}"
                                                     f" disruptions now, and {len(covered)} of these pods are its:"
                                                     f" {', '.join(p.ref for p in covered)}")
    return None
