"""The MIG manager: make each GPU of a static ``mig.layout`` have exactly that layout's instances, and
each GPU that a layout, dynamic MIG or anyone's instances left be what its policy wants now.

It works inside the publisher's cycle, under its lock:

0. ``release`` (before planning): a GPU nothing of which is published or prepared any more loses the
   MIG instances its policy does not want, and its MIG mode where a whole-GPU, memory or shared
   policy takes it and the agent may switch it (``planning.node.mig_release``);
1. ``adjust`` (before the safety layer): a GPU whose instances differ from its layout
   publishes the devices of the instances it really has, never those of the layout;
2. ``statuses``: such a GPU's devices drain with ``gpuslice.dev/reconfiguring:NoSchedule``
   and are listed in the drain list (``agent.drain``), so the API server refuses any claim
   that would get one: at once if a claim holds one (it must empty out), otherwise one GPU
   at a time, so the node never loses more than one free GPU's capacity to a reconfiguration;
3. ``reconfigure`` (after the slices are written): once the API server refuses every device
   of the draining GPU (the drain probe) and the claims read after that show none of them,
   the GPU is changed under its lock (MIG mode on, unwanted instances destroyed, wanted ones
   created), and the next cycle publishes the new devices.

If a step fails, the steps done are undone in reverse (the GPU is back at its last good
layout), its devices carry ``gpuslice.dev/mig-failed`` (effect ``None``: the last good
layout still serves claims; the controller reports it in the policy's status), an Event
on the policy says what failed, and the same spec is not tried again before
``retry_after`` seconds. Applied layouts are recorded in the state directory, so the
kubelet plugin knows which instances are a layout's (never made or destroyed by prepare).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from gpuslice.agent.events import policy_ref, record_event
from gpuslice.agent.files import write_atomic
from gpuslice.agent.gpus import GpuBackendError
from gpuslice.agent.node_state.gpuops import GpuOps
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.backoff import spread
from gpuslice.dra.names import MIG_FAILED_TAINT_KEY, RECONFIGURING_TAINT_KEY
from gpuslice.dra.wire import device_gpu
from gpuslice.inventory.gpus import Gpu
from gpuslice.jsontypes import Object
from gpuslice.kube.client import KubeClient
from gpuslice.planning.devices import Device
from gpuslice.planning.node.coexistence import mig_manager_active
from gpuslice.planning.node.mig_layout import Instance, LayoutTarget, Step, devices_of, inverse, layout_targets, steps
from gpuslice.planning.node.mig_release import Wants, release, wants
from gpuslice.planning.node.node_pool import NodePlan

log = structlog.get_logger(__name__)
APPLIED_FILE = "mig-layouts.json"


@dataclass
class Failure:
    policy: str
    generation: int
    at: float
    message: str
    wait: float = 0.0  # seconds from ``at`` before the same generation is tried again (jittered)


@dataclass
class Pending:
    """A GPU whose instances do not match its layout yet."""

    target: LayoutTarget
    gpu: Gpu
    mig_enabled: bool
    existing: tuple[Instance, ...]
    policy: GpuSlicePolicy


@dataclass
class MigManager:
    node: str
    ops: GpuOps
    state_dir: Path
    retry_after: float = 600.0
    pending: dict[str, Pending] = field(default_factory=dict)
    failed: dict[str, Failure] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)  # pending GPUs a claim holds a device of
    draining: str | None = None  # the free GPU draining now
    reconfigured: set[str] = field(default_factory=set)  # since the last cycle: their old devices go at once

    # The record of applied layouts

    def applied(self) -> dict[str, list[Instance]]:
        try:
            data = json.loads((self.state_dir / APPLIED_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return {uuid: [(str(p), int(s)) for p, s in entry["instances"]] for uuid, entry in data.items()}

    def _record(self, uuid: str, policy: str, instances: Iterable[Instance]) -> None:
        try:
            data: dict[str, Any] = json.loads((self.state_dir / APPLIED_FILE).read_text())
        except (FileNotFoundError, ValueError):
            data = {}
        data[uuid] = {"policy": policy, "instances": [list(i) for i in sorted(instances)]}
        write_atomic(self.state_dir / APPLIED_FILE, json.dumps(data, indent=2, sort_keys=True))

    def _forget(self, uuid: str) -> None:
        """The GPU's layout is gone (its instances destroyed): prepare may make instances there again."""
        try:
            data: dict[str, Any] = json.loads((self.state_dir / APPLIED_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return
        if data.pop(uuid, None) is not None:
            write_atomic(self.state_dir / APPLIED_FILE, json.dumps(data, indent=2, sort_keys=True))

    def static_gpus(self) -> set[str]:
        """GPUs whose instances belong to a static layout (prepare never makes or destroys them)."""
        return set(self.applied()) | {p.gpu.uuid for p in self.pending.values()}

    # 0. Each GPU's MIG mode, as the GPU has it now

    async def refresh(self, gpus: Sequence[Gpu]) -> list[Gpu]:
        """``gpus`` with the MIG mode each has now, for the planner: the agent switches it (dynamic
        prepare, layouts), and so may an admin (with a GPU reset, below Hopper), whose change is
        seen at the next cycle. A GPU whose mode cannot be read keeps the last one known (its
        health check reports the GPU; one lost GPU does not stop the node's publishing)."""
        found = []
        for gpu in gpus:
            known = self.ops.gpus.get(gpu.uuid, gpu)
            if gpu.mig_capable:
                try:
                    async with self.ops.lock(gpu.uuid):
                        enabled = await self.ops.call(self.ops.backend.mig_enabled, gpu)
                except GpuBackendError as error:
                    log.warning("could not read the GPU's MIG mode; the last one known stands", node=self.node,
                                gpu=gpu.uuid, error=str(error))
                    enabled = known.mig_enabled
                if enabled != known.mig_enabled:
                    log.info("GPU's MIG mode changed", node=self.node, gpu=gpu.uuid, index=gpu.index,
                             mig_enabled=enabled)
                gpu = replace(gpu, mig_enabled=enabled)
                if gpu.uuid in self.ops.gpus:
                    self.ops.gpus[gpu.uuid] = replace(known, mig_enabled=enabled)
            found.append(gpu)
        return found

    async def release(self, gpus: Sequence[Gpu], plan: NodePlan, policies: Sequence[GpuSlicePolicy],
                      labels: Mapping[str, str], busy: set[str]) -> list[Gpu]:
        """``gpus`` after each GPU whose MIG instances the plan no longer wants was made as it wants it
        (``planning.node.mig_release``): its unwanted instances destroyed, its applied layout forgotten,
        and, where a whole-GPU, memory or shared policy takes it and the agent may (Hopper or later),
        MIG mode switched off, as NVIDIA's DRA driver's ``maybeDisableMigMode``. Only GPUs nothing of
        which is published or prepared (``busy``: their old devices still drain, or a claim holds one),
        one at a time, under each GPU's lock; not where the GPU Operator's MIG manager runs (its
        config owns MIG). The next plan then publishes."""
        if mig_manager_active(labels):
            return list(gpus)
        layouts = set(layout_targets(plan.typed, policies))
        applied = self.applied()
        found = []
        for gpu in gpus:
            want = wants(plan, layouts, gpu)
            if (gpu.mig_capable and gpu.uuid not in busy and gpu.uuid not in self.pending
                    and (gpu.uuid in applied or (want == "whole" and gpu.mig_enabled))):
                gpu = await self._release(gpu, want, applied.get(gpu.uuid))
            found.append(gpu)
        return found

    async def _release(self, gpu: Gpu, want: Wants, recorded: Sequence[Instance] | None) -> Gpu:
        where = {"node": self.node, "gpu": gpu.uuid, "index": gpu.index}
        async with self.ops.lock(gpu.uuid):
            try:
                instances = await self.ops.call(self.ops.backend.mig_instances, gpu)
                todo = release(gpu, want, recorded, [(i.profile, i.start) for i in instances])
                if todo is None:
                    return gpu
                for instance in instances:
                    if (instance.profile, instance.start) in todo.destroy:
                        await self.ops.call(self.ops.backend.destroy_mig, gpu, instance)
                if todo.destroy:
                    log.info("MIG instances no policy wants destroyed", **where, wants=want,
                             instances=_layout(todo.destroy))
                if todo.forget:
                    self._forget(gpu.uuid)
                if todo.mig_off:
                    await self.ops.call(self.ops.backend.set_mig_mode, gpu, False)
                    log.info("MIG mode switched off: a policy takes the GPU whole", **where)
                    gpu = replace(gpu, mig_enabled=False)
                    if gpu.uuid in self.ops.gpus:
                        self.ops.gpus[gpu.uuid] = replace(self.ops.gpus[gpu.uuid], mig_enabled=False)
            except GpuBackendError as error:
                log.warning("could not make the GPU as its policy wants it; tried again next cycle", **where,
                            wants=want, error=str(error))
        return gpu

    # 1. What each static GPU publishes

    async def adjust(self, plan: NodePlan, policies: Sequence[GpuSlicePolicy]) -> NodePlan:
        """The plan with each static GPU publishing the instances it has, each device carrying its
        instance's UUID as NVIDIA's static MIG devices do (``MigDeviceInfo.GetDevice``: ``uuid``)."""
        by_name = {p.name: p for p in policies}
        targets = layout_targets(plan.typed, policies)
        pending: dict[str, Pending] = {}
        replaced: dict[str, list[Device]] = {}
        uuids: dict[str, dict[Instance, str]] = {}
        for uuid, target in sorted(targets.items()):
            gpu = self.ops.gpus.get(uuid)
            if gpu is None:
                continue
            async with self.ops.lock(uuid):
                enabled = await self.ops.call(self.ops.backend.mig_enabled, gpu)
                instances = await self.ops.call(self.ops.backend.mig_instances, gpu)
            existing = tuple(sorted((i.profile, i.start) for i in instances))
            uuids[uuid] = {(i.profile, i.start): i.uuid for i in instances if i.uuid}
            if enabled and set(existing) == set(target.instances):
                if uuid not in self.applied() or sorted(self.applied()[uuid]) != sorted(existing):
                    self._record(uuid, target.policy, existing)  # matched already (e.g. made by hand)
                self.failed.pop(uuid, None)
                continue
            policy = by_name[target.policy]
            pending[uuid] = Pending(target, gpu, enabled, existing, policy)
            replaced[uuid] = devices_of(gpu, policy, existing) if enabled else []
        # Dynamic MIG on a GPU that a layout left: its devices wait until release() destroyed the layout's
        # instances, which hold placements they would offer as free.
        applied = self.applied()
        for device in plan.typed:
            if device.traits.instances and device.gpu_uuid in applied and device.gpu_uuid not in targets:
                replaced[device.gpu_uuid] = []
        self.pending = pending
        if self.draining not in pending:
            self.draining = None
        if not replaced and not any(uuids.values()):
            return plan
        typed = [d for d in plan.typed if d.gpu_uuid not in replaced]
        typed += [d for found in replaced.values() for d in found]
        typed = [_with_instance_uuid(d, uuids.get(d.gpu_uuid, {})) for d in typed]
        typed.sort(key=lambda d: (d.memory, d.name))
        return replace(plan, typed=tuple(typed))

    def drained(self, published: Iterable[dict[str, Any]]) -> set[str]:
        """Devices of GPUs reconfigured since the last cycle: their instances are gone, so they go now."""
        gone = {d["name"] for d in published if device_gpu(d) in self.reconfigured}
        self.reconfigured = set()
        return gone

    # 2. Taints

    def statuses(self, allocated: set[str], published: Iterable[dict[str, Any]]) -> dict[str, list[Object]]:
        by_gpu: dict[str, set[str]] = {}
        for device in published:
            if (gpu := device_gpu(device)) is not None:
                by_gpu.setdefault(gpu, set()).add(str(device["name"]))
        self.busy = {uuid for uuid in self.pending if by_gpu.get(uuid, set()) & allocated}
        if self.draining is None:
            now = time.monotonic()
            free = sorted((p.gpu.index, uuid) for uuid, p in self.pending.items()
                          if uuid not in self.busy and not self._waiting_retry(uuid, now))
            if free:
                self.draining = free[0][1]
        taints: dict[str, list[Object]] = {}
        for uuid in self.busy | ({self.draining} if self.draining else set()):
            taints[uuid] = [{"key": RECONFIGURING_TAINT_KEY, "effect": "NoSchedule"}]
        for uuid in self.failed:
            taints.setdefault(uuid, []).append({"key": MIG_FAILED_TAINT_KEY, "value": "rolled-back", "effect": "None"})
        return taints

    def _waiting_retry(self, uuid: str, now: float) -> bool:
        failure = self.failed.get(uuid)
        pending = self.pending.get(uuid)
        if failure is None or pending is None:
            return False
        same_spec = (failure.policy, failure.generation) == (pending.policy.name, pending.policy.metadata.generation)
        return same_spec and now - failure.at < (failure.wait or self.retry_after)

    def draining_devices(self, published: Iterable[dict[str, Any]]) -> set[str]:
        """Published devices of GPUs that drain for a reconfiguration: they go on the drain list."""
        gpus = self.busy | ({self.draining} if self.draining else set())
        return {str(d["name"]) for d in published if device_gpu(d) in gpus}

    # 3. Reconfiguring

    async def reconfigure(self, kube: KubeClient | None, allocated: set[str], published: Iterable[dict[str, Any]],
                          refused: set[str]) -> bool:
        """Reconfigure the draining GPU once the API server refuses every one of its devices to claims
        (``refused``, the drain probe's answer) and the claims read after that hold none of them;
        whether it changed anything."""
        uuid = self.draining
        if uuid is None:
            return False
        devices = {str(d["name"]) for d in published if device_gpu(d) == uuid}
        if devices & allocated:
            self.draining = None  # a claim got one after all: the GPU waits as a busy one
            return False
        if not devices <= refused:
            return False  # not yet proven: the next cycle asks again
        pending = self.pending[uuid]
        sizes = {p.name: p.size for p in pending.gpu.mig_profiles}
        plan = steps(pending.mig_enabled, pending.existing, pending.target.instances, sizes)
        gpu = pending.gpu
        where = f"GPU {gpu.index} ({gpu.uuid}) of node {self.node}"
        log.info("reconfiguring MIG layout", node=self.node, gpu=uuid, index=gpu.index, policy=pending.policy.name,
                 steps=[s.describe() for s in plan])
        done: list[Step] = []
        async with self.ops.lock(uuid):
            try:
                for step in plan:
                    await self._apply(gpu, step)
                    done.append(step)
            except GpuBackendError as error:
                rollback = await self._undo(gpu, done)
                message = (f"{where} could not be reconfigured to the layout of policy {pending.policy.name}"
                           f" ({_layout(pending.target.instances)}): {error}. {rollback} Its devices carry"
                           f" {MIG_FAILED_TAINT_KEY}; the agent tries again after about {self.retry_after:g} s or"
                           " when the policy changes.")
                log.error("MIG reconfiguration failed", node=self.node, gpu=uuid, policy=pending.policy.name,
                          error=str(error), rollback=rollback)
                self.failed[uuid] = Failure(pending.policy.name, pending.policy.metadata.generation,
                                            time.monotonic(), message, spread(self.retry_after))
                self.draining = None
                await record_event(kube, self.node, policy_ref(pending.policy.name, pending.policy.metadata.uid),
                                   "MigReconfigurationFailed", message)
                return True
        self._record(uuid, pending.policy.name, pending.target.instances)
        self.failed.pop(uuid, None)
        self.reconfigured.add(uuid)
        self.draining = None
        log.info("MIG layout applied", node=self.node, gpu=uuid, index=gpu.index, policy=pending.policy.name,
                 instances=_layout(pending.target.instances))
        await record_event(kube, self.node, policy_ref(pending.policy.name, pending.policy.metadata.uid),
                           "MigReconfigured", f"{where} now has the layout of policy {pending.policy.name}:"
                           f" {_layout(pending.target.instances)}.", "Normal")
        return True

    async def _apply(self, gpu: Gpu, step: Step) -> None:
        backend = self.ops.backend
        if step.action == "enable-mig":
            await self.ops.call(backend.set_mig_mode, gpu, True)
        elif step.action == "destroy":
            for instance in await self.ops.call(backend.mig_instances, gpu):
                if (instance.profile, instance.start) == (step.profile, step.start):
                    await self.ops.call(backend.destroy_mig, gpu, instance)
        else:
            profile = gpu.mig_profile(step.profile)
            if profile is None:
                raise GpuBackendError(f"GPU {gpu.index} has no MIG profile {step.profile}")
            await self.ops.call(backend.create_mig, gpu, profile, step.start)

    async def _undo(self, gpu: Gpu, done: Sequence[Step]) -> str:
        try:
            for step in inverse(done):
                await self._apply(gpu, step)
        except GpuBackendError as error:
            return (f"Rolling back failed too ({error}): the GPU has the instances it has now, and publishes"
                    " exactly those.")
        return "It was rolled back to its last good layout."


def _with_instance_uuid(device: Device, uuids: dict[Instance, str]) -> Device:
    if device.profile is None or device.placement is None:
        return device
    found = uuids.get((device.profile, device.placement[0]))
    return replace(device, mig_uuid=found) if found else device


def _layout(instances: Iterable[Instance]) -> str:
    counts: dict[str, int] = {}
    for profile, _ in instances:
        counts[profile] = counts.get(profile, 0) + 1
    return ", ".join(f"{n} x {p}" for p, n in sorted(counts.items())) or "no instances"
