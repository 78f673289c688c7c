"""``gpuslice defrag``: which pods to move to free a GPU for each pod that waits, and with ``--apply``
the moves themselves, one GPU at a time.

The plan is the controller's planner on what the API server holds (``controller.defrag.read``).
``--apply`` requests each move in its policy's ``status.defragmentation.inFlight`` (the one write
this command makes) and follows it: the gpuslice controller takes a request up only if its own plan
is that move, and carries it out (``controller.defrag.move``: the GPU tainted first, then the pods
evicted through the Eviction API, then the waiting claim allocated), so a move outlives this
command, is carried out by the leader only, and resumes after a controller restart. Then it plans
again for the next pod: the world has changed. Needs, besides what ``gpuslice-viewer`` reads,
``patch`` on ``gpuslicepolicies/status`` (the ClusterRole ``gpuslice-defrag`` of
manifests/viewer-rbac.yaml).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from gpuslice.api.status import MAX_REQUESTED_MOVE, DefragmentationStatus, DefragMove
from gpuslice.controller.defrag.move import new_move, now_utc, start, update_defrag
from gpuslice.controller.defrag.read import Reading, read_cluster
from gpuslice.controller.startup import whoami
from gpuslice.coordinates import policy_path
from gpuslice.inspect.commands import _connect, _console, _run, cluster_options
from gpuslice.inspect.render.printable import printable
from gpuslice.inspect.snapshot import InspectError
from gpuslice.kube.client import Forbidden, KubeClient, KubeError, NotReady
from gpuslice.planning.defrag.model import Plan, moves_in_flight
from gpuslice.planning.defrag.node_taints import parse_time
from gpuslice.planning.reads.occupancy import as_json
from gpuslice.settings import ClusterAccess, from_flags

PHASES = {"Tainting": "the controller took the move up, the node agent taints the GPU",
          "Evicting": "the GPU is tainted, evicting",
          "Placing": "the pods are gone, waiting for the claim to be allocated"}
PICKED_UP = 45.0  # seconds within which a controller takes a recorded move up (it tries the taint for 30)
GRACE = 60.0  # seconds past a move's expiry after which nobody carries it out: this command removes it


@dataclass(frozen=True)
class Applied:
    pod: str
    move: str
    outcome: str  # Freed, Failed, NotStarted
    message: str


def _selected(plan: Plan, targets: tuple[str, ...]) -> bool:
    return not targets or plan.pod in targets


async def _read(kube: KubeClient, policy: str | None, home: str) -> Reading:
    try:
        return await read_cluster(kube, policy, home)
    except NotReady as error:  # an API server just started: not a matter of RBAC
        raise InspectError(f"reading the cluster failed: {error}") from None
    except Forbidden as error:
        raise InspectError(f"reading what gpuslice defrag plans from is forbidden for this identity"
                           f" ({error.message}); bind the ClusterRole gpuslice-viewer (manifests/viewer-rbac.yaml)"
                           " to it") from None
    except KubeError as error:
        raise InspectError(f"reading the cluster failed: {error}") from None


async def plan(access: ClusterAccess, policy: str | None, targets: tuple[str, ...]) -> list[Plan]:
    async with await _connect(access) as kube:
        reading = await _read(kube, policy, access.gpuslice_namespace)
    return [p for p in reading.plans() if _selected(p, targets)]


async def _follow(kube: KubeClient, policy: str, move: DefragMove, say: Callable[[str], None]) -> Applied:
    """Until the move's record is gone: what the controller did, as it does it."""
    pod = f"{move.pod.namespace}/{move.pod.name}"
    seen_phase, seen_evicted, warned = move.phase, 0, False
    began = time.monotonic()
    expires = parse_time(move.expires)
    while True:
        await asyncio.sleep(1.0)
        body = await kube.get(policy_path(policy))
        current = next((m for m in moves_in_flight([body]) if m.id == move.id), None)
        if current is None:
            last = DefragmentationStatus.model_validate(
                (body.get("status") or {}).get("defragmentation") or {}).last
            if last is not None and last.id == move.id:
                return Applied(pod, move.id, last.outcome, last.message)
            return Applied(pod, move.id, "Failed", "the move's record went without an outcome (removed by hand?)")
        if current.phase != seen_phase:
            seen_phase = current.phase
            say(f"  {current.phase.lower()}: {PHASES.get(current.phase, '')} (until {current.expires})")
        for victim in current.evictions:
            if victim.uid in current.evicted[seen_evicted:]:
                say(f"  evicted {victim.namespace}/{victim.name}")
        seen_evicted = len(current.evicted)
        if not warned and current.phase == "Requested" and time.monotonic() - began > PICKED_UP:
            warned = True
            say("  no gpuslice controller has taken the move up yet: is it running, and is it this version?")
        if expires is not None and (now_utc() - expires).total_seconds() > GRACE:
            await update_defrag(kube, policy, lambda c: c.model_copy(update={
                "in_flight": [m for m in c.in_flight if m.id != move.id]}))
            return Applied(pod, move.id, "Failed", f"no gpuslice controller carried the move out by {move.expires};"
                                                   " its record was removed (nothing was evicted by this command)")


