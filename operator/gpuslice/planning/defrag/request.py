"""Whether a move someone requested is one gpuslice would make itself (pure).

The ClusterRole ``gpuslice-defrag`` lets its holder add a move to a policy's
``status.defragmentation.inFlight``, as a request (``gpuslice-policy-status``); the controller
carries moves out. The admission rule can judge only a request's form (CEL there reads neither
claims nor pods, nor the time). So before a requested move counts for anything (the node agent's
taint, the tenancy rule's reservation, an eviction), the controller plans again on what it reads
and takes the move up only if its own plan for that claim is that move: the claim one of the
policy's, unallocated, of a tenant, that a pending pod waits for and the scheduler turned away for
devices; the GPU one the planner could free for it (its choice, or another it found no blocker on:
``gpuslice defrag`` plans every waiting pod at once, each on what the earlier plans leave, so its
choice for one pod may be the controller's second), the device the one it would keep there, and
the pods to evict exactly those it would move there, the fewest for that GPU. Anything else (a
claim no pod uses, another policy's GPU, pods that need not move) is refused, whoever wrote it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpuslice.api.status import DefragMove
from gpuslice.planning.defrag.model import Cluster, Waiting
from gpuslice.planning.defrag.planner import plan_defrag


def _names(refs: Sequence[str]) -> str:
    return ", ".join(sorted(refs)) or "no pod"


def refusal(move: DefragMove, policy: str, cluster: Cluster, waiting: Sequence[Waiting]) -> str | None:
    """Why ``move``, requested in ``policy``'s status, is not one gpuslice would make; None when it is.
    ``waiting``: the pods that wait for the policy's devices (``planning.defrag.model.waiting_pods``)."""
    claim = f"{move.claim.namespace}/{move.claim.name}"
    found = next((w for w in waiting if w.claim.uid == move.claim.uid and w.policy == policy), None)
    if found is None:
        return (f"claim {claim} (UID {move.claim.uid or 'none'}) is not an unallocated claim of GpuSlicePolicy"
                f" {policy}'s devices that a pending pod of a tenant waits for")
    if found.claim.ref != claim:
        return f"the claim of UID {move.claim.uid} is {found.claim.ref}, not {claim}"
    pod = f"{move.pod.namespace}/{move.pod.name}"
    if (found.pod.ref, found.pod.uid) != (pod, move.pod.uid):
        return f"claim {claim} is waited for by pod {found.pod.ref} (UID {found.pod.uid}), not {pod}"
    others = tuple(m for m in cluster.in_flight if m.id != move.id)
    [plan] = plan_defrag(replace(cluster, in_flight=others), [found])
    if not plan.ready or plan.target is None:
        return f"gpuslice would free no GPU for {pod}: {plan.message}"
    options = [plan.target, *(o for o in plan.alternatives if not o.blockers)]
    option = next((o for o in options if (o.node, o.uuid) == (move.node, move.gpu)), None)
    if option is None:
        return (f"gpuslice would free {plan.target.label} ({plan.target.uuid}) for {pod}, and no GPU {move.gpu} of"
                f" node {move.node}")
    if (move.gpu_tag, move.device) != (option.tag, option.device):
        return (f"{option.label} is {option.tag}, and the device it would keep for {pod} is {option.device}, not"
                f" {move.gpu_tag} and {move.device}")
    planned = {m.uid: m.pod for m in option.moves}
    recorded = {v.uid: f"{v.namespace}/{v.name}" for v in move.evictions}
    if planned.keys() != recorded.keys() or any(planned[uid] != name for uid, name in recorded.items()):
        return (f"to free {option.label} for {pod} gpuslice would move {_names(list(planned.values()))}, not"
                f" {_names(list(recorded.values()))}")
    return None
