"""The controller's defragmenter: it carries every recorded move out, and in Auto mode starts them.

One Kopf daemon per policy (controller.handlers) ticks it: every second while the policy has a
move in flight (``controller.defrag.move``), else every two seconds, which is how soon a move that
``gpuslice defrag --apply`` recorded is taken up. Kopf runs only while this copy holds the leader
Lease, and every write goes through the leader's guarded client, so only the leader moves pods.

Auto mode (``spec.defragmentation.mode: Auto``) looks at most every ``--defrag-interval`` seconds,
per policy, for pods whose claim of the policy has waited ``minPendingSeconds``: only when the
controller's watch of pods not yet on a node holds one in a tenant namespace of the policy that
waited that long, and something changed since the last look (another such pod, what kube-scheduler
said of one, a claim or slice event, the policy's defragmentation settings, e.g. a larger budget;
or an hour went by, when a paused claim may be planned for again), so a fleet where nothing waits
is never read. It plans for them with
the same planner as ``gpuslice defrag``, and starts the first plan that fits the hourly budget:
one GPU at a time per policy (no new move while one is in flight). A pod it cannot help is told
why once (an Event), and counted in ``gpuslice_defrag_plans_blocked_total`` by reason. A claim a
move failed for is not planned for again for FAILED_PAUSE: whatever kept it from its GPU may well
keep it again, and each try evicts someone.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections import Counter
from collections.abc import Callable, Iterable

import pydantic
import structlog

from gpuslice.api.policy import Defragmentation
from gpuslice.api.status import DefragMove
from gpuslice.controller.defrag.metrics import BLOCKED, IN_FLIGHT
from gpuslice.controller.defrag.move import AUTO, Mover, new_move, now_utc, start
from gpuslice.controller.defrag.read import read_cluster, tenants_of
from gpuslice.controller.events import post_object_event
from gpuslice.controller.settings import ControllerSettings
from gpuslice.coordinates import policy_path
from gpuslice.dra.names import CONTROLLER_NAMESPACE
from gpuslice.jsontypes import Body
from gpuslice.kube.client import KubeClient, NotFound
from gpuslice.planning.defrag.model import Plan, Waiting, moves_in_flight
from gpuslice.planning.defrag.node_taints import parse_time
from gpuslice.planning.defrag.planner import plan_defrag
from gpuslice.planning.reads.scheduler_said import SchedulerSaid

log = structlog.get_logger(__name__)
FAILED_PAUSE = 3600.0  # seconds Auto plans no move for a claim after a move for it failed
BUSY_TICK = 1.0  # seconds between steps of a move in flight
IDLE_TICK = 2.0  # seconds between looks for a recorded move


class Defragmenter:
    def __init__(self, kube: KubeClient, settings: ControllerSettings,
                 clock: Callable[[], float] = time.monotonic, version: Callable[[], int] = lambda: 0,
                 home: str = CONTROLLER_NAMESPACE) -> None:
        """``version``: a number that changes with every event of our slices or of a claim."""
        self.kube, self.settings, self.clock, self.version, self.home = kube, settings, clock, version, home
        self.mover = Mover(kube, settings.defrag_taint_wait, self._failed, settings.defrag_timeout, home)
        self.looked: dict[str, float] = {}  # policy -> when Auto last looked (clock)
        # policy -> (version, the policy's defragmentation spec, pods aged) at that look
        self.seen: dict[str, tuple[int, Defragmentation, frozenset[tuple[str, SchedulerSaid]]]] = {}
        self.told: dict[str, str] = {}  # waiting pod UID -> what it was last told
        self.failures: dict[str, float] = {}  # claim UID -> when a move for it failed (clock)

    def _failed(self, move: DefragMove) -> None:
        """A move for ``move.claim`` failed: Auto frees no GPU for that claim for FAILED_PAUSE. (Kept by
        this copy only: a new leader may try once more, its evictions counted in the hour's budget.)"""
        self.failures[move.claim.uid] = self.clock()

    def _paused(self, waiting: Waiting, now: float) -> float | None:
        """Seconds left of the pause after a failed move for its claim; None when there is none."""
        failed = self.failures.get(waiting.claim.uid)
        if failed is None or now - failed >= FAILED_PAUSE:
            return None
        return FAILED_PAUSE - (now - failed)

    async def tick(self, body: Body, pending: Iterable[Body] = ()) -> float:
        """One round for the policy ``body`` (Kopf's live view of it); seconds until the next.
        ``pending``: the pods not yet on a node, as the controller's watch holds them."""
        name = str(body["metadata"]["name"])
        if moves_in_flight([body]):
            try:
                fresh = await self.kube.get(policy_path(name))  # the body may lag our own writes
            except NotFound:
                return IDLE_TICK
            moves = moves_in_flight([fresh])
            IN_FLIGHT.labels(name).set(len(moves))
            for move in moves:
                await self.mover.step(fresh, move)
            return BUSY_TICK
        IN_FLIGHT.labels(name).set(0)
        await self.auto(body, pending)
        return IDLE_TICK

    def forget(self, policy: str) -> None:
        self.looked.pop(policy, None)
        self.seen.pop(policy, None)
        with contextlib.suppress(KeyError):
            IN_FLIGHT.remove(policy)

    async def auto(self, body: Body, pending: Iterable[Body] = ()) -> None:
        name = str(body["metadata"]["name"])
        try:
            spec = Defragmentation.model_validate((body.get("spec") or {}).get("defragmentation") or {})
        except pydantic.ValidationError:
            return
        now = self.clock()
        last = self.looked.get(name)
        if spec.mode != "Auto" or (last is not None and now - last < self.settings.defrag_interval):
            return
        long_waits = _aged(pending, tenants_of(body), spec.min_pending_seconds, now_utc())
        seen = (self.version(), spec, long_waits)
        if not long_waits or (seen == self.seen.get(name) and last is not None and now - last < FAILED_PAUSE):
            return  # nothing waits long enough, or nothing changed since a look that helped none
        self.looked[name], self.seen[name] = now, seen
        self.failures = {uid: at for uid, at in self.failures.items() if now - at < FAILED_PAUSE}
        reading = await read_cluster(self.kube, policy=name, home=self.home)
        moment = now_utc()
        aged = [w for w in reading.waiting if _waited(w.since, moment) >= spec.min_pending_seconds]
        if not aged:
            return
        others = [m for m in reading.cluster.in_flight if m not in moves_in_flight([body])]
        waiting = {w.pod.uid for w in reading.waiting}
        self.told = {uid: said for uid, said in self.told.items() if uid in waiting}  # only pods still waiting
        for w in aged:
            left = self._paused(w, now)
            if left is not None:
                await self._tell(name, w.pod.ref, w.pod.uid, "Failed", f"a move to free a GPU for this pod failed"
                                 f" (see its DefragmentationFailed Event): gpuslice frees none for its claim"
                                 f" {w.claim.ref} again for {FAILED_PAUSE / 60:.0f} minutes after that")
        plans = plan_defrag(reading.cluster, [w for w in aged if self._paused(w, now) is None])
        # Each look that had pods to help, and what the planner said of them: how a run that moved
        # little can be told apart from one that could not (NotNeeded: a device is free already).
        log.info("defragmentation looked", policy=name, waiting=len(reading.waiting), aged=len(aged),
                 verdicts=dict(Counter(p.verdict for p in plans)))
        for plan in plans:
            if plan.verdict in ("NotNeeded", "InFlight"):
                continue
            if plan.reason == "NotTried":
                continue  # the scheduler's first try is due: told nothing until it has said why it waits
            if not plan.ready:
                code = (plan.reason or plan.verdict if plan.verdict in ("NoRoom", "Unsupported")
                        else _first_blocker(plan))
                await self._tell(name, plan.pod, plan.pod_uid, code, f"gpuslice cannot free a GPU for this pod:"
                                 f" {plan.message}" + _blockers(plan))
                continue
            move = new_move(plan, AUTO, moment, self.settings.defrag_timeout, phase="Tainting")  # judged here
            refused = await start(self.kube, name, move, others, budget=spec.max_evictions_per_hour, now=moment)
            if refused is None:
                log.info("defragmentation move started", policy=name, move=move.id, pod=plan.pod,
                         gpu=move.gpu, node=move.node, evictions=[f"{v.namespace}/{v.name}" for v in move.evictions])
                return  # one GPU at a time
            await self._tell(name, plan.pod, plan.pod_uid, "Budget" if "maxEvictionsPerHour" in refused else "Busy",
                             f"gpuslice would free {plan.target.label if plan.target else 'a GPU'} for this pod by"
                             f" moving {len(plan.target.moves) if plan.target else 0} pods, but {refused}")

    async def _tell(self, policy: str, pod: str, pod_uid: str, code: str, message: str) -> None:
        """Once per pod and message: an Event on the waiting pod ``pod`` (namespace/name), and the
        blocked count."""
        if self.told.get(pod_uid) == message:
            return
        self.told[pod_uid] = message
        BLOCKED.labels(policy, code).inc()
        namespace, _, name = pod.partition("/")
        await post_object_event(self.kube, namespace, {"apiVersion": "v1", "kind": "Pod", "name": name,
                                                       "namespace": namespace, "uid": pod_uid},
                                "Normal", "DefragmentationBlocked", message)


def _aged(pods: Iterable[Body], namespaces: frozenset[str], seconds: float,
          now: datetime.datetime) -> frozenset[tuple[str, SchedulerSaid]]:
    """The pods in ``namespaces`` not yet on a node for at least ``seconds`` (their claims cannot have
    waited longer than they did), by UID, each with what the scheduler last said of it: a pod it
    turns away for devices after a look that found it not yet tried or gated is a change."""
    return frozenset((str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"),
                      SchedulerSaid.from_body(pod))
                     for pod in pods if (meta := pod.get("metadata") or {}).get("namespace") in namespaces
                     and not meta.get("deletionTimestamp")
                     and _waited(str(meta.get("creationTimestamp") or ""), now) >= seconds)


def _waited(since: str, now: datetime.datetime) -> float:
    moment = parse_time(since)
    return (now - moment).total_seconds() if moment is not None else 0.0


def _first_blocker(plan: Plan) -> str:
    return next((b.code for o in plan.alternatives for b in o.blockers), "Blocked")


def _blockers(plan: Plan) -> str:
    parts = [f"{o.label}: {'; '.join(b.message for b in o.blockers)}" for o in plan.alternatives if o.blockers]
    return (" (" + " | ".join(parts[:4]) + ")") if parts else ""

