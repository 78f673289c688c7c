"""The controller's view of the cluster, from its watches (no API calls), and what it works out
from the whole fleet once rather than on every reconcile.

A reconcile judges its policy against every other (validation) on every node (selection), and
counts its devices in the slices. Done from scratch each time, that cost grows with policies x
nodes: at 1,000 nodes and 50 policies (the bench's scale figure) each reconcile took half a
second of CPU, a burst of them kept the event loop from renewing the leader Lease, and the
controller stopped writing. So the Kopf indexes keep slices by pool and pools by policy, parse
each policy once per change, and :class:`FleetMemo` keeps the inventory and every policy's
selection until a node's labels or the policy's spec change.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuslice.api.resource import GpuSlicePolicy, ParseProblem, parse_policy, valid_policy
from gpuslice.controller.admin_access import NamespaceView
from gpuslice.controller.tenancy import LedgerView, QuotaView
from gpuslice.inventory.nodes import NodeGpus, node_gpus
from gpuslice.planning.left_out import LeftOut
from gpuslice.planning.reads.usage import ClaimView, SliceView
from gpuslice.planning.selection import Selection, select, selected_nodes

Inventory = list[tuple[dict[str, str], NodeGpus]]


@dataclass
class FleetMemo:
    """The inventory and each policy's selection, kept while the nodes are as they were
    (``nodes_version``, bumped by every change of a node's labels, a node added or removed) and
    the policy's spec is (its uid and generation)."""

    nodes_version: tuple[int, int] | None = None
    inventory: Inventory = field(default_factory=list)
    selections: dict[str, tuple[tuple[str, int], Selection]] = field(default_factory=dict)


@dataclass(frozen=True)
class World:
    """The controller's view of the cluster, from its watches (no API calls)."""

    policies: Mapping[str, Mapping[str, Any]]
    namespaces: Mapping[str, NamespaceView]
    nodes: Mapping[str, Mapping[str, str]]
    slices: Sequence[SliceView]
    claims: Sequence[ClaimView]
    # DeviceClasses gpuslice did not make: name -> extendedResourceName (None when it has none)
    foreign_classes: Mapping[str, str | None] = field(default_factory=dict)
    # gpuslice's ResourceQuotas by (namespace, name): what each enforces now
    quotas: Mapping[tuple[str, str], QuotaView] = field(default_factory=dict)
    # maxMemory ledgers by name (<policy>.<namespace>): the limit each puts in force, and whether it does
    ledgers: Mapping[str, LedgerView] = field(default_factory=dict)
    # The controller's indexes, kept by Kopf as objects come and go, so that a reconcile costs what
    # its own policy has, not what the fleet has: the slices of each pool, the pools each policy
    # publishes devices in, each policy parsed once per change (None: it does not parse). Without
    # them (a World made by hand) the same answers are worked out from ``slices`` and ``policies``.
    slice_pools: Mapping[str, Collection[SliceView]] | None = None
    policy_pools: Mapping[str, Collection[str]] | None = None
    parsed: Mapping[str, GpuSlicePolicy | None] | None = None
    # Bumped by Changes on every change of a node's labels; with ``memo``, what is worked out from
    # the nodes is kept between reconciles.
    nodes_version: int | None = None
    memo: FleetMemo | None = None
    # Other DRA drivers' slices that name GPUs, by node: (driver, devices naming a GPU or MIG UUID).
    other_drivers: Mapping[str, Collection[tuple[str, int]]] = field(default_factory=dict)
    # Each policy's objects of the kinds it owns (controller.apply), as the watches hold them; None:
    # not watched (a World made by hand), and a converge lists them.
    owned: Mapping[str, Sequence[Mapping[str, Any]]] | None = None
    # The policies as the watch holds them when asked (Kopf's index, updated in place between awaits);
    # None: ``policies``. What takes something away must judge by it, not by the handler's copy.
    live_policies: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None

    def policies_now(self) -> Mapping[str, Mapping[str, Any]]:
        """Every policy the watch holds now: a handler's ``policies`` lack those created since it began."""
        return self.live_policies() if self.live_policies is not None else self.policies

    def other_drivers_on(self, nodes: Collection[str]) -> list[str]:
        """``node: driver (N GPU devices)`` for each of ``nodes`` where another driver publishes GPUs."""
        found: dict[tuple[str, str], int] = {}
        for node in sorted(nodes):
            for driver, count in self.other_drivers.get(node, ()):
                found[(node, driver)] = found.get((node, driver), 0) + count
        return [f"{node}: {driver} ({count} GPU devices)" for (node, driver), count in found.items()]

    def slices_of(self, policy: str) -> list[SliceView]:
        """Every slice of every pool that publishes a device of ``policy`` (or leaves it out): all
        of a pool's slices, as whether a pool is complete (and so counted) depends on them all."""
        if self.slice_pools is None or self.policy_pools is None:
            pools = {v.pool for v in self.slices if policy in v.policies}
            return [v for v in self.slices if v.pool in pools]
        return [v for pool in sorted(set(self.policy_pools.get(policy, ()))) for v in self.slice_pools.get(pool, ())]

    def left_out(self, policy: str, nodes: Collection[str]) -> list[tuple[str, LeftOut]]:
        """(node, what) for each GPU of ``nodes`` whose agent left ``policy``'s devices out, as the
        pool's newest generation says (planning.left_out); other nodes' word is not taken."""
        newest: dict[str, int] = {}
        views = [v for v in self.slices_of(policy) if v.pool in nodes]
        for view in views:
            newest[view.pool] = max(newest.get(view.pool, 0), view.generation)
        return sorted({(v.pool, item) for v in views if v.generation == newest[v.pool]
                       for item in v.left_out if item.policy == policy})

    def _version(self) -> tuple[int, int] | None:
        return None if self.nodes_version is None else (self.nodes_version, len(self.nodes))

    def inventory(self) -> Inventory:
        """Every node with GPUs we can see, with its labels."""
        version = self._version()
        if self.memo is not None and version is not None and self.memo.nodes_version == version:
            return self.memo.inventory
        found = []
        for name, labels in sorted(self.nodes.items()):
            gpus = node_gpus(name, labels)
            if gpus is not None:
                found.append((dict(labels), gpus))
        if self.memo is not None and version is not None and (
                self.memo.nodes_version is None or version[0] >= self.memo.nodes_version[0]):
            # Only forward: a World made before an await, used after a newer one was kept, keeps
            # its older answer to itself.
            self.memo.nodes_version, self.memo.inventory = version, found
            self.memo.selections.clear()
        return found

    def selection(self, policy: GpuSlicePolicy) -> Selection:
        """The nodes and GPUs ``policy`` selects."""
        inventory = self.inventory()
        if self.memo is None or self.nodes_version is None or self.memo.nodes_version != self._version():
            return select(policy, inventory)  # no memo, or one kept for other nodes than this World's
        spec = (policy.metadata.uid, policy.metadata.generation)
        kept = self.memo.selections.get(policy.name)
        if kept is None or kept[0] != spec or not spec[0]:
            kept = (spec, select(policy, inventory))
            self.memo.selections[policy.name] = kept
        return kept[1]

    def nodes_selected(self, policy: GpuSlicePolicy) -> tuple[str, ...]:
        """The nodes ``policy``'s devices may be allocated on (``selection.selected_nodes``): those
        with GPUs by their labels, or a gpuslice pool, that its node selector matches."""
        pools = self.slice_pools.keys() if self.slice_pools is not None else {v.pool for v in self.slices}
        return selected_nodes(policy, self.nodes, {g.node for _, g in self.inventory()} | set(pools))

    def policy_of(self, body: Mapping[str, Any]) -> GpuSlicePolicy | ParseProblem:
        """``body`` parsed: the index's, when it parsed this very version (its resourceVersion);
        a ParseProblem when it does not parse (the caller reports why)."""
        meta = body.get("metadata") or {}
        kept = self.parsed.get(meta.get("name", "")) if self.parsed is not None else None
        if kept is not None and kept.metadata.resource_version and (
                kept.metadata.resource_version == meta.get("resourceVersion")):
            return kept
        return parse_policy(body)

    def parsed_policies(self) -> list[GpuSlicePolicy]:
        found = []
        for name, body in self.policies.items():
            policy = self.parsed[name] if self.parsed is not None and name in self.parsed else valid_policy(body)
            if policy is not None and not policy.metadata.deletion_timestamp:
                found.append(policy)
        return found

    def foreign_extended(self) -> dict[str, str]:
        return {ext: name for name, ext in sorted(self.foreign_classes.items()) if ext}

    def label_records(self, kept: Mapping[str, frozenset[str]], but: str) -> set[str]:
        """Namespaces other policies recorded as labelled by gpuslice (``kept``: the controller's
        own records, newer than a status it has not seen back yet)."""
        found: set[str] = set()
        for name, body in self.policies.items():
            if name != but:
                recorded = kept.get(name)
                if recorded is None:
                    recorded = frozenset((body.get("status") or {}).get("adminAccessLabels") or [])
                found |= recorded
        return found
