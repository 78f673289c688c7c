"""Publish the node's pool: plan, make safe, and write only when the content changed.

Each cycle reads the authoritative state from the API server (the policies,
the Node, this pool's slices and the claims allocated from it) rather than
from watch caches, so a freshly started agent can never mistake "not listed
yet" for "not allocated".
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import pydantic
import structlog
from prometheus_client import Counter, Gauge

from gpuslice.agent.mig_manager import MigManager
from gpuslice.agent.published import Published, PublishedRecord
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.names import ATTR_POLICY, ATTRIBUTE_DOMAIN, DRIVER
from gpuslice.dra.resourceslice import resource_slice, slice_name
from gpuslice.inventory.gpus import Gpu
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.planning.node_pool import plan_node_pool
from gpuslice.planning.pool_safety import SafePlan, make_safe, normalized, with_statuses
from gpuslice.planning.taints import Taint, status_taints_by_gpu

FIELD_MANAGER = "gpuslice-agent"
CYCLES = Counter("gpuslice_agent_publish_cycles", "Publish cycles, by outcome.", ["outcome"])
DEVICES = Gauge("gpuslice_agent_devices", "Devices this agent publishes.")
HELD = Gauge("gpuslice_agent_held_devices", "Allocated devices kept as they were while a change waits.")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
ATTR_POLICY_KEY = f"{ATTRIBUTE_DOMAIN}/{ATTR_POLICY}"
# Longer than the scheduler takes from reserving a device to writing the claim's allocation.
DRAIN_SECONDS = 5.0
log = structlog.get_logger(__name__)


@dataclass
class Drains:
    """Since when each free device has been published tainted, waiting to change (this process only:
    a restarted agent drains again, which is only slower)."""

    started: dict[str, float] = field(default_factory=dict)

    def drained(self, now: float) -> set[str]:
        return {name for name, since in self.started.items() if now - since >= DRAIN_SECONDS}

    def record(self, draining: Iterable[str], now: float) -> None:
        self.started = {name: self.started.get(name, now) for name in draining}

    def due_in(self, now: float) -> float | None:
        """Seconds until the next device has drained; None when none drains."""
        return max(0.0, min(since + DRAIN_SECONDS - now for since in self.started.values())) if self.started else None


@dataclass(frozen=True)
class PublishResult:
    generation: int
    written: tuple[str, ...]
    deleted: tuple[str, ...]
    held: tuple[str, ...]
    notes: tuple[str, ...]
    draining: tuple[str, ...] = ()
    again: bool = False  # the MIG manager changed a GPU: publish again now

    @property
    def changed(self) -> bool:
        return bool(self.written or self.deleted)


async def allocated_devices(kube: KubeClient, node: str) -> set[str]:
    """Names of this pool's devices that some claim has allocated."""
    found = set()
    for claim in await kube.list("/apis/resource.k8s.io/v1/resourceclaims"):
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") == DRIVER and result.get("pool") == node:
                found.add(str(result["device"]))
    return found


@dataclass(frozen=True)
class Policies:
    """The policies to plan from, and those whose published devices stay as they are (and why)."""

    plannable: list[GpuSlicePolicy]
    frozen: dict[str, str]


def _not_yet_valid(policy: GpuSlicePolicy) -> str | None:
    """Why the controller's verdict does not cover this spec; None when it is valid."""
    status = policy.status
    if status.observed_generation != policy.metadata.generation:
        return f"generation {policy.metadata.generation} is not validated by the controller yet"
    valid = next((c for c in status.conditions if c.type == "Valid"), None)
    if valid is None or valid.status != "True":
        return f"the controller found it invalid ({valid.reason if valid else 'no Valid condition'})"
    return None


async def read_policies(kube: KubeClient) -> Policies:
    plannable, frozen = [], {}
    for body in await kube.list("/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"):
        name = body["metadata"]["name"]
        if body["metadata"].get("deletionTimestamp"):
            continue  # going away: its free devices go, allocated ones wait for their claims
        try:
            policy = GpuSlicePolicy.from_body(body)
        except pydantic.ValidationError as error:
            frozen[name] = f"it does not parse: {error.errors()[0]['msg'] if error.errors() else error}"
            continue
        reason = _not_yet_valid(policy)
        if reason is None:
            plannable.append(policy)
        else:
            frozen[name] = reason
    return Policies(plannable, frozen)


def _policy_of(device: dict[str, Any]) -> str | None:
    value = (device.get("attributes") or {}).get(ATTR_POLICY_KEY, {}).get("string")
    return str(value) if value is not None else None


def _content(spec: dict[str, Any]) -> Any:
    return normalized({"sharedCounters": spec.get("sharedCounters") or [], "devices": spec.get("devices") or []})


async def _reconfigure(mig: MigManager | None, kube: KubeClient, allocated: set[str],
                       published: list[dict[str, Any]], started: float) -> bool:
    """Let the MIG manager reconfigure a GPU that has drained, judged on the claims read in this cycle."""
    if mig is None:
        return False
    mig.published(time.monotonic())
    return await mig.reconfigure(kube, allocated, published, started)


