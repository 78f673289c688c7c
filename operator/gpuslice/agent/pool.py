"""The node's pool: everything the agent keeps about it, and its publish cycle as read, plan, write.

One ``NodePool`` per agent process, built once (``agent.run``) and handed to whatever works on the
pool: the publish loop, the kubelet plugin (its lock, its GPUs, the MIG manager's static layouts)
and the usage collector (the published record). Upstream's example driver keeps its node state in
one object the same way (``dra-example-kubeletplugin``'s ``DeviceState``).

A cycle (``publish``) reads what it judges on (``read``), plans until the API server accepts the
plan or every policy it refuses is left out (``plan``: dry runs only), and writes the plan when it
changed (``write``). Each step can be driven alone against a fake API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog

from gpuslice.agent.coexistence import DEVICE_PLUGIN_DRIVER, OtherDrivers
from gpuslice.agent.dryrun import Accepted, GenerationRefused, Refusals, dry_run, refused_policies
from gpuslice.agent.node_state.gpuops import GpuOps
from gpuslice.agent.pool_state import PoolState
from gpuslice.agent.published import Published
from gpuslice.agent.publisher import (
    CLAIM_READS,
    CYCLES,
    DEVICES,
    FIELD_MANAGER,
    HELD,
    REFUSED,
    Policies,
    PublishResult,
    allocated_devices,
    sort_policies,
)
from gpuslice.agent.watches import AgentView
from gpuslice.api.agent_view import policy_of, views_in
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.coordinates import SLICES, node_path, slice_path
from gpuslice.dra.names import DRIVER, PENDING_TAINT_KEY, RECONFIGURING_TAINT_KEY
from gpuslice.dra.resourceslice import resource_slice, slice_name
from gpuslice.dra.slice_wire import slice_counter_sets, slice_devices, slice_pool
from gpuslice.dra.support import lost_fields
from gpuslice.dra.wire import device_gpu, device_policy, pool_mark
from gpuslice.inventory.gpus import Gpu
from gpuslice.jsontypes import Object
from gpuslice.kube.client import KubeClient, KubeError, NotFound
from gpuslice.observability.failpoints import failpoint
from gpuslice.planning.defrag.node_taints import freeing_on_node, with_defrag_taints
from gpuslice.planning.left_out import ANNOTATION as LEFT_OUT
from gpuslice.planning.left_out import LeftOut, left_out_annotations
from gpuslice.planning.node import device_plugins
from gpuslice.planning.node.coexistence import other_driver_gpus, taken_gpus
from gpuslice.planning.node.node_pool import NodePlan, PlannedSlice, plan_node_pool
from gpuslice.planning.node.pool_safety import SafePlan, changing, make_safe, normalized, with_statuses
from gpuslice.planning.node.taints import status_taints_by_gpu

log = structlog.get_logger(__name__)


def _pending(device: dict[str, Any]) -> bool:
    return any(t.get("key") == PENDING_TAINT_KEY for t in device.get("taints") or [])


def _reconfiguring(device: dict[str, Any]) -> bool:
    return any(t.get("key") == RECONFIGURING_TAINT_KEY for t in device.get("taints") or [])


def _content(spec: dict[str, Any]) -> Any:
    return normalized({"sharedCounters": slice_counter_sets(spec), "devices": slice_devices(spec)})


def _left_out(slice_: Mapping[str, Any]) -> str | None:
    return ((slice_.get("metadata") or {}).get("annotations") or {}).get(LEFT_OUT)


def _records(last: Published | None, generation: int, devices: list[dict[str, Any]],
             counter_sets: list[dict[str, Any]]) -> bool:
    """Whether ``last`` records this generation as published (quantities by value, taint times ignored)."""
    return last is not None and last.generation == generation and normalized(
        {"devices": last.devices, "sharedCounters": last.counter_sets}) == normalized(
        {"devices": devices, "sharedCounters": counter_sets})


def _generations(policies: Policies) -> dict[str, int | None]:
    return {p.name: p.metadata.generation for p in policies.plannable}


@dataclass(frozen=True)
class Observed:
    """What one cycle judges on, read once at its start."""

    node_body: dict[str, Any]
    policy_bodies: list[dict[str, Any]]  # as listed: their defragmentation status taints devices
    policies: Policies
    gpus: list[Gpu]  # those this pool may publish: other drivers' left out, MIG modes as they are now
    existing: list[dict[str, Any]]  # this pool's slices
    published: list[dict[str, Any]]  # their devices (the record's, when the kubelet wiped the pool)
    counter_sets: list[dict[str, Any]]
    last: Published | None  # the record of the last write
    drained: set[str]  # tainted devices no claim can get any more
    allocated: set[str]  # devices claims (or this node's prepares) hold; read only when a change needs them
    statuses: Mapping[str, Sequence[Object]]  # the GPUs' health taints, by UUID
    # GPUs a device plugin on the node holds, for the controller's condition (planning.node.device_plugins)
    device_plugin: tuple[LeftOut, ...] = ()

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.node_body["metadata"].get("labels") or {})

    @property
    def current(self) -> dict[str, dict[str, Any]]:
        return {s["metadata"]["name"]: s for s in self.existing}

    @property
    def generation(self) -> int:
        """The pool's generation now: the newest of its slices and its record."""
        seen = {pool_mark(s["spec"])[1] for s in self.existing}
        return max(seen | ({self.last.generation} if self.last is not None else set()), default=0)


