"""What ``gpuslice status`` shows, from one snapshot of the API (pure).

The snapshot is the objects as the API server returned them; the report is the
occupancy map and the totals. Rendering (terminal, SVG, HTML, JSON) is elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuslice.inventory.nodes import node_gpus
from gpuslice.jsontypes import Body
from gpuslice.planning.defrag.model import moves_in_flight
from gpuslice.planning.reads.occupancy import OccupancyMap, occupancy
from gpuslice.planning.reads.published import Pool, read_pools
from gpuslice.planning.reads.topology import ClaimAlignment, NodeTopology, claim_alignments, node_topologies
from gpuslice.planning.reads.totals import PolicyTotals, TenantTotals, policy_totals, tenant_totals


@dataclass(frozen=True)
class Snapshot:
    """The objects one look at the cluster reads: one LIST per kind."""

    policies: Sequence[Body] = ()
    slices: Sequence[Body] = ()
    claims: Sequence[Body] = ()
    nodes: Sequence[Body] = ()
    taint_rules: Sequence[Body] = ()
    draining: Mapping[str, Sequence[str]] = field(default_factory=dict)  # node -> devices the agent drains
    notes: Sequence[str] = ()  # what could not be read, and so is missing

    def pools(self) -> list[Pool]:
        return read_pools(self.slices, self.claims, self.taint_rules, self.draining)


@dataclass(frozen=True)
class StatusReport:
    map: OccupancyMap
    policies: tuple[PolicyTotals, ...]
    tenants: tuple[TenantTotals, ...]
    notes: tuple[str, ...] = ()
    topology: tuple[NodeTopology, ...] = ()  # where each node's GPUs sit (planning.reads.topology)
    aligned: tuple[ClaimAlignment, ...] = ()  # claims on several GPUs, and what their GPUs share


def gpu_counts(nodes: Sequence[Body]) -> dict[str, int]:
    """GPUs per node as its labels say (fake-GPU or GPU Feature Discovery labels)."""
    counts = {}
    for node in nodes:
        name = str(node["metadata"]["name"])
        found = node_gpus(name, node["metadata"].get("labels") or {})
        if found is not None and found.count is not None:
            counts[name] = found.count
    return counts


def _freeing(found: OccupancyMap, policies: Sequence[Body]) -> OccupancyMap:
    """The map with each GPU being freed for a waiting pod marked (status.defragmentation.inFlight)."""
    moves = {(m.node, m.gpu): m for m in moves_in_flight(policies)}
    if not moves:
        return found
    nodes = []
    for node in found.nodes:
        gpus = []
        for gpu in node.gpus:
            move = moves.get((node.name, gpu.uuid))
            gpus.append(replace(gpu, freeing=f"being freed for {move.pod.namespace}/{move.pod.name}"
                                             f" ({move.phase.lower()}, {move.by}, until {move.expires})")
                        if move else gpu)
        nodes.append(replace(node, gpus=tuple(gpus)))
    return OccupancyMap(tuple(nodes))


def status_report(snapshot: Snapshot) -> StatusReport:
    pools = snapshot.pools()
    policies = policy_totals(snapshot.policies, pools, snapshot.claims, snapshot.nodes)
    notes = list(snapshot.notes)
    notes += [f"node {p.node}: the agent is rewriting its pool (generation {p.generation} is not complete);"
              " the scheduler allocates nothing from it until it is" for p in pools if not p.complete]
    found = _freeing(occupancy(pools, gpu_counts(snapshot.nodes)), snapshot.policies)
    return StatusReport(found, tuple(policies), tuple(tenant_totals(policies)), tuple(notes), node_topologies(found),
                        claim_alignments(found, snapshot.claims))
