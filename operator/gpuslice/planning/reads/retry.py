"""Pods kube-scheduler turned away that would fit now: when to ask it to try again (pure).

kube-scheduler counts the allocations it is writing when it filters the next pods. A pod can be
turned away ("cannot allocate all claims") only because allocations were in flight that an
admission rule then refused (a tenant over its maxMemory, a tenancy rule): the scheduler drops
them from its count, but no event tries the turned-away pod again, and it waits for the next
claim deallocation, ResourceSlice or DeviceClass change, or the scheduler's flush of pods
unschedulable for 5 minutes. The controller looks for such pods whose devices are free in the
committed allocations, on a node the pod may go to (its node selector, required node affinity and
tolerations: ``planning.reads.node_fit``), and changes one of its DeviceClasses to make the
scheduler try them again (controller.retry). A claim with CEL selectors is not judged (gpuslice
does not evaluate them): its pod is left to the scheduler's own flush.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gpuslice.dra.wire import device_requests, is_allocated
from gpuslice.jsontypes import Body
from gpuslice.planning.kinds import FULL
from gpuslice.planning.reads.availability import room_for
from gpuslice.planning.reads.node_fit import NodeFacts, Placement, refusal
from gpuslice.planning.reads.occupancy import GpuMap
from gpuslice.planning.reads.pending import Request, class_owner, pod_claim_names, request_options
from gpuslice.planning.reads.scheduler_said import TURNED_AWAY
from gpuslice.planning.reads.topology import aligned_room


def turned_away(pod: Body) -> bool:
    """Whether the scheduler's last word on a pod not yet on a node is that its claims could not
    be allocated (a Filter verdict, which waits for an event; its PreBind errors retry by themselves)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") or meta.get("deletionTimestamp") or status.get("phase", "Pending") != "Pending":
        return False
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               and TURNED_AWAY in str(c.get("message") or "") for c in status.get("conditions") or [])


@dataclass(frozen=True)
class Retry:
    """A pod to try again: the DeviceClass of ours its claim asks for, and where that fits now."""

    pod: str  # namespace/name
    claim: str
    device_class: str
    policy: str
    fits: str  # "node-1 GPU 0"
    uid: str = ""  # the pod's: what its backoff is keyed by (a name can be reused)


def _place(option: Request, policies: Sequence[Body], gpus: Sequence[GpuMap],
           admits: Callable[[str], bool]) -> tuple[str, str, str] | None:
    """(class, policy, place) where ``option``, one of our classes, fits now on a node ``admits``;
    None when it does not, or when that cannot be told."""
    owner = class_owner(option.device_class, policies)
    if owner is None or option.all_devices or option.admin:
        return None  # all devices, or admin access: not a question of free room
    if option.selectors:
        return None  # CEL selectors, which gpuslice does not evaluate: the scheduler's own flush retries it
    places, _ = room_for(gpus, owner[0], owner[1], option.memory)
    free = [p for p in places if p.free and admits(p.gpu.node)]
    if sum(p.free for p in free) < option.count:
        return None
    if option.match and option.count > 1 and owner[1] == FULL:  # GPUs that must sit together (planning.aligned)
        room = aligned_room(gpus, owner[0], owner[1], option.count, option.match)
        return (option.device_class, owner[0], room.where) if room.fits else None
    return option.device_class, owner[0], f"{free[0].gpu.node} GPU {free[0].gpu.index}"


def _fits(claim: Body, policies: Sequence[Body], gpus: Sequence[GpuMap],
          admits: Callable[[str], bool]) -> tuple[str, str, str] | Literal[False] | None:
    """(class, policy, place) when every request of ``claim`` for our devices fits now, each on its
    own (the scheduler decides how they go together), a request with ``firstAvailable`` when one
    of its options of ours does; False when one does not; None when no request is ours."""
    found: tuple[str, str, str] | None = None
    name = str((claim.get("metadata") or {}).get("name", ""))
    for request in device_requests(claim.get("spec") or {}):
        options = [o for o in request_options(request, name, claim.get("spec") or {})
                   if class_owner(o.device_class, policies) is not None]
        if not options:
            continue  # another driver's request: the scheduler's alone to judge
        place = next((p for o in options if (p := _place(o, policies, gpus, admits)) is not None), None)
        if place is None:
            return False
        found = found or place
    return found


def to_retry(pods: Sequence[Body], claims: Mapping[str, Body], policies: Sequence[Body],
             gpus: Sequence[GpuMap], nodes: Mapping[str, NodeFacts] | None = None) -> list[Retry]:
    """The turned-away pods each of whose unallocated claims of our devices fits now, on a node the
    pod may go to (``nodes`` by name; None: not judged). ``claims``: by "namespace/name"; a pod with
    a claim not found (not made yet) is not ours to judge."""
    found = []
    for pod in pods:
        if not turned_away(pod):
            continue
        meta = pod.get("metadata") or {}
        placement = Placement.from_spec(pod.get("spec") or {})

        def admits(node: str, placement: Placement = placement) -> bool:
            return nodes is None or refusal(placement, nodes.get(node) or NodeFacts(node)) is None

        namespace = str(meta.get("namespace", ""))
        fits: list[tuple[str, tuple[str, str, str]]] = []
        for name in pod_claim_names(pod).values():
            claim = claims.get(f"{namespace}/{name}")
            if claim is None:
                fits = []
                break
            fit = None if is_allocated(claim) else _fits(claim, policies, gpus, admits)
            if fit is False:
                fits = []
                break
            if isinstance(fit, tuple):
                fits.append((name, fit))
        if fits:
            claim_name, (device_class, policy, place) = fits[0]
            found.append(Retry(f"{namespace}/{meta.get('name')}", claim_name, device_class, policy, place,
                               str(meta.get("uid", ""))))
    return found