@dataclass(frozen=True)
class PoolPlan:
    """What a cycle would publish, made safe, as the API server accepts it (its dry run passed)."""

    plan: NodePlan
    safe: SafePlan
    slices: tuple[PlannedSlice, ...]  # with health, MIG and defragmentation taints
    refused: dict[str, str]  # policies left out: the API server refused their devices
    listed: set[str]  # the node's drain list after this cycle
    manifests: dict[str, dict[str, Any]]  # name -> ResourceSlice; empty when nothing is to be written
    unchanged: bool  # the pool publishes this already (or nothing, and should)


class NodePool:
    """This node's pool and what the agent keeps about it between cycles.

    ``gpus`` are those found at start; ``ops`` changes them one call at a time per GPU. ``lock``:
    a cycle runs under it, and so does prepare's check that a device is published, so the two
    never interleave. ``state``: what the pool is built with besides (``agent.pool_state``: the
    record, the checkpoints and the MIG manager, kept in the node's state directory; the drains; the
    GPUs' health taints; the modes the API server cannot serve). ``refusals``: the policies whose
    devices the API server refused (``agent.dryrun``). A GPU another DRA driver publishes on the
    node is left out (its allocated devices held as any GPU's that went), and ``others`` tells
    people. GPUs the plan leaves out for a state only the agent sees (``planning.left_out``) are
    written on every slice of the pool, on an empty one when it has no device, for the controller.
    """

    def __init__(self, node: str, kube: KubeClient, ops: GpuOps, state: PoolState) -> None:
        self.node, self.kube, self.ops, self.state = node, kube, ops, state
        self.gpus: list[Gpu] = list(ops.gpus.values())
        self.lock = asyncio.Lock()
        self.refusals, self.others = Refusals(), OtherDrivers()
        self.accepted = Accepted()  # dry runs' yes, for a cycle that tries its write again
        self.view: AgentView | None = None  # the watches' view of the last cycle: this agent's writes go in it

    def held(self) -> set[str]:
        """Devices of this pool that a local checkpoint names (prepared, or being prepared): counted
        as allocated even before the claim's status says so. Not those prepared with admin access,
        which takes no device and holds nothing back."""
        if self.state.checkpoints is None:
            return set()
        return {d.device for c in self.state.checkpoints.all() for d in c.devices if not d.admin_access}

    def held_gpus(self) -> set[str]:
        """GPUs a local checkpoint holds a device of (not with admin access, as ``held``)."""
        if self.state.checkpoints is None:
            return set()
        return {d.gpu_uuid for c in self.state.checkpoints.all() for d in c.devices if not d.admin_access}

    def static_gpus(self) -> set[str]:
        """GPUs whose MIG instances a static layout owns (prepare never makes or destroys them)."""
        return self.state.mig.static_gpus() if self.state.mig is not None else set()

    def waits_for_claims(self, result: PublishResult) -> bool:
        """Whether a change waits for a claim to go (the agent then watches claims)."""
        return bool(result.held) or bool(self.state.mig is not None and self.state.mig.pending)

    async def publish(self, view: AgentView | None = None) -> PublishResult:
        """One cycle (the caller holds ``lock``). With a synced ``view``, the policies and the Node
        come from the agent's watches; without, they are read."""
        observed = await self.read(view)
        return await self.write(observed, await self.plan(observed))

    # Read

    async def read(self, view: AgentView | None = None) -> Observed:
        """The Node, the policies, this node's slices (every driver's, in one read) and, when the
        first plan would remove or alter a published device or a drain or a MIG reconfiguration
        waits, every claim. The claims are read after the drains' probes, so a claim that got a
        tainted device before the API server refused it is seen (and keeps it)."""
        kube, node, mig = self.kube, self.node, self.state.mig
        held, statuses = self.held(), self.state.statuses()
        self.view = view
        if view is not None and view.synced:
            if view.node is None:
                raise NotFound(404, "NotFound", f'nodes "{node}" not found',
                               {"details": {"kind": "nodes", "name": node}})
            node_body, bodies = view.node, list(view.policies.values())
            policies = sort_policies(bodies, self.state.unsupported, view.parsed)
        else:
            node_body = await kube.get(node_path(node))
            bodies = [policy_of(v) for v in await kube.list(views_in(self.state.drains.home))]
            policies = sort_policies(bodies, self.state.unsupported)
        labels = node_body["metadata"].get("labels") or {}
        if view is not None and view.synced and view.slices_listed.is_set():
            on_node = list(view.slices.values())  # as the watch holds them, with this agent's own writes
        else:
            on_node = await kube.list(SLICES, fieldSelector=f"spec.nodeName={node}")
        existing = [s for s in on_node if s["spec"].get("driver") == DRIVER and slice_pool(s["spec"]) == node]
        taken = taken_gpus(self.gpus, [other_driver_gpus(s["spec"]) for s in on_node
                                       if s["spec"].get("driver") != DRIVER])
        plugin = device_plugins.advertised(node_body)  # its resources name no GPU: every GPU is its
        if plugin:
            taken = {g.uuid: (DEVICE_PLUGIN_DRIVER, device_plugins.describe(plugin)) for g in self.gpus}
        await self.others.report(kube, node, self.gpus, taken)
        gpus = [g for g in self.gpus if g.uuid not in taken]
        if mig is not None:
            gpus = await mig.refresh(gpus)
        published = [d for s in existing for d in slice_devices(s["spec"])]
        counter_sets = [c for s in existing for c in slice_counter_sets(s["spec"])]
        last = self.state.record.load() if self.state.record is not None else None
        if not existing and last is not None and last.devices:
            published, counter_sets = last.devices, last.counter_sets
            log.warning("the pool's slices are gone (the kubelet wipes them when the plugin was away); republishing"
                        " from the agent's record, allocated devices unchanged", node=node, devices=len(published))
        if mig is not None:  # a GPU whose MIG instances its policy no longer wants, once nothing of it is published
            busy = {gpu for d in published if (gpu := device_gpu(d)) is not None} | self.held_gpus()
            gpus = await mig.release(gpus, plan_node_pool(labels, gpus, policies.plannable), policies.plannable,
                                     labels, busy)
        await self.state.drains.load(kube, node)
        drained = await self.state.drains.refused(
            kube, node, {d["name"] for d in published if _pending(d) or _reconfiguring(d)})
        drained |= mig.drained(published) if mig is not None else set()
        # Leaving refused policies out later only freezes more devices, so this plan is the most that can change.
        first = await self._planned(labels, gpus, [p for p in policies.plannable
                                                   if p.name not in self.refusals.current(_generations(policies))])
        at_stake = changing(first, published, {d["name"] for d in published if device_policy(d) in policies.frozen})
        # A GPU waiting for a MIG reconfiguration is judged on the claims too: never under a claim.
        needed = bool(at_stake or drained or (mig is not None and mig.pending))
        allocated = (await allocated_devices(kube, node) if needed else set()) | held
        CLAIM_READS.labels(outcome="read" if needed else "skipped").inc()
        return Observed(node_body, bodies, policies, gpus, existing, published, counter_sets, last, drained,
                        allocated, statuses,
                        device_plugins.left_out(labels, self.gpus, policies.plannable, plugin))

    async def _planned(self, labels: Mapping[str, str], gpus: list[Gpu], policies: list[GpuSlicePolicy]) -> NodePlan:
        plan = plan_node_pool(labels, gpus, policies)
        return await self.state.mig.adjust(plan, policies) if self.state.mig is not None else plan

    # Plan

    async def plan(self, observed: Observed) -> PoolPlan:
        """The plan, made safe and tainted, as the API server accepts it: a generation it refuses in
        a dry run leaves out the policies it blames, and is planned again (each round leaves out at
        least one more, or raises ``GenerationRefused``)."""
        node, mig, o = self.node, self.state.mig, observed
        generations = {pool_mark(s["spec"])[1] for s in o.existing}
        counts = {pool_mark(s["spec"])[2] for s in o.existing}
        current = o.current
        while True:
            refused = self.refusals.current(_generations(o.policies))
            plan = await self._planned(o.labels, o.gpus, [p for p in o.policies.plannable if p.name not in refused])
            plan = replace(plan, left_out=(*plan.left_out, *o.device_plugin))
            kept = {**o.policies.frozen, **refused}
            frozen = {d["name"] for d in o.published if device_policy(d) in kept}
            safe = make_safe(plan, o.published, o.counter_sets, o.allocated, drained=o.drained, frozen=frozen)
            gpu_statuses = status_taints_by_gpu(o.statuses,
                                                mig.statuses(o.allocated, o.published) if mig else {})
            slices = with_statuses(safe.slices, gpu_statuses)
            slices = with_defrag_taints(slices, freeing_on_node(o.policy_bodies, node,
                                                                datetime.datetime.now(datetime.UTC)))
            told = left_out_annotations(plan.left_out)
            if not slices and told:
                slices = (PlannedSlice("devices-00"),)
            wanted = {slice_name(node, s.suffix): s for s in slices}
            unchanged = (
                set(wanted) == set(current) and len(generations) == 1 and counts == {len(wanted)}
                and all(_content(current[name]["spec"]) == normalized({"sharedCounters": list(s.shared_counters),
                                                                       "devices": list(s.devices)})
                        and _left_out(current[name]) == told.get(LEFT_OUT) for name, s in wanted.items())
            )
            DEVICES.set(sum(len(s.devices) for s in slices))
            HELD.set(len(safe.held))
            REFUSED.set(len(refused))
            reconfiguring = mig.draining_devices(o.published) if mig is not None else set()
            listed = self.state.drains.wanted(set(safe.draining) | reconfiguring, {d["name"] for d in o.published},
                                        {d["name"] for s in slices for d in s.devices})
            if unchanged or (not wanted and not current):
                return PoolPlan(plan, safe, slices, refused, listed, {}, unchanged=True)
            manifests = {name: resource_slice(
                node, o.node_body["metadata"]["uid"], planned.suffix, o.generation + 1, len(wanted),
                shared_counters=list(planned.shared_counters), devices=list(planned.devices), annotations=told,
            ) for name, planned in wanted.items()}
            answers = await dry_run(self.kube, manifests.values(), FIELD_MANAGER, self.accepted)
            if not answers:
                return PoolPlan(plan, safe, slices, refused, listed, manifests, unchanged=False)
            blamed = await refused_policies(self.kube, manifests.values(), answers, FIELD_MANAGER)
            if not set(blamed) - set(refused):
                raise GenerationRefused(f"the API server still refuses the pool's next generation: {blamed}")
            for name, reason in sorted(blamed.items()):
                log.warning("devices refused by the API server; the policy is left out on this node, its published"
                            " devices stay as they are", node=node, policy=name, reason=reason)
            self.refusals.record(blamed, _generations(o.policies))

    # Write

    async def write(self, observed: Observed, plan: PoolPlan) -> PublishResult:
        """The drain list; then, when the plan changed, the record and the slices (obsolete ones
        deleted first, as the upstream helper does); then the MIG manager's reconfiguration of a
        GPU that has drained, judged on the claims this cycle read."""
        kube, node, o, safe = self.kube, self.node, observed, plan.safe
        refused = tuple(sorted(plan.refused))
        if plan.unchanged:
            await self.state.drains.write(kube, node, plan.listed)
            if (self.state.record is not None and o.existing
                    and not _records(o.last, o.generation, o.published, o.counter_sets)):
                # Slices of an earlier agent, or a generation recorded but never written (killed first).
                self.state.record.save(Published(o.generation, o.published, o.counter_sets))
            CYCLES.labels(outcome="unchanged").inc()
            return PublishResult(o.generation, (), (), safe.held, plan.plan.notes, safe.draining, refused,
                                 await self._reconfigure(o))
        generation = o.generation + 1  # the whole generation passed the dry run: write it
        await self.state.drains.write(kube, node, plan.listed)  # devices that start draining are listed before tainted
        if self.state.record is not None:
            # Recorded before any of it is written: a claim may get a device of this generation as soon as
            # it is complete, and an agent killed before the record was saved, whose pool the kubelet then
            # wiped, republished an older one without that device (T9 of the December hostile review).
            self.state.record.save(Published(generation, [d for s in plan.slices for d in s.devices],
                                       [c for s in plan.slices for c in s.shared_counters]))
        deleted = []
        for name in sorted(set(o.current) - set(plan.manifests)):
            with contextlib.suppress(NotFound):
                await kube.delete(slice_path(name))
            if self.view is not None:
                self.view.deleted(name)
            deleted.append(name)
        written = []
        for name, manifest in plan.manifests.items():
            try:
                answer = await kube.apply(slice_path(name), manifest, field_manager=FIELD_MANAGER)
            except KubeError:
                self.accepted.forget()
                raise
            if isinstance(answer, dict) and lost_fields(manifest["spec"], answer.get("spec") or {}):
                self.accepted.forget()  # stored, but not as sent: the next cycle's dry run says whose
            if self.view is not None and answer:
                self.view.wrote(answer)
            written.append(name)
            failpoint("agent.slice-written")
        failpoint("agent.pool-written")  # the whole generation is written (its record saved before)
        CYCLES.labels(outcome="written").inc()
        again = await self._reconfigure(o)
        log.info("published pool", node=node, generation=generation,
                 devices=sum(len(s.devices) for s in plan.slices), written=len(written), deleted=deleted,
                 held=list(safe.held), draining=len(safe.draining), blocked_gpus=list(safe.blocked_gpus))
        if safe.held:
            log.warning("changes held back while claims hold devices", node=node, devices=list(safe.held))
        for note in plan.plan.notes:
            log.warning("planner note", node=node, note=note)
        for name, reason in sorted({**o.policies.frozen, **plan.refused}.items()):
            log.warning("policy's devices kept as published", node=node, policy=name, reason=reason)
        return PublishResult(generation, tuple(written), tuple(deleted), safe.held, plan.plan.notes, safe.draining,
                             refused, again)

    async def _reconfigure(self, observed: Observed) -> bool:
        """Let the MIG manager reconfigure a GPU that has drained (True: publish again now)."""
        if self.state.mig is None:
            return False
        return await self.state.mig.reconfigure(self.kube, observed.allocated, observed.published, observed.drained)
