"""Publish the node's pool: plan, make safe, and write only when the content changed.

Each cycle reads the authoritative state from the API server (the policies,
the Node, this pool's slices and the claims allocated from it) rather than
from watch caches, so a freshly started agent can never mistake "not listed
yet" for "not allocated".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pydantic
import structlog
from prometheus_client import Counter, Gauge

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.names import DRIVER
from gpuslice.dra.resourceslice import resource_slice, slice_name
from gpuslice.inventory.gpus import Gpu
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.planning.node_pool import plan_node_pool
from gpuslice.planning.pool_safety import SafePlan, make_safe, normalized

FIELD_MANAGER = "gpuslice-agent"
CYCLES = Counter("gpuslice_agent_publish_cycles", "Publish cycles, by outcome.", ["outcome"])
DEVICES = Gauge("gpuslice_agent_devices", "Devices this agent publishes.")
HELD = Gauge("gpuslice_agent_held_devices", "Allocated devices kept as they were while a change waits.")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class PublishResult:
    generation: int
    written: tuple[str, ...]
    deleted: tuple[str, ...]
    held: tuple[str, ...]
    notes: tuple[str, ...]

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


async def read_policies(kube: KubeClient) -> list[GpuSlicePolicy]:
    policies = []
    for body in await kube.list("/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"):
        try:
            policies.append(GpuSlicePolicy.from_body(body))
        except pydantic.ValidationError as error:
            log.warning("skipping a policy that does not parse", policy=body["metadata"]["name"], error=str(error))
    return policies


def _content(spec: dict[str, Any]) -> Any:
    return normalized({"sharedCounters": spec.get("sharedCounters") or [], "devices": spec.get("devices") or []})


async def publish(kube: KubeClient, node: str, gpus: list[Gpu]) -> PublishResult:
    node_body = await kube.get(f"/api/v1/nodes/{node}")
    labels = node_body["metadata"].get("labels") or {}
    plan = plan_node_pool(labels, gpus, await read_policies(kube))
    existing = [s for s in await kube.list(SLICES, fieldSelector=f"spec.nodeName={node},spec.driver={DRIVER}")
                if s["spec"]["pool"]["name"] == node]
    published = [d for s in existing for d in s["spec"].get("devices") or []]
    counter_sets = [c for s in existing for c in s["spec"].get("sharedCounters") or []]
    safe: SafePlan = make_safe(plan, published, counter_sets, await allocated_devices(kube, node))

    wanted = {slice_name(node, s.suffix): s for s in safe.slices}
    current = {s["metadata"]["name"]: s for s in existing}
    generations = {int(s["spec"]["pool"]["generation"]) for s in existing}
    counts = {int(s["spec"]["pool"]["resourceSliceCount"]) for s in existing}
    unchanged = (
        set(wanted) == set(current) and len(generations) == 1 and counts == {len(wanted)}
        and all(_content(current[name]["spec"]) == normalized({"sharedCounters": list(s.shared_counters),
                                                               "devices": list(s.devices)})
                for name, s in wanted.items())
    )
    generation = max(generations, default=0)
    DEVICES.set(sum(len(s.devices) for s in safe.slices))
    HELD.set(len(safe.held))
    if unchanged:
        CYCLES.labels(outcome="unchanged").inc()
        return PublishResult(generation, (), (), safe.held, plan.notes)

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
    CYCLES.labels(outcome="written").inc()
    result = PublishResult(generation, tuple(written), tuple(deleted), safe.held, plan.notes)
    log.info("published pool", node=node, generation=generation, devices=sum(len(s.devices) for s in safe.slices),
             written=len(written), deleted=deleted, held=list(safe.held), blocked_gpus=list(safe.blocked_gpus))
    if safe.held:
        log.warning("changes held back while claims hold devices", node=node, devices=list(safe.held))
    return result
