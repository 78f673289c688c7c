"""Carry a defragmentation move out, one step at a time, from what the policy's status records.

A move is recorded in ``status.defragmentation.inFlight`` of the waiting claim's policy before
anything happens (requested by ``gpuslice defrag --apply``, or by the controller in Auto mode), and
the controller (while it holds the leader Lease) carries every recorded move out. Each step reads
the world again and does the next thing:

0. a move someone else requested (phase ``Requested``, the only one they may add) counts for
   nothing until the controller has judged it: it plans again, and takes the move up (phase
   ``Tainting``, started now, its expiry bounded by ``--defrag-timeout``) only if its own plan for
   that claim is that very move (``planning.defrag.request``); else the record goes, marked
   Failed with the reason, and a ``DefragmentationRefused`` Event on the policy says why;
1. the waiting claim allocated: done, the record goes (the taint lifts with it); the claim gone,
   or the move past its expiry: given up, the same way;
2. until the node agent has tainted the GPU's other devices (``gpuslice.dev/defrag``) nothing is
   evicted, so the replacements cannot land on the GPU; an agent that does not within
   ``--defrag-taint-wait`` gives the move up, having evicted nothing;
3. each pod the record names is evicted through the Eviction API, with its UID as a precondition
   (a StatefulSet's replacement of the same name is never evicted), only if it still may be moved
   (owner, tenant, opt-out: a record can be written by hand) and still holds a device of the GPU.
   Disruption budgets are the Eviction API's to judge, at that moment: its refusal (429, or the 500
   for a pod two budgets select) ends the move, as does a 403. A pod already gone or terminating
   counts as moved and is not evicted again. Each eviction is recorded in ``evicted`` right after
   it is sent.

The record is the whole state: a controller killed at any point resumes from it, and since every
eviction is bound to a UID the record names, nothing is evicted twice and nothing it does not name
is ever evicted. A record that can no longer be carried out is removed, which lifts the taint.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import structlog

from gpuslice.api.status import DefragmentationStatus, DefragMove, DefragOutcome, ObjectRef
from gpuslice.backoff import Backoff
from gpuslice.controller.defrag.metrics import EVICTIONS, FAILED, FREED, WASTED, who
from gpuslice.controller.defrag.read import Reading, read_cluster, tenants_of
from gpuslice.controller.events import post_event, post_object_event
from gpuslice.coordinates import (
    SLICES,
    claim_path,
    eviction_path,
    namespace_path,
    pod_path,
    policy_path,
    policy_status_path,
)
from gpuslice.dra.names import CONTROLLER_NAMESPACE, DEFRAG_TAINT_KEY, DRIVER, short_hash
from gpuslice.dra.wire import allocation_results, device_gpu, devices_of, is_allocated, newest_generation
from gpuslice.jsontypes import Body
from gpuslice.kube.client import (
    NO_RETRY,
    Conflict,
    Forbidden,
    KubeClient,
    KubeError,
    NotFound,
    ServerError,
    TooManyRequests,
    refused_by_disruption_budget,
)
from gpuslice.observability.failpoints import failpoint
from gpuslice.planning.defrag.facts import PodFacts, opted_out_namespaces, pod_blocker
from gpuslice.planning.defrag.model import Plan
from gpuslice.planning.defrag.node_taints import REQUESTED, parse_time
from gpuslice.planning.defrag.request import refusal as request_refusal

log = structlog.get_logger(__name__)
WRITE_TRIES = 8
AUTO = "controller (Auto)"  # who records the moves of Auto mode
READING_FOR = 1.0  # seconds one reading of the cluster judges requested moves for


CONFLICT_BACKOFF = Backoff(0.1, 2.0)  # another writer of the policy's status: read again after a moment


def stamp(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_utc() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


def new_move(plan: Plan, by: str, now: datetime.datetime, timeout: float,
             phase: Literal["Requested", "Tainting"] = REQUESTED) -> DefragMove:
    """The move ``plan`` makes: ``Requested`` by hand, ``Tainting`` when the controller records its own."""
    assert plan.target is not None
    ns, _, pod = plan.pod.partition("/")
    claim = plan.claim.partition("/")[2]
    target = plan.target
    return DefragMove(
        id=f"d-{short_hash(plan.claim_uid, stamp(now), length=10)}", node=target.node, gpu=target.uuid,
        gpu_tag=target.tag, gpu_index=target.index, device=target.device,
        claim=ObjectRef(namespace=ns, name=claim, uid=plan.claim_uid), pod=ObjectRef(namespace=ns, name=pod,
                                                                                     uid=plan.pod_uid),
        evictions=[ObjectRef(namespace=m.pod.partition("/")[0], name=m.pod.partition("/")[2], uid=m.uid)
                   for m in target.moves],
        by=by, phase=phase, started=stamp(now), expires=stamp(now + datetime.timedelta(seconds=timeout)))


def describe(move: DefragMove) -> str:
    return f"GPU {move.gpu_index} of node {move.node}"


async def update_defrag(kube: KubeClient, policy: str,
                        change: Callable[[DefragmentationStatus], DefragmentationStatus | str]) -> str | None:
    """Read, change and write ``status.defragmentation`` of ``policy`` with its resourceVersion as the
    precondition, again on a conflict (the status refresh, another move). ``change`` may refuse with a
    reason (returned; nothing written). None once written."""
    for attempt in range(WRITE_TRIES):
        body = await kube.get(policy_path(policy))
        current = DefragmentationStatus.model_validate((body.get("status") or {}).get("defragmentation") or {})
        changed = change(current)
        if isinstance(changed, str):
            return changed
        if changed == current:
            return None
        patch = {"metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                 "status": {"defragmentation": changed.model_dump(by_alias=True, exclude_none=True, mode="json")}}
        try:
            await kube.merge_patch(policy_status_path(policy), patch)
            return None
        except Conflict:
            await asyncio.sleep(CONFLICT_BACKOFF.after(attempt + 1))
    raise KubeError(409, "Conflict", f"status.defragmentation of GpuSlicePolicy {policy} kept changing", None)


def _pruned(times: list[str], now: datetime.datetime) -> list[str]:
    hour_ago = now - datetime.timedelta(hours=1)
    return [t for t in times if (moment := parse_time(t)) is not None and moment > hour_ago]


async def start(kube: KubeClient, policy: str, move: DefragMove, others: list[DefragMove],
                budget: int | None = None, now: datetime.datetime | None = None) -> str | None:
    """Record ``move`` (nothing is evicted before): None, or why not. ``others``: moves recorded in
    other policies (a GPU several memory policies share is freed for one pod at a time). With
    ``budget`` (Auto: maxEvictionsPerHour), the move's evictions are counted against the last hour's
    first, and recorded with it, so that no restart makes room for more."""
    now = now or now_utc()
    busy = {(m.node, m.gpu) for m in others}

    def add(current: DefragmentationStatus) -> DefragmentationStatus | str:
        mine = list(current.in_flight)
        if (move.node, move.gpu) in busy | {(m.node, m.gpu) for m in mine}:
            return f"{describe(move)} is being freed already"
        if any(m.claim.uid == move.claim.uid for m in mine):
            return f"a GPU is being freed for {move.pod.namespace}/{move.pod.name} already"
        if budget is None:  # by hand: the move only (gpuslice-policy-status lets no one else touch the budget)
            return current.model_copy(update={"in_flight": [*mine, move]})
        times = _pruned(list(current.evictions), now)
        if len(times) + len(move.evictions) > budget:
            return (f"maxEvictionsPerHour is {budget} and {len(times)} were sent in the last hour:"
                    f" {len(move.evictions)} more would pass it")
        times += [stamp(now)] * len(move.evictions)
        return current.model_copy(update={"in_flight": [*mine, move], "evictions": times})

    return await update_defrag(kube, policy, add)


class Mover:
    """Carries recorded moves out (the controller's, whoever recorded them)."""

    def __init__(self, kube: KubeClient, taint_wait: float,
                 failed: Callable[[DefragMove], None] = lambda move: None, timeout: float = 300.0,
                 home: str = CONTROLLER_NAMESPACE) -> None:
        """``failed``: told of each move this copy ends Failed (Auto then plans no move for its claim
        for a while); ``timeout``: the longest a requested move is taken up for (--defrag-timeout)."""
        self.kube, self.taint_wait, self.failed, self.timeout = kube, taint_wait, failed, timeout
        self.home = home  # gpuslice's own namespace: the agents' drain lists
        self.announced: set[str] = set()
        self.readings: dict[str, tuple[float, Reading]] = {}  # policy -> (when, what the last judgement read)

    async def step(self, policy: Body, move: DefragMove, now: datetime.datetime | None = None) -> bool:
        """One step of ``move``; True once it is over (its record gone)."""
        now = now or now_utc()
        name = str(policy["metadata"]["name"])
        if move.phase == REQUESTED:
            return await self._take_up(policy, move, now)
        claim = await self._get(claim_path(move.claim.namespace, move.claim.name))
        if claim is None or claim["metadata"].get("uid") != move.claim.uid:
            return await self.finish(name, move, "Failed", "Gone", f"the waiting claim {move.claim.namespace}/"
                                                                   f"{move.claim.name} is gone")
        if is_allocated(claim):
            got = ", ".join(f"{r['device']} on {r['pool']}" for r in allocation_results(claim))
            return await self.finish(name, move, "Freed", "", f"{describe(move)} was freed and the claim of"
                                                              f" {move.pod.namespace}/{move.pod.name} got {got}")
        expires, started = parse_time(move.expires), parse_time(move.started)
        if expires is None or now >= expires:
            left = [v.name for v in move.evictions if v.uid not in move.evicted]
            return await self.finish(name, move, "Failed", "Timeout", f"gave up at {move.expires}: the claim was not"
                                     f" allocated{' and ' + ', '.join(left) + ' were not evicted' if left else ''}")
        if move.id not in self.announced:
            self.announced.add(move.id)
            moving = ", ".join(f"{v.namespace}/{v.name}" for v in move.evictions) or "no pod"
            await self._pod_event(move.pod, "Normal", "DefragmentationStarted",
                                  f"gpuslice is freeing {describe(move)} for this pod (moving {moving}; {move.by},"
                                  f" until {move.expires})")
        pending = [v for v in move.evictions if v.uid not in move.evicted]
        if not pending:
            return await self._phase(name, move, "Placing")
        if not await self._tainted(move):
            if started is None or (now - started).total_seconds() > self.taint_wait:
                return await self.finish(name, move, "Failed", "NotTainted", f"the node agent of {move.node} did not"
                                         f" taint {describe(move)} within {self.taint_wait:.0f} s (is it running?);"
                                         " nothing was evicted")
            return False
        await self._phase(name, move, "Evicting")
        for victim in pending:
            refused = await self._evict(policy, move, victim)
            if refused is not None:
                return await self.finish(name, move, "Failed", refused[0], refused[1])
            await update_defrag(self.kube, name, functools.partial(_mark, move_id=move.id, uid=victim.uid))
        return False

    async def _take_up(self, policy: Body, move: DefragMove, now: datetime.datetime) -> bool:
        """Judge a requested move as the planner would make it now; take it up (False: not over), or
        end it refused (True). Nothing of a refused move was done: no Event goes to the pod it names,
        and Auto's pause after a failure is not set off for its claim (its writer chose both)."""
        name = str(policy["metadata"]["name"])
        reading = await self._reading(name)
        why = request_refusal(move, name, reading.cluster, reading.waiting)
        if why is None:
            expires = parse_time(move.expires)
            bound = now + datetime.timedelta(seconds=self.timeout)
            taken = {"phase": "Tainting", "started": stamp(now),
                     "expires": stamp(min(expires, bound) if expires is not None else bound)}
            written = await update_defrag(self.kube, name, lambda c: _taken_up(c, move.id, taken))
            if written is None:
                log.info("defragmentation move taken up", policy=name, move=move.id, by=move.by,
                         expires=taken["expires"])
            return False
        return await self._refuse(policy, move, why)

    async def _reading(self, policy: str) -> Reading:
        """What the planner reads, once a second at most per policy: requests added many at a time
        (16 fit in a status) are judged on one reading, not one each."""
        now = time.monotonic()
        cached = self.readings.get(policy)
        if cached is None or now - cached[0] >= READING_FOR:
            self.readings = {p: r for p, r in self.readings.items() if now - r[0] < READING_FOR}
            self.readings[policy] = (now, await read_cluster(self.kube, policy=policy, home=self.home))
        return self.readings[policy][1]

    async def _refuse(self, policy: Body, move: DefragMove, why: str) -> bool:
        name = str(policy["metadata"]["name"])
        message = f"move {move.id} requested by {move.by or 'someone'} was refused: {why}"

        def drop(current: DefragmentationStatus) -> DefragmentationStatus | str:
            if not any(m.id == move.id and m.phase == REQUESTED for m in current.in_flight):
                return "gone or taken up already"
            return current.model_copy(update={
                "in_flight": [m for m in current.in_flight if m.id != move.id],
                "last": DefragOutcome(id=move.id, time=stamp(now_utc()), outcome="Failed", message=message[:2048])})

        if await update_defrag(self.kube, name, drop) is not None:
            return True
        FAILED.labels(name, "Invalid").inc()
        log.warning("defragmentation move refused", policy=name, move=move.id, by=move.by, why=why)
        await post_event(self.kube, name, str(policy["metadata"].get("uid", "")), "Warning", "DefragmentationRefused",
                         message)
        return True

    async def _phase(self, policy: str, move: DefragMove, phase: str) -> bool:
        if move.phase != phase:
            await update_defrag(self.kube, policy, lambda c: _set_phase(c, move.id, phase))
        return False

    async def finish(self, policy: str, move: DefragMove, outcome: Literal["Freed", "Failed"], reason: str,
                     message: str) -> bool:
        """The record goes (the taint lifts); the outcome is kept in ``last`` and told."""
        now = now_utc()

        def drop(current: DefragmentationStatus) -> DefragmentationStatus | str:
            if not any(m.id == move.id for m in current.in_flight):
                return "ended already"  # told then: not again
            return current.model_copy(update={
                "in_flight": [m for m in current.in_flight if m.id != move.id],
                "last": DefragOutcome(id=move.id, time=stamp(now), outcome=outcome, message=message[:2048])})

        self.announced.discard(move.id)
        if await update_defrag(self.kube, policy, drop) is not None:
            return True
        if outcome == "Freed":
            FREED.labels(policy, who(move.by)).inc()
            await self._pod_event(move.pod, "Normal", "DefragmentationFreed", message)
        else:
            FAILED.labels(policy, reason).inc()
            self.failed(move)
            await self._pod_event(move.pod, "Warning", "DefragmentationFailed",
                                  f"gpuslice gave up freeing {describe(move)} for this pod: {message}"
                                  + _wasted(policy, move))
        log.info("defragmentation move ended", policy=policy, move=move.id, outcome=outcome, message=message)
        return True

    async def _evict(self, policy: Body, move: DefragMove, victim: ObjectRef) -> tuple[str, str] | None:
        """Evict ``victim`` if it is still there and may still be moved; (reason, why) to give up."""
        body = await self._get(pod_path(victim.namespace, victim.name))
        if body is None or body["metadata"].get("uid") != victim.uid or body["metadata"].get("deletionTimestamp"):
            return None  # gone or going: moved already, never evicted again
        pod = PodFacts.from_body(body)
        namespace = await self._get(namespace_path(victim.namespace))
        # Budgets are the Eviction API's to judge, at the moment of the eviction (the plan read them).
        blocker = pod_blocker(pod, tenants_of(policy), opted_out_namespaces([namespace] if namespace else []), ())
        if blocker is not None:
            return "Unmovable", f"{blocker.message}; nothing more was evicted"
        if not await self._holds_gpu(pod, move):
            return None  # it no longer holds a device of the GPU: nothing to move it for
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": victim.name, "namespace": victim.namespace},
                    "deleteOptions": {"preconditions": {"uid": victim.uid}}}
        try:
            await self.kube.create(eviction_path(victim.namespace, victim.name), eviction,
                                   retry=NO_RETRY)
        except (NotFound, Conflict):
            return None  # gone, or another pod of that name now: ours is gone
        except (TooManyRequests, ServerError, Forbidden) as error:
            if refused_by_disruption_budget(error):
                return "Disruption", (f"the eviction of {victim.namespace}/{victim.name} was refused"
                                      f" ({error.message}); nothing more was evicted")
            if not isinstance(error, Forbidden) or error.transient:
                raise  # the server failed or shed load: the next step tries again, until the move expires
            return "Forbidden", (f"the eviction of {victim.namespace}/{victim.name} was forbidden ({error.message});"
                                 " nothing more was evicted")
        failpoint("controller.defrag-evicted")  # the worst moment: evicted, not yet recorded
        EVICTIONS.labels(str(policy["metadata"]["name"]), who(move.by)).inc()
        log.info("evicted to free a GPU", policy=policy["metadata"]["name"], move=move.id,
                 pod=f"{victim.namespace}/{victim.name}", gpu=move.gpu, node=move.node)
        await self._pod_event(victim, "Normal", "MovedByGpuslice",
                              f"moved by gpuslice to free {describe(move)} for pod {move.pod.namespace}/{move.pod.name}"
                              f" (defragmentation; {move.by})")
        return None

    async def _holds_gpu(self, pod: PodFacts, move: DefragMove) -> bool:
        for claim_name in pod.claims.values():
            claim = await self._get(claim_path(pod.namespace, claim_name))
            if any(r["pool"] == move.node and r["device"].startswith(f"{move.gpu_tag}-")
                   for r in allocation_results(claim or {})):
                return True
        return False

    async def _tainted(self, move: DefragMove) -> bool:
        """Whether the agent published the move's taint on every device of the GPU but the kept one."""
        slices = await self.kube.list(SLICES, fieldSelector=f"spec.nodeName={move.node}")
        newest = newest_generation((s["spec"] for s in slices if s["spec"].get("driver") == DRIVER), move.node)
        devices = [d for d in (devices_of(newest) if newest else [])
                   if device_gpu(d) == move.gpu and d.get("name") != move.device]
        return bool(devices) and all(any(t.get("key") == DEFRAG_TAINT_KEY and t.get("value") == move.id
                                         for t in d.get("taints") or []) for d in devices)

    async def _get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.kube.get(path)
        except NotFound:
            return None

    async def _pod_event(self, pod: ObjectRef, kind: str, reason: str, message: str) -> None:
        await post_object_event(self.kube, pod.namespace, {"apiVersion": "v1", "kind": "Pod", "name": pod.name,
                                                           "namespace": pod.namespace, "uid": pod.uid},
                                kind, reason, message)


