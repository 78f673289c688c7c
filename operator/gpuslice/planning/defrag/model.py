"""The defragmenter's plans, and the pods they are for (pure): what ``gpuslice defrag`` prints
and applies, ``gpuslice why`` quotes, and the controller's Auto mode carries out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import pydantic

from gpuslice.api.status import DefragMove
from gpuslice.jsontypes import Body
from gpuslice.planning.defrag.facts import Blocker, ClaimFacts, DisruptionBudget, PodFacts
from gpuslice.planning.devices import gpu_tag
from gpuslice.planning.reads.allocatable import admission
from gpuslice.planning.reads.node_fit import NodeFacts
from gpuslice.planning.reads.pending import Finding, Request, class_owner
from gpuslice.planning.reads.published import Pool


@dataclass(frozen=True)
class Waiting:
    """A pod whose claim of a gpuslice device is not allocated."""

    pod: PodFacts
    claim: ClaimFacts
    policy: str
    kind: str
    device_class: str
    problem: str = ""  # why it is not planned for (several devices asked, its claim would be refused, ...)
    code: str = ""  # the problem's reason, for the metric: Claims, OverMemory, NotAdmitted, Selectors, ...
    memory_left: int | None = None  # a maxMemory tenant: what its ledger has room for; None: no maxMemory

    @property
    def since(self) -> str:
        return self.claim.created or self.pod.created


@dataclass(frozen=True)
class Move:
    """A pod to evict, and why it is one of the fewest."""

    pod: str  # namespace/name
    uid: str
    owner: str  # "ReplicaSet web-5d8f" (what makes it again)
    devices: tuple[str, ...]  # its devices on the GPU being freed
    memory: int  # what they hold of the GPU
    to: str = ""  # where its replacement fits, e.g. "gpu-node-2 GPU 1"


@dataclass(frozen=True)
class GpuOption:
    """One GPU that could be freed: the moves that would do it, or what stands in the way."""

    node: str
    index: int
    uuid: str
    device: str = ""  # the device the waiting pod would get
    moves: tuple[Move, ...] = ()
    blockers: tuple[Blocker, ...] = ()
    exact: bool = True  # False: the search ran out of budget; the moves are the largest first

    @property
    def label(self) -> str:
        return f"{self.node} GPU {self.index}"

    @property
    def tag(self) -> str:
        return gpu_tag(self.uuid)

    @property
    def memory_moved(self) -> int:
        return sum(m.memory for m in self.moves)


@dataclass(frozen=True)
class Plan:
    pod: str
    pod_uid: str
    claim: str
    claim_uid: str
    policy: str
    kind: str
    since: str
    verdict: str  # Ready, NotNeeded, NoRoom, Blocked, InFlight, Unsupported
    message: str
    target: GpuOption | None = None
    alternatives: tuple[GpuOption, ...] = ()
    reason: str = ""  # Unsupported: why, in a word (Claims, OverMemory, NotAdmitted, Selectors, NodeFit, ...)

    @property
    def ready(self) -> bool:
        return self.verdict == "Ready" and self.target is not None


@dataclass(frozen=True)
class Cluster:
    """Everything the planner reads, as the API server holds it."""

    pools: Sequence[Pool]
    claims: Sequence[ClaimFacts]
    pods: Sequence[PodFacts]
    budgets: Sequence[DisruptionBudget] = ()
    tenants: Mapping[str, frozenset[str]] = field(default_factory=dict)  # policy -> tenant namespaces
    opted_out: frozenset[str] = frozenset()  # namespaces that carry gpuslice.dev/defrag=false
    nodes: Mapping[str, NodeFacts] = field(default_factory=dict)
    in_flight: Sequence[DefragMove] = ()


def waiting_pods(pods: Sequence[PodFacts], claims: Sequence[ClaimFacts], policies: Sequence[Body],
                 namespace_uids: Mapping[str, str] | None = None,
                 ledgers: Mapping[tuple[str, str], Body] | None = None) -> list[Waiting]:
    """Pods not yet on a node whose claim of a gpuslice DeviceClass is not allocated. A claim the
    defragmenter cannot plan for (several devices, all of a kind, admin access, several gpuslice
    requests), or that would not be allocated once a GPU is free (``planning.reads.allocatable``:
    judged with ``namespace_uids`` by name and the maxMemory ledgers by (policy, namespace); None:
    they could not be read), or whose selectors it cannot judge, or whose pod kube-scheduler did not
    turn away for devices (``planning.reads.scheduler_said``), is listed with the reason."""
    by_ref = {c.ref: c for c in claims}
    bodies = {str(b["metadata"]["name"]): b for b in policies}
    found = []
    for pod in pods:
        if pod.node or pod.deleting or pod.phase not in ("", "Pending"):
            continue
        for name in pod.claims.values():
            claim = by_ref.get(f"{pod.namespace}/{name}")
            if claim is None or claim.allocated:
                continue
            ours = [(r, owner) for r in claim.requests if (owner := class_owner(r.device_class, policies))]
            if not ours:
                continue
            request, (policy, kind) = ours[0]
            problem = ""
            if len(ours) > 1:
                problem = (f"claim {claim.ref} asks for {len(ours)} gpuslice devices (or a list of alternatives):"
                           " gpuslice defrag frees room for one device")
            elif request.count != 1 or request.all_devices:
                problem = f"claim {claim.ref} asks for more than one device: gpuslice defrag frees room for one"
            elif request.admin:
                problem = f"claim {claim.ref} asks for admin access, which takes no device from anyone"
            waiting = Waiting(pod, claim, policy, kind, request.device_class, problem, "Claims" if problem else "")
            if not problem:
                waiting = _judged(waiting, request, bodies[policy], namespace_uids or {}, ledgers)
            found.append(waiting)
    return found


def _judged(waiting: Waiting, request: Request, body: Body, namespace_uids: Mapping[str, str],
            ledgers: Mapping[tuple[str, str], Body] | None) -> Waiting:
    """``waiting`` with why no GPU is freed for it when its claim would be refused at allocation,
    or narrows its class in ways the planner cannot judge; else with its maxMemory room."""
    ns, claim = waiting.pod.namespace, waiting.claim
    verdict = admission(request, body, ns, namespace_uids.get(ns, ""), claim.created,
                        (ledgers or {}).get((waiting.policy, ns)), ledgers is not None)
    if verdict.refused is not None:
        return replace(waiting, problem=f"its claim {claim.ref} would not be allocated once a GPU is free:"
                                        f" {verdict.refused.message}", code=verdict.refused.code)
    if claim.selectors:
        return replace(waiting, problem=f"its claim {claim.ref} narrows {request.device_class} with CEL selectors"
                                        " (spec.devices.requests[].selectors), which gpuslice does not evaluate: it"
                                        " cannot tell that the device of a GPU it frees would match them",
                       code="Selectors")
    if (said := waiting.pod.scheduler.not_for_devices()) is not None:
        code, why = said
        return replace(waiting, problem=f"a free GPU would not get {waiting.pod.ref} placed: {why}", code=code)
    return replace(waiting, memory_left=verdict.room.left if verdict.room is not None else None)


def moves_in_flight(policies: Iterable[Body]) -> list[DefragMove]:
    """The GPUs being freed, as the policies' status records them (a record that does not parse is skipped)."""
    found = []
    for body in policies:
        for move in ((body.get("status") or {}).get("defragmentation") or {}).get("inFlight") or []:
            try:
                found.append(DefragMove.model_validate(move))
            except pydantic.ValidationError:
                continue
    return found


def defrag_finding(plan: Plan) -> Finding | None:
    """What ``gpuslice why`` says about moving pods for the pod it diagnoses."""
    target = plan.target
    if plan.ready and target is not None:
        moves = ", ".join(m.pod for m in target.moves)
        return Finding("Defragmentation", f"Moving {len(target.moves)} pod{'s' if len(target.moves) != 1 else ''}"
                                          f" ({moves}) would free {target.label} for it, the fewest moves of any GPU:"
                                          f" gpuslice defrag --apply {plan.pod} does that (or the policy's"
                                          " spec.defragmentation.mode: Auto, once it has waited minPendingSeconds).",
                       blocking=False)
    if plan.verdict == "InFlight":
        return Finding("Defragmentation", f"gpuslice is freeing a GPU for it now: {plan.message}.", blocking=False)
    if plan.verdict in ("Blocked", "NoRoom", "Unsupported"):
        why = plan.message
        if plan.verdict == "Blocked":
            why = "; ".join(f"{o.label}: {o.blockers[0].message}" for o in plan.alternatives[:4] if o.blockers)
        return Finding("Defragmentation", f"Moving pods cannot free a GPU for it: {why}.", blocking=False)
    return None