async def publish(kube: KubeClient, node: str, gpus: list[Gpu], drains: Drains | None = None,
                  holds: Set[str] = frozenset(), record: PublishedRecord | None = None,
                  statuses: Mapping[str, Sequence[Taint]] | None = None,
                  mig: MigManager | None = None) -> PublishResult:
    """One cycle. With ``drains``, free devices drain before they change (see pool_safety).

    ``holds`` are devices the node's kubelet plugin has prepared or is preparing: allocated, whatever
    the claims say yet. ``record`` keeps what was last written; an empty pool (the kubelet wiped it)
    is taken to be what it says, so held devices come back unchanged. ``statuses`` are taints by GPU
    UUID (unhealthy, ...) laid onto every device of the GPU, held ones included. ``mig`` makes static
    MIG layouts real (see ``mig_manager``): it adjusts the plan, adds its taints, and reconfigures.
    """
    drains = drains if drains is not None else Drains()
    node_body = await kube.get(f"/api/v1/nodes/{node}")
    labels = node_body["metadata"].get("labels") or {}
    policies = await read_policies(kube)
    plan = plan_node_pool(labels, gpus, policies.plannable)
    if mig is not None:
        plan = await mig.adjust(plan, policies.plannable)
    existing = [s for s in await kube.list(SLICES, fieldSelector=f"spec.nodeName={node},spec.driver={DRIVER}")
                if s["spec"]["pool"]["name"] == node]
    published = [d for s in existing for d in s["spec"].get("devices") or []]
    counter_sets = [c for s in existing for c in s["spec"].get("sharedCounters") or []]
    last = record.load() if record is not None else None
    if not existing and last is not None and last.devices:
        published, counter_sets = last.devices, last.counter_sets
        log.warning("the pool's slices are gone (the kubelet wipes them when the plugin was away); republishing"
                    " from the agent's record, allocated devices unchanged", node=node, devices=len(published))
    # Claims are read after the slices: a device that has drained is judged on claims read since.
    started = time.monotonic()
    frozen = {d["name"] for d in published if _policy_of(d) in policies.frozen}
    allocated = await allocated_devices(kube, node) | set(holds)
    drained = drains.drained(started) | (mig.drained(published) if mig is not None else set())
    safe: SafePlan = make_safe(plan, published, counter_sets, allocated, drained=drained, frozen=frozen)

    gpu_statuses = status_taints_by_gpu(statuses or {}, mig.statuses(allocated, published, started) if mig else {})
    slices = with_statuses(safe.slices, gpu_statuses)
    wanted = {slice_name(node, s.suffix): s for s in slices}
    current = {s["metadata"]["name"]: s for s in existing}
    generations = {int(s["spec"]["pool"]["generation"]) for s in existing}
    counts = {int(s["spec"]["pool"]["resourceSliceCount"]) for s in existing}
    unchanged = (
        set(wanted) == set(current) and len(generations) == 1 and counts == {len(wanted)}
        and all(_content(current[name]["spec"]) == normalized({"sharedCounters": list(s.shared_counters),
                                                               "devices": list(s.devices)})
                for name, s in wanted.items())
    )
    generation = max(generations | ({last.generation} if last is not None else set()), default=0)
    DEVICES.set(sum(len(s.devices) for s in slices))
    HELD.set(len(safe.held))
    if unchanged or (not wanted and not current):
        drains.record(safe.draining, started)
        if record is not None and existing and (last is None or last.generation != generation):
            record.save(Published(generation, published, counter_sets))  # e.g. slices of an earlier agent
        CYCLES.labels(outcome="unchanged").inc()
        again = await _reconfigure(mig, kube, allocated, published, started)
        return PublishResult(generation, (), (), safe.held, plan.notes, safe.draining, again)

    generation += 1
    deleted = []
    for name in sorted(set(current) - set(wanted)):  # obsolete first, as the upstream helper does
        try:
            await kube.delete(f"{SLICES}/{name}")
        except KubeError as error:
            if error.status != 404:
                raise
        deleted.append(name)
    written = []
    for name, planned in wanted.items():
        manifest = resource_slice(
            node, node_body["metadata"]["uid"], planned.suffix, generation, len(wanted),
            shared_counters=list(planned.shared_counters), devices=list(planned.devices),
        )
        await kube.apply(f"{SLICES}/{name}", manifest, field_manager=FIELD_MANAGER)
        written.append(name)
    drains.record(safe.draining, time.monotonic())  # the taints are out: their drain runs from now
    if record is not None:
        record.save(Published(generation, [d for s in slices for d in s.devices],
                              [c for s in slices for c in s.shared_counters]))
    CYCLES.labels(outcome="written").inc()
    again = await _reconfigure(mig, kube, allocated, published, started)
    result = PublishResult(generation, tuple(written), tuple(deleted), safe.held, plan.notes, safe.draining, again)
    log.info("published pool", node=node, generation=generation, devices=sum(len(s.devices) for s in slices),
             written=len(written), deleted=deleted, held=list(safe.held), draining=len(safe.draining),
             blocked_gpus=list(safe.blocked_gpus))
    if safe.held:
        log.warning("changes held back while claims hold devices", node=node, devices=list(safe.held))
    for note in plan.notes:
        log.warning("planner note", node=node, note=note)
    for name, reason in sorted(policies.frozen.items()):
        log.warning("policy's devices kept as published", node=node, policy=name, reason=reason)
    return result