def _wasted(policy: str, move: DefragMove) -> str:
    """What a failed move's evictions were for: nothing. Counted, and said."""
    gone = [v for v in move.evictions if v.uid in move.evicted]
    if not gone:
        return ""
    WASTED.labels(policy, who(move.by)).inc(len(gone))
    names = ", ".join(f"{v.namespace}/{v.name}" for v in gone)
    budget = (f"; they count against maxEvictionsPerHour of GpuSlicePolicy {policy}" if move.by == AUTO
              else "")
    return f". The {len(gone)} pod{'s' if len(gone) != 1 else ''} evicted for it ({names}) moved for nothing{budget}"


def _mark(current: DefragmentationStatus, move_id: str, uid: str) -> DefragmentationStatus:
    moves = [m.model_copy(update={"evicted": [*m.evicted, uid]}) if m.id == move_id and uid not in m.evicted else m
             for m in current.in_flight]
    return current.model_copy(update={"in_flight": moves})


def _taken_up(current: DefragmentationStatus, move_id: str, taken: Mapping[str, str]) -> DefragmentationStatus | str:
    if not any(m.id == move_id and m.phase == REQUESTED for m in current.in_flight):
        return "gone or taken up already"
    moves = [m.model_copy(update=dict(taken)) if m.id == move_id else m for m in current.in_flight]
    return current.model_copy(update={"in_flight": moves})


def _set_phase(current: DefragmentationStatus, move_id: str, phase: str) -> DefragmentationStatus:
    moves = [m.model_copy(update={"phase": phase}) if m.id == move_id else m for m in current.in_flight]
    return current.model_copy(update={"in_flight": moves})
