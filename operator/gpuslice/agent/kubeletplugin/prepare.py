"""Prepare and unprepare claims: the kubelet plugin's work, crash safe and idempotent.

Prepare reads the claim's allocation from the API server and keeps only this
driver's results for this node's pool. Each device must be one the agent publishes
now (the second line behind the drain: a device a policy edit removed while the
scheduler was choosing it never reaches a container). Under the pool's lock (``agent.pool``),
so that a device cannot vanish between that check and the ``started`` checkpoint,
which from then on counts as allocated for the publisher. Then each device is
prepared by its mode (``modes``), one CDI spec is written for the claim, and the
checkpoint says ``completed``; only then does the kubelet get the CDI ids. A device of a policy
with ``slicing.isolation: MPS`` makes the MPS control daemon of its GPU and the claim's namespace
run (``agent.mps``) before the spec is written, and its container a client of that daemon with the
claim's limits (``planning.node.mps``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace

import structlog

from gpuslice.agent.gpus import Access, GpuBackendError, MigInstance
from gpuslice.agent.killpoints import kill_point
from gpuslice.agent.kubeletplugin.cdi import CdiDirectory
from gpuslice.agent.kubeletplugin.errors import (
    ClaimNotFound,
    DeviceHeld,
    DeviceNotPublished,
    DeviceUnusable,
    NotAllocated,
    NotATenant,
    PluginError,
    UnprepareFailed,
    present_gpu,
)
from gpuslice.agent.kubeletplugin.modes import prep_of
from gpuslice.agent.mps.daemons import MpsDaemons, MpsError
from gpuslice.agent.node_state.checkpoint import ClaimCheckpoint, PreparedDevice
from gpuslice.agent.pool import NodePool
from gpuslice.coordinates import SLICES, claim_path, policy_path
from gpuslice.dra import cdi
from gpuslice.dra.names import DRIVER
from gpuslice.dra.policy_wire import admin_namespaces, tenant_namespaces
from gpuslice.dra.slice_wire import slice_counter_sets
from gpuslice.dra.wire import (
    AllocationResult,
    allocation_results,
    consumed_memory,
    devices_of,
    is_allocated,
    newest_generation,
)
from gpuslice.kube.client import KubeClient, KubeError, NotFound
from gpuslice.planning.devices import CounterSet, Device
from gpuslice.planning.grants import Grant, prefixed
from gpuslice.planning.modes import environment
from gpuslice.planning.node.mps import DaemonDirs, DaemonKey, client_edits
from gpuslice.planning.node.overlap import Holding, overlaps

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def grant_memory(record: PreparedDevice, device: Device) -> int:
    """The GPU memory a prepared device stands for: the claim's share of a shared device, else the device's."""
    return record.consumed_memory if record.consumed_memory is not None else device.memory


def mps_keys(checkpoint: ClaimCheckpoint) -> set[DaemonKey]:
    """The daemons the claim is a client of: one per GPU it has MPS devices on, of its namespace."""
    return {DaemonKey(d.gpu_uuid, checkpoint.namespace) for d in checkpoint.devices if d.mps}


@dataclass(frozen=True)
class PublishedPool:
    """What this node's pool publishes now (the newest generation): its devices, typed, by name,
    and its counter sets."""

    devices: dict[str, Device]
    counter_sets: tuple[CounterSet, ...] = ()


async def published_pool(kube: KubeClient, node: str) -> PublishedPool:
    slices = await kube.list(SLICES, fieldSelector=f"spec.nodeName={node},spec.driver={DRIVER}")
    newest = newest_generation([s["spec"] for s in slices], node)  # the pool named after the node
    if newest is None:
        return PublishedPool({})
    found = {}
    for manifest in devices_of(newest):
        if (device := Device.from_manifest(manifest)) is not None:
            found[device.name] = device
    sets = (CounterSet.from_manifest(c) for s in newest.slices for c in slice_counter_sets(s))
    return PublishedPool(found, tuple(c for c in sets if c is not None))


class Preparer:
    """Prepares claims of ``pool``'s devices: under its lock, on its GPUs, in its checkpoints,
    leaving the MIG instances of its static layouts alone."""

    def __init__(self, pool: NodePool, cdi_dir: CdiDirectory, mps: MpsDaemons) -> None:
        if pool.state.checkpoints is None:
            raise ValueError("the kubelet plugin needs a pool kept in its state directory (PoolState.kept_in)")
        self.pool, self.checkpoints = pool, pool.state.checkpoints
        self.node, self.kube, self.ops = pool.node, pool.kube, pool.ops
        self.cdi, self.mps = cdi_dir, mps
        self._claim_locks: dict[str, asyncio.Lock] = {}

    def _lock(self, uid: str) -> asyncio.Lock:
        return self._claim_locks.setdefault(uid, asyncio.Lock())

    # Prepare

    async def prepare(self, claim: ClaimRef) -> list[PreparedDevice]:
        async with self._lock(claim.uid):
            existing = self.checkpoints.read(claim.uid)
            if existing is not None and existing.phase == "completed":
                return existing.devices  # a retry, or the kubelet restarted: same answer
            if existing is not None:
                log.warning("undoing an unfinished prepare before retrying it", claim=str(claim), uid=claim.uid)
                await self.undo(existing)
            results = await self._our_results(claim)
            checkpoint, devices = await self._start(claim, results)
            try:
                await self._check_tenancy(claim, results, devices)  # its reads hold no lock
                return await self._finish(claim, checkpoint, devices)
            except BaseException:
                log.warning("prepare failed; undoing what it made", claim=str(claim), uid=claim.uid)
                await asyncio.shield(self.undo(checkpoint))
                raise

    async def _our_results(self, claim: ClaimRef) -> list[AllocationResult]:
        path = claim_path(claim.namespace, claim.name)
        try:
            body = await self.kube.get(path)
        except NotFound:
            raise ClaimNotFound(f"claim {claim} does not exist (deleted before it was prepared).") from None
        if body["metadata"].get("uid") != claim.uid:
            raise ClaimNotFound(f"claim {claim} was deleted and recreated (uid {body['metadata'].get('uid')}, the"
                                f" kubelet asked for {claim.uid}); the kubelet prepares the new one separately.")
        if not is_allocated(body):
            raise NotAllocated(f"claim {claim} is not allocated; the kubelet asks only once the scheduler has.")
        results = allocation_results(body)
        elsewhere = sorted({r["pool"] for r in results if r["pool"] != self.node})
        if elsewhere:
            raise NotAllocated(f"claim {claim} has {DRIVER} devices of pools {', '.join(elsewhere)}, not only of"
                               f" node {self.node}'s pool; a pod can use only devices of the node it runs on.")
        return results

    async def _start(self, claim: ClaimRef,
                     results: list[AllocationResult]) -> tuple[ClaimCheckpoint, dict[str, Device]]:
        async with self.pool.lock:
            pool = await published_pool(self.kube, self.node) if results else PublishedPool({})
            published = pool.devices
            if results and not published:
                raise DeviceUnusable(
                    f"claim {claim}: node {self.node}'s pool has no published slices right now (the kubelet removes"
                    " a driver's slices when it starts or when the plugin was away; the agent is publishing them"
                    " again); the kubelet retries.")
            missing = [r["device"] for r in results if r["device"] not in published]
            if missing:
                raise DeviceNotPublished(
                    f"claim {claim} was allocated device{'s' if len(missing) > 1 else ''} {', '.join(missing)} of pool"
                    f" {self.node}, which the gpuslice agent on {self.node} no longer publishes (a policy change or a"
                    " drain removed it after the scheduler chose it); it is not given to any container. Delete the"
                    " pod (and the claim, unless a template made it) so that the scheduler allocates a published"
                    " device.")
            static = self.pool.static_gpus()
            devices = []
            for result in results:
                device = published[result["device"]]
                admin = bool(result.get("adminAccess"))
                devices.append(PreparedDevice(
                    request=result["request"], pool=self.node, device=device.name, mode=device.mode,
                    gpu_uuid=device.gpu_uuid, share_id=result.get("shareID"), consumed_memory=consumed_memory(result),
                    admin_access=admin, mig=prep_of(device.mode).plan(device, admin, device.gpu_uuid in static),
                    mps=device.isolation == "MPS" and not admin, policy=device.policy,
                    allocated=None if admin else (consumed_memory(result) or device.memory),
                ))
            self._check_overlap(claim, devices, pool)
            mps_gpus = sorted({d.gpu_uuid for d in devices if d.mps})
            if len(mps_gpus) > 1:
                raise DeviceUnusable(
                    f"claim {claim} was allocated MPS devices of {len(mps_gpus)} GPUs ({', '.join(mps_gpus)}); an MPS"
                    " control daemon serves one GPU and a CUDA process connects to one, so a claim of a policy with"
                    " slicing.isolation: MPS may hold devices of one GPU only. Ask for them on one GPU (a"
                    " matchAttribute constraint on gpu.gpuslice.dev/parentUUID), or in separate claims and pods.")
            checkpoint = ClaimCheckpoint(uid=claim.uid, namespace=claim.namespace, name=claim.name, phase="started",
                                         devices=devices)
            await asyncio.to_thread(self.checkpoints.write, checkpoint)
        kill_point("prepare-started")
        return checkpoint, {d.device: published[d.device] for d in devices}

    def _check_overlap(self, claim: ClaimRef, devices: list[PreparedDevice], pool: PublishedPool) -> None:
        """No device of ``claim`` that another claim prepared here holds, nor more than a GPU has
        (``planning.node.overlap``), whatever the allocation says. Under the pool's lock, against
        every checkpoint, started ones included: their devices are taken until undone."""
        held = [Holding(f"{c.namespace}/{c.name}", c.uid, d.device, d.consumed_memory, d.admin_access)
                for c in self.checkpoints.all() if c.uid != claim.uid for d in c.devices]
        wanted = [Holding(str(claim), claim.uid, d.device, d.consumed_memory, d.admin_access) for d in devices]
        problems = overlaps(wanted, held, pool.devices, pool.counter_sets)
        if problems:
            raise DeviceHeld(
                f"claim {claim} was allocated devices that claims prepared on node {self.node} hold: "
                f"{'; '.join(problems)}. None is given to its containers: the allocation was written from stale"
                " state or forged. Delete the pod (and the claim, unless a template made it) so that the"
                " scheduler allocates again; the kubelet retries until then.")

    async def _check_tenancy(self, claim: ClaimRef, results: list[AllocationResult],
                             devices: dict[str, Device]) -> None:
        """The line behind the tenancy rule: the claim's namespace must be one the device's policy
        names now (``spec.tenants``; for an admin-access request ``spec.adminAccess.namespaces``),
        read from the API server, not from a cache. The rule judges the allocation when the
        scheduler writes it; this holds when it did not (its binding deleted, and the controller not
        yet probing again) and when the policy dropped the namespace since. It checks membership
        only: the rule's other clauses (limits, UIDs, taints) and a second pod on a claim already
        prepared on this node are the rule's alone. A claim already prepared keeps its answer."""
        wanted = sorted({(devices[r["device"]].policy, bool(r.get("adminAccess"))) for r in results})
        for policy, admin in wanted:
            try:
                body = await self.kube.get(policy_path(policy))
            except NotFound:
                raise NotATenant(f"claim {claim} was allocated devices of GpuSlicePolicy {policy}, which does"
                                 " not exist now; they are given to no container (if the policy is being"
                                 " replaced, the kubelet's retry succeeds once it is back; else delete the"
                                 " pod).") from None
            except KubeError as error:
                raise PluginError(f"claim {claim}: reading GpuSlicePolicy {policy}, whose devices it was"
                                  f" allocated, failed ({error}); the kubelet retries.") from error
            if admin:
                allowed = set(admin_namespaces(body))
                field = "spec.adminAccess.namespaces"
            else:
                allowed = set(tenant_namespaces(body))
                field = "spec.tenants"
            if claim.namespace not in allowed:
                raise NotATenant(
                    f"claim {claim} was allocated {'admin access to ' if admin else ''}devices of GpuSlicePolicy"
                    f" {policy}, but namespace {claim.namespace} is not in its {field}; they are given to no"
                    f" container. Ask the policy's owner to add {claim.namespace} to {field}, or delete the pod.")

    async def _finish(self, claim: ClaimRef, checkpoint: ClaimCheckpoint,
                      devices: dict[str, Device]) -> list[PreparedDevice]:
        edits: dict[str, cdi.ContainerEdits] = {}
        done = []
        shared = cdi.ContainerEdits()
        daemons = await self._mps_daemons(claim, checkpoint)
        for record in checkpoint.devices:
            instance = await prep_of(record.mode).prepare(self.ops, record)
            if instance is not None and record.mig is not None:
                record = record.model_copy(update={"mig": record.mig.model_copy(update={
                    "gi": instance.gi, "ci": instance.ci, "uuid": instance.uuid})})
            device = devices[record.device]
            name = cdi.device_name(claim.uid, record.device)
            access = await self._access(claim, record, device, instance)
            edits[name] = access.edits
            if access.common is not None:  # the NVIDIA toolkit's libraries and hooks, once per claim
                shared = shared + access.common
            done.append(record.model_copy(update={"cdi_ids": [cdi.qualified(name)]}))
        for key, dirs in daemons.items():
            # Every MPS device of the claim is on this GPU (checked at start): once for the claim, its
            # containers may allocate all of them.
            allocated = sum(grant_memory(d, devices[d.device]) for d in checkpoint.devices if d.mps)
            shared += client_edits(dirs, allocated, present_gpu(self.ops, key.gpu).memory)
        common = shared + cdi.ContainerEdits(env=prefixed({"CLAIM": str(claim), "DEVICES": ",".join(
            r.device for r in done)}))
        spec = cdi.claim_spec(edits, common)
        spec_file = await asyncio.to_thread(self.cdi.write, claim.uid, spec) if done else None
        kill_point("prepare-cdi-written")
        completed = checkpoint.model_copy(update={"phase": "completed", "devices": done, "cdi_spec": spec_file})
        await asyncio.to_thread(self.checkpoints.write, completed)
        log.info("claim prepared", claim=str(claim), uid=claim.uid, devices=[d.device for d in done])
        return done

    async def _mps_daemons(self, claim: ClaimRef, checkpoint: ClaimCheckpoint) -> dict[DaemonKey, DaemonDirs]:
        """The MPS control daemon of the claim's namespace on each GPU the claim has MPS devices on,
        running (started if needed)."""
        found = {}
        for key in sorted(mps_keys(checkpoint)):
            try:
                found[key] = await self.mps.ensure(key)
            except MpsError as error:
                raise DeviceUnusable(f"claim {claim}: {error}") from error
        if found:
            kill_point("prepare-mps-started")
        return found

    def _needs_mps(self, key: DaemonKey) -> Callable[[], bool]:
        return lambda: key in self.mps_daemons()

    def mps_daemons(self) -> set[DaemonKey]:
        """The MPS control daemons that must run: of each GPU and namespace a checkpoint (any phase)
        has MPS devices on."""
        return {key for c in self.checkpoints.all() for key in mps_keys(c)}

    async def _access(self, claim: ClaimRef, record: PreparedDevice, device: Device,
                      instance: MigInstance | None) -> Access:
        """The device's edits: its ``GPUSLICE_*`` variables and what the backend gives (on NVIDIA
        nodes its device nodes; the toolkit's common edits come back separately)."""
        grant = Grant(claim=str(claim), request=record.request, device=device, share_id=record.share_id,
                      consumed_memory=record.consumed_memory, admin_access=record.admin_access,
                      mig_uuid=instance.uuid if instance else None)
        gpu = present_gpu(self.ops, record.gpu_uuid, record.device)
        try:
            access = await self.ops.call(self.ops.backend.access, grant, gpu, instance)
        except GpuBackendError as error:
            raise DeviceUnusable(f"device {record.device} of claim {claim}: {error}") from error
        return replace(access, edits=cdi.ContainerEdits(env=environment(grant)) + access.edits)

    # Unprepare and undo

    async def unprepare(self, claim: ClaimRef) -> None:
        async with self._lock(claim.uid):
            checkpoint = self.checkpoints.read(claim.uid)
            if checkpoint is None:
                # Nothing recorded: at most a spec of a crashed prepare is left.
                await asyncio.to_thread(self.cdi.remove, claim.uid)
                return
            try:
                await self.undo(checkpoint)
            except (GpuBackendError, PluginError) as error:
                raise UnprepareFailed(f"claim {claim}: {error}; the kubelet retries") from error
            log.info("claim unprepared", claim=str(claim), uid=claim.uid)

    async def undo(self, checkpoint: ClaimCheckpoint) -> None:
        """Remove what the claim's prepare made (what it recorded it would make), its CDI spec, then its
        checkpoint; in that order, so a crash midway leaves the checkpoint to finish the job."""
        for record in checkpoint.devices:
            await prep_of(record.mode).unprepare(self.ops, record)
        await asyncio.to_thread(self.cdi.remove, checkpoint.uid)
        await asyncio.to_thread(self.checkpoints.remove, checkpoint.uid)
        for key in sorted(mps_keys(checkpoint)):
            await self.mps.release(key, self._needs_mps(key))
