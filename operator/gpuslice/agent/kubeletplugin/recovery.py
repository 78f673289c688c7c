"""At start, and now and then: make the node match the checkpoints.

A checkpoint from an earlier boot of the node is undone whatever its phase: its MIG instance
and CDI spec did not survive the reboot, and the kubelet's next prepare must make them again
rather than be answered from it. A prepare the agent did not finish (``started``) is undone: the
MIG instance it may have made is destroyed and its CDI spec removed. A CDI spec of
ours that no ``completed`` checkpoint backs is removed. On GPUs that serve dynamic
MIG, an instance no checkpoint backs is destroyed: its placement is published as
free, and a claim given it would fail to make it. Instances of a static layout are
never touched here. The MPS control daemons an earlier agent left are adopted where
a completed claim of their namespace still has MPS devices on their GPU and stopped
elsewhere, and a GPU and namespace that need one and have none get one (``agent.mps.daemons``). A completed claim whose
ResourceClaim is gone (the kubelet never unprepared it: force-deleted pod, node down)
is unprepared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from gpuslice.agent.gpus import GpuBackendError
from gpuslice.agent.kubeletplugin.prepare import ClaimRef, Preparer
from gpuslice.agent.mps.daemons import MpsError
from gpuslice.agent.node_state.checkpoint import ClaimCheckpoint
from gpuslice.coordinates import claim_path
from gpuslice.kube.client import KubeError, NotFound

log = structlog.get_logger(__name__)


@dataclass
class Recovered:
    undone: list[str] = field(default_factory=list)  # unfinished prepares, by claim
    rebooted: list[str] = field(default_factory=list)  # claims prepared before the node last booted
    specs_removed: list[str] = field(default_factory=list)  # claim UIDs
    instances_destroyed: list[str] = field(default_factory=list)  # "<gpu>/<profile>@<start>"
    stale: list[str] = field(default_factory=list)  # completed claims whose ResourceClaim is gone


def _backs(checkpoint: ClaimCheckpoint, gpu: str, profile: str, start: int) -> bool:
    return any(d.gpu_uuid == gpu and d.mig is not None and d.mig.profile == profile and d.mig.start == start
               for d in checkpoint.devices)


async def recover(preparer: Preparer, dynamic_mig_gpus: set[str]) -> Recovered:
    found = Recovered()
    for checkpoint in preparer.checkpoints.all():
        if preparer.checkpoints.from_earlier_boot(checkpoint):
            await preparer.undo(checkpoint)
            found.rebooted.append(checkpoint.key)
        elif checkpoint.phase == "started":
            await preparer.undo(checkpoint)
            found.undone.append(checkpoint.key)
    completed = preparer.checkpoints.all()
    backed = {c.uid for c in completed if c.cdi_spec}
    for uid in sorted(preparer.cdi.claims() - backed):
        preparer.cdi.remove(uid)
        found.specs_removed.append(uid)
    ops = preparer.ops
    for uuid in sorted(dynamic_mig_gpus - preparer.pool.static_gpus()):
        gpu = ops.gpus.get(uuid)
        if gpu is None or not gpu.mig_capable:
            continue
        async with ops.lock(uuid):
            try:
                for instance in await ops.call(ops.backend.mig_instances, gpu):
                    if not any(_backs(c, uuid, instance.profile, instance.start) for c in completed):
                        await ops.call(ops.backend.destroy_mig, gpu, instance)
                        found.instances_destroyed.append(f"{uuid}/{instance.profile}@{instance.start}")
            except GpuBackendError as error:
                log.error("could not clear MIG instances no claim backs; will try again at the next start",
                          gpu=uuid, error=str(error))
    try:
        await preparer.mps.adopt(preparer.mps_daemons())
    except MpsError as error:  # the supervision loop tries again
        log.error("an MPS control daemon could not be started at start-up; will retry", error=str(error))
    if found.rebooted:
        log.warning("the node booted since these claims were prepared; what they recorded is undone and the"
                    " kubelet's next prepare makes it again", claims=found.rebooted)
    if found.undone or found.specs_removed or found.instances_destroyed:
        log.warning("recovered from an unclean stop", unfinished_prepares_undone=found.undone,
                    cdi_specs_removed=found.specs_removed, mig_instances_destroyed=found.instances_destroyed)
    return found


async def collect_stale(preparer: Preparer, in_use: set[str] | None = None) -> list[str]:
    """Unprepare completed claims whose ResourceClaim no longer exists (or was recreated). ``in_use``:
    the claims (namespace/name) a running container holds, as the kubelet says: such a claim
    cannot have been deleted (it is reserved), so it is not asked about. Every prepared claim was
    read from the API server every sweep before: a node's claims every minute, for ever."""
    stale = []
    for checkpoint in preparer.checkpoints.all():
        if checkpoint.phase != "completed" or f"{checkpoint.namespace}/{checkpoint.name}" in (in_use or set()):
            continue
        path = claim_path(checkpoint.namespace, checkpoint.name)
        try:
            uid = (await preparer.kube.get(path))["metadata"].get("uid")
        except NotFound:
            uid = None
        except KubeError:
            continue  # cannot tell now; next time
        if uid != checkpoint.uid:
            await preparer.unprepare(ClaimRef(checkpoint.namespace, checkpoint.name, checkpoint.uid))
            stale.append(checkpoint.key)
    if stale:
        log.warning("unprepared claims that no longer exist (the kubelet never unprepared them)", claims=stale)
    return stale
