"""The controller's defragmenter: it carries every recorded move out, and in Auto mode starts them.

One Kopf daemon per policy (controller.handlers) ticks it: every second while the policy has a
move in flight (``controller.defrag_move``), else every two seconds, which is how soon a move that
``gpuslice defrag --apply`` recorded is taken up. Kopf runs only while this copy holds the leader
Lease, and every write goes through the leader's guarded client, so only the leader moves pods.

Auto mode (``spec.defragmentation.mode: Auto``) looks every ``--defrag-interval`` seconds, per
policy, for pods whose claim of the policy has waited ``minPendingSeconds``, plans for them with
the same planner as ``gpuslice defrag``, and starts the first plan that fits the hourly budget:
one GPU at a time per policy (no new move while one is in flight). A pod it cannot help is told
why once (an Event), and counted in ``gpuslice_defrag_plans_blocked_total`` by reason.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pydantic
import structlog

from gpuslice.api.policy import Defragmentation
from gpuslice.controller.defrag_metrics import BLOCKED, IN_FLIGHT
from gpuslice.controller.defrag_move import Mover, new_move, now_utc, start
from gpuslice.controller.events import post_object_event
from gpuslice.controller.settings import ControllerSettings
from gpuslice.kube.client import KubeClient, NotFound
from gpuslice.planning.node.defrag_taints import parse_time
from gpuslice.planning.reads.defrag import plan_defrag
from gpuslice.planning.reads.defrag_model import Plan, moves_in_flight
from gpuslice.reading.cluster import POLICIES, read_cluster

log = structlog.get_logger(__name__)
Body = Mapping[str, Any]
AUTO = "controller (Auto)"
BUSY_TICK = 1.0  # seconds between steps of a move in flight
IDLE_TICK = 2.0  # seconds between looks for a recorded move


class Defragmenter:
    def __init__(self, kube: KubeClient, settings: ControllerSettings) -> None:
        self.kube, self.settings = kube, settings
        self.mover = Mover(kube, settings.defrag_taint_wait)
        self.looked: dict[str, float] = {}  # policy -> when Auto last looked (monotonic)
        self.told: dict[str, str] = {}  # waiting pod UID -> what it was last told

    async def tick(self, body: Body) -> float:
        """One round for the policy ``body`` (Kopf's live view of it); seconds until the next."""
        name = str(body["metadata"]["name"])
        if moves_in_flight([body]):
            try:
                fresh = await self.kube.get(f"{POLICIES}/{name}")  # the body may lag our own writes
            except NotFound:
                return IDLE_TICK
            moves = moves_in_flight([fresh])
            IN_FLIGHT.labels(name).set(len(moves))
            for move in moves:
                await self.mover.step(fresh, move)
            return BUSY_TICK
        IN_FLIGHT.labels(name).set(0)
        await self.auto(body)
        return IDLE_TICK

    def forget(self, policy: str) -> None:
        self.looked.pop(policy, None)
        with contextlib.suppress(KeyError):
            IN_FLIGHT.remove(policy)

    async def auto(self, body: Body) -> None:
        name = str(body["metadata"]["name"])
        try:
            spec = Defragmentation.model_validate((body.get("spec") or {}).get("defragmentation") or {})
        except pydantic.ValidationError:
            return
        now = time.monotonic()
        if spec.mode != "Auto" or now - self.looked.get(name, -1e9) < self.settings.defrag_interval:
            return
        self.looked[name] = now
        reading = await read_cluster(self.kube, policy=name)
        moment = now_utc()
        aged = [w for w in reading.waiting if _waited(w.since, moment) >= spec.min_pending_seconds]
        if not aged:
            return
        others = [m for m in reading.cluster.in_flight if m not in moves_in_flight([body])]
        waiting = {w.pod.uid for w in reading.waiting}
        self.told = {uid: said for uid, said in self.told.items() if uid in waiting}  # only pods still waiting
        plans = plan_defrag(reading.cluster, aged)
        # Each look that had pods to help, and what the planner said of them: how a run that moved
        # little can be told apart from one that could not (NotNeeded: a device is free already).
        log.info("defragmentation looked", policy=name, waiting=len(reading.waiting), aged=len(aged),
                 verdicts=dict(Counter(p.verdict for p in plans)))
        for plan in plans:
            if plan.verdict in ("NotNeeded", "InFlight"):
                continue
            if not plan.ready:
                code = plan.verdict if plan.verdict in ("NoRoom", "Unsupported") else _first_blocker(plan)
                await self._tell(name, plan, code, f"gpuslice cannot free a GPU for this pod: {plan.message}"
                                 + _blockers(plan))
                continue
            move = new_move(plan, AUTO, moment, self.settings.defrag_timeout)
            refused = await start(self.kube, name, move, others, budget=spec.max_evictions_per_hour, now=moment)
            if refused is None:
                log.info("defragmentation move started", policy=name, move=move.id, pod=plan.pod,
                         gpu=move.gpu, node=move.node, evictions=[f"{v.namespace}/{v.name}" for v in move.evictions])
                return  # one GPU at a time
            await self._tell(name, plan, "Budget" if "maxEvictionsPerHour" in refused else "Busy",
                             f"gpuslice would free {plan.target.label if plan.target else 'a GPU'} for this pod by"
                             f" moving {len(plan.target.moves) if plan.target else 0} pods, but {refused}")

    async def _tell(self, policy: str, plan: Plan, code: str, message: str) -> None:
        """Once per pod and message: an Event on the waiting pod, and the blocked count."""
        if self.told.get(plan.pod_uid) == message:
            return
        self.told[plan.pod_uid] = message
        BLOCKED.labels(policy, code).inc()
        namespace, _, name = plan.pod.partition("/")
        await post_object_event(self.kube, namespace, {"apiVersion": "v1", "kind": "Pod", "name": name,
                                                       "namespace": namespace, "uid": plan.pod_uid},
                                "Normal", "DefragmentationBlocked", message)


def _waited(since: str, now: datetime.datetime) -> float:
    moment = parse_time(since)
    return (now - moment).total_seconds() if moment is not None else 0.0


def _first_blocker(plan: Plan) -> str:
    return next((b.code for o in plan.alternatives for b in o.blockers), "Blocked")


def _blockers(plan: Plan) -> str:
    parts = [f"{o.label}: {'; '.join(b.message for b in o.blockers)}" for o in plan.alternatives if o.blockers]
    return (" (" + " | ".join(parts[:4]) + ")") if parts else ""