async def apply(access: ClusterAccess, policy: str | None, targets: tuple[str, ...], move_timeout: float,
                say: Callable[[str], None]) -> tuple[list[Plan], list[Applied]]:
    """Each ready plan in turn, planned again on what the previous one left."""
    applied: list[Applied] = []
    tried: set[str] = set()
    first: list[Plan] | None = None
    async with await _connect(access) as kube:
        try:
            user = await whoami(kube)
        except KubeError:
            user = "unknown user"
        while True:
            reading = await _read(kube, policy, access.gpuslice_namespace)
            plans = [p for p in reading.plans() if _selected(p, targets)]
            first = plans if first is None else first
            ready = next((p for p in plans if p.ready and p.pod not in tried), None)
            if ready is None or ready.target is None:
                return first, applied
            tried.add(ready.pod)
            move = new_move(ready, f"gpuslice defrag ({user})", now_utc(), move_timeout)
            try:
                refused = await start(kube, ready.policy, move, list(reading.cluster.in_flight))
            except Forbidden as error:
                raise InspectError(f"recording the move in GpuSlicePolicy {ready.policy} failed ({error.message});"
                                   " gpuslice defrag --apply needs patch on gpuslicepolicies/status (the ClusterRole"
                                   " gpuslice-defrag of manifests/viewer-rbac.yaml)") from None
            except KubeError as error:  # the admission rule refused the move's form (docs/controller.md)
                raise InspectError(f"recording the move in GpuSlicePolicy {ready.policy} failed"
                                   f" ({error.message})") from None
            if refused is not None:
                applied.append(Applied(ready.pod, move.id, "NotStarted", refused))
                say(f"{ready.pod}: not started: {refused}")
                continue
            say(f"{ready.pod}: freeing {ready.target.label} by moving"
                f" {', '.join(m.pod for m in ready.target.moves) or 'no pod'} (move {move.id}, in GpuSlicePolicy"
                f" {ready.policy}, until {move.expires})")
            result = await _follow(kube, ready.policy, move, say)
            say(f"{ready.pod}: {result.outcome}: {result.message}")
            applied.append(result)


@click.command("defrag")
@click.argument("targets", nargs=-1, metavar="[NAMESPACE/POD ...]")
@click.option("--policy", default=None, help="Only the pods that wait for this GpuSlicePolicy's devices.")
@click.option("--apply", "apply_", is_flag=True, help=(
    "Carry the plans out, one GPU at a time: record each move for the gpuslice controller, which taints the GPU,"
    " evicts the pods through the Eviction API (PodDisruptionBudgets hold) and lifts the taint once the waiting"
    " pod has its GPU; print what it does."))
@click.option("--timeout", type=click.FloatRange(min=10, max=MAX_REQUESTED_MOVE), default=300.0, show_default=True,
              help=("With --apply: seconds each move may take before it is given up (its taint lifts); the"
                    " controller takes a move up for its own --defrag-timeout at most."))
@cluster_options
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def defrag(targets: tuple[str, ...], policy: str | None, apply_: bool, timeout: float, kubeconfig: Path | None,
           context: str | None, gpuslice_namespace: str, output: str) -> None:
    """For each pod that waits for a GPU (or a large slice) while its policy's GPUs hold enough free memory
    in pieces: the fewest moves of movable pods that free one GPU for it, and what blocks the others."""
    access = from_flags(ClusterAccess, {"kubeconfig": kubeconfig, "context": context,
                                       "gpuslice_namespace": gpuslice_namespace})
    if not apply_:
        plans = _run(plan(access, policy, targets))
        if output == "json":
            click.echo(json.dumps({"plans": as_json(plans)}, indent=2))
            return
        from gpuslice.inspect.render.defrag_view import defrag_view

        _console().print(defrag_view(plans))
        return
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        if output == "text":
            click.echo(printable(line))  # it quotes the cluster: a move's outcome, a pod's name

    plans, applied = _run(apply(access, policy, targets, timeout, say))
    if output == "json":
        click.echo(json.dumps({"plans": as_json(plans), "applied": as_json(applied), "log": lines}, indent=2))
    elif not applied:
        from gpuslice.inspect.render.defrag_view import defrag_view

        _console().print(defrag_view(plans))
    freed = {a.pod for a in applied if a.outcome == "Freed"}
    # 0: every waiting pod got its GPU or needs no move; 1: a move failed, or a pod could not be helped.
    sys.exit(0 if all(p.pod in freed or p.verdict in ("NotNeeded", "InFlight") for p in plans) else 1)

