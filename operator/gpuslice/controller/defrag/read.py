"""Read what the defragmentation planner needs from the API server, and plan.

Shared by ``gpuslice defrag``, ``gpuslice why`` and the controller's Auto mode. Cluster-wide it
lists the policies, gpuslice's ResourceSlices, the claims, the nodes and the maxMemory ledgers
(whether a waiting claim would be refused for its tenant's maxMemory); pods, disruption budgets
and the namespaces' opt-outs are read only in the namespaces that are tenants of the policies
concerned: only their pods can wait for a policy's devices, or be moved to free them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuslice.api.ledger import ledgers
from gpuslice.coordinates import CLAIMS, NODES, POLICIES, SLICES, budgets_in, configmaps_in, namespace_path, pods_in
from gpuslice.dra.names import CONTROLLER_NAMESPACE, DRAIN_LIST_LABEL, DRIVER
from gpuslice.dra.policy_wire import tenant_namespaces
from gpuslice.jsontypes import Body
from gpuslice.kube.client import Forbidden, KubeClient, NotFound
from gpuslice.planning.defrag.facts import ClaimFacts, DisruptionBudget, PodFacts, opted_out_namespaces
from gpuslice.planning.defrag.model import Cluster, Plan, Waiting, moves_in_flight, waiting_pods
from gpuslice.planning.defrag.planner import plan_defrag
from gpuslice.planning.reads.node_fit import nodes_by_name
from gpuslice.planning.reads.published import drain_lists, read_pools

READS_AT_ONCE = 8  # namespaces read at a time


def tenants_of(policy: Body) -> frozenset[str]:
    return frozenset(tenant_namespaces(policy))


@dataclass(frozen=True)
class Reading:
    policies: list[dict[str, Any]]
    cluster: Cluster
    waiting: list[Waiting]

    def plans(self) -> list[Plan]:
        return plan_defrag(self.cluster, self.waiting)


async def in_namespaces(kube: KubeClient, namespaces: Sequence[str], path: Callable[[str], str],
                        **query: str) -> list[dict[str, Any]]:
    """The collection ``path(namespace)`` listed in each of ``namespaces``, a few at a time."""
    gate = asyncio.Semaphore(READS_AT_ONCE)

    async def one(namespace: str) -> list[dict[str, Any]]:
        async with gate:
            return await kube.list(path(namespace), **query)

    return [item for found in await asyncio.gather(*(one(n) for n in namespaces)) for item in found]


async def _namespaces(kube: KubeClient, names: Sequence[str]) -> list[dict[str, Any]]:
    found = []
    for name in names:
        try:
            found.append(await kube.get(namespace_path(name)))
        except NotFound:
            continue
    return found


async def read_cluster(kube: KubeClient, policy: str | None = None, home: str = CONTROLLER_NAMESPACE) -> Reading:
    """Everything the planner reads; with ``policy``, the pods that wait for that policy only."""
    policies, slices, claims, nodes = await asyncio.gather(
        kube.list(POLICIES), kube.list(SLICES, fieldSelector=f"spec.driver={DRIVER}"),
        kube.list(CLAIMS), kube.list(NODES))
    try:  # devices the agents drain are no place for a moved pod
        draining = drain_lists(await kube.list(configmaps_in(home),
                                               labelSelector=f"{DRAIN_LIST_LABEL}=true"))
    except (NotFound, Forbidden):
        draining = {}
    concerned = [p for p in policies if policy is None or p["metadata"]["name"] == policy]
    tenants = {str(p["metadata"]["name"]): tenants_of(p) for p in policies}
    names = sorted({n for p in concerned for n in tenants[str(p["metadata"]["name"])]})
    pods, budgets, namespaces = await asyncio.gather(
        in_namespaces(kube, names, pods_in),
        in_namespaces(kube, names, budgets_in),
        _namespaces(kube, names))
    pod_facts = [PodFacts.from_body(p) for p in pods]
    claim_facts = [ClaimFacts.from_body(c) for c in claims]
    cluster = Cluster(read_pools(slices, claims, (), draining), claim_facts, pod_facts,
                      [DisruptionBudget.from_body(b) for b in budgets], tenants, opted_out_namespaces(namespaces),
                      nodes_by_name(nodes), tuple(moves_in_flight(policies)))
    uids = {str(n["metadata"]["name"]): str(n["metadata"].get("uid", "")) for n in namespaces}
    waiting = [w for w in waiting_pods(pod_facts, claim_facts, policies, uids, await _ledgers(kube, home))
               if policy is None or w.policy == policy]
    return Reading(policies, cluster, waiting)


async def _ledgers(kube: KubeClient, home: str) -> dict[tuple[str, str], dict[str, Any]] | None:
    """The maxMemory ledgers by (policy, namespace); None when they may not be read (a waiting pod of
    a maxMemory tenant is then not planned for: whether it would be refused cannot be told)."""
    try:
        found = await kube.list(ledgers(home))
    except (NotFound, Forbidden):
        return None
    return {(str((b.get("spec") or {}).get("policy")), str((b.get("spec") or {}).get("namespace"))): b for b in found}
