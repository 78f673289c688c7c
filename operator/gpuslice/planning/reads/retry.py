"""Pods kube-scheduler turned away that would fit now: when to ask it to try again (pure).

kube-scheduler counts the allocations it is writing when it filters the next pods. A pod can be
turned away ("cannot allocate all claims") only because allocations were in flight that an
admission rule then refused (a tenant over its maxMemory, a tenancy rule): the scheduler drops
them from its count, but no event tries the turned-away pod again, and it waits for the next
claim deallocation, ResourceSlice or DeviceClass change, or the scheduler's flush of pods
unschedulable for 5 minutes. The controller looks for such pods whose devices are free in the
committed allocations, and changes one of its DeviceClasses to make the scheduler try them again
(controller.retry).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuslice.dra.wire import is_allocated
from gpuslice.planning.reads.availability import room_for
from gpuslice.planning.reads.occupancy import GpuMap
from gpuslice.planning.reads.pending import claim_requests, class_owner, pod_claim_names

Body = Mapping[str, Any]
TURNED_AWAY = "cannot allocate all claims"


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


def _fits(claim: Body, policies: Sequence[Body], gpus: Sequence[GpuMap]) -> tuple[str, str, str] | None:
    """(class, policy, place) when every request of ``claim`` for our devices fits now, each on its
    own (the scheduler decides how they go together); None when one does not, or none is ours."""
    found: tuple[str, str, str] | None = None
    for request in claim_requests(claim.get("spec") or {}, str((claim.get("metadata") or {}).get("name", ""))):
        owner = class_owner(request.device_class, policies)
        if owner is None:
            continue
        if request.all_devices or request.admin:
            return None  # all devices, or admin access: not a question of free room
        places, _ = room_for(gpus, owner[0], owner[1], request.memory)
        free = [p for p in places if p.free]
        if sum(p.free for p in free) < request.count:
            return None
        found = found or (request.device_class, owner[0], f"{free[0].gpu.node} GPU {free[0].gpu.index}")
    return found


def to_retry(pods: Sequence[Body], claims: Mapping[str, Body], policies: Sequence[Body],
             gpus: Sequence[GpuMap]) -> list[Retry]:
    """The turned-away pods whose unallocated claims of our devices fit now. ``claims``: by
    "namespace/name"; a claim not found (not made yet) is not ours to judge."""
    found = []
    for pod in pods:
        if not turned_away(pod):
            continue
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace", ""))
        for name in pod_claim_names(pod).values():
            claim = claims.get(f"{namespace}/{name}")
            if claim is None or is_allocated(claim):
                continue
            fit = _fits(claim, policies, gpus)
            if fit is not None:
                found.append(Retry(f"{namespace}/{meta.get('name')}", name, *fit))
                break
    return found
