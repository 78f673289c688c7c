"""Totals per policy and per tenant: use against limit, in devices and in bytes (pure).

Counted with the controller's own functions (``planning.reads.usage``, ``planning.kinds``) from
the same objects, so ``gpuslice status`` and a policy's ``status.tenants`` agree; but from
what is live now, so the numbers hold while the controller is down or behind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuslice.api.resource import ParseProblem, parse_policy
from gpuslice.inventory.nodes import NodeGpus, node_gpus
from gpuslice.jsontypes import Body
from gpuslice.planning.cluster.cluster_objects import DeviceRef
from gpuslice.planning.kinds import limit_bytes, quota
from gpuslice.planning.modes import device_kinds
from gpuslice.planning.reads.published import Pool
from gpuslice.planning.reads.usage import ClaimView, DeviceInfo, foreign_claims, usage
from gpuslice.planning.selection import select


@dataclass(frozen=True)
class KindUse:
    kind: str
    allocated: int
    limit: int | None
    memory: int  # one device of this kind


@dataclass(frozen=True)
class TenantUse:
    """One tenant in one policy."""

    namespace: str
    policy: str
    allocated: int
    limit: int | None
    allocated_bytes: int
    limit_bytes: int | None
    kinds: tuple[KindUse, ...] = ()
    max_memory: int | None = None  # spec.tenants[].maxMemory in bytes, when it has one

    @property
    def over(self) -> bool:
        """Holds more than its limit (a limit lowered under claims already made)."""
        return (self.limit is not None and self.allocated > self.limit) or (
            self.limit_bytes is not None and self.allocated_bytes > self.limit_bytes)


@dataclass(frozen=True)
class ConditionView:
    type: str
    status: str
    reason: str
    message: str = ""


@dataclass(frozen=True)
class PolicyTotals:
    name: str
    mode: str
    published: int
    allocated: int
    held: int
    draining: int
    tainted: int
    free: int
    nodes: int
    gpus: int
    conditions: tuple[ConditionView, ...]
    tenants: tuple[TenantUse, ...]
    taint_reasons: tuple[tuple[str, int], ...] = ()  # (reason, devices)
    foreign_claims: tuple[str, ...] = ()
    problem: str = ""  # a spec that does not parse: what is wrong

    def condition(self, type_: str) -> ConditionView | None:
        return next((c for c in self.conditions if c.type == type_), None)


@dataclass(frozen=True)
class TenantTotals:
    """One namespace across every policy it is a tenant of."""

    namespace: str
    allocated: int
    limit: int | None  # None when some policy does not limit it
    allocated_bytes: int
    limit_bytes: int | None
    policies: tuple[str, ...]


def inventory(nodes: Iterable[Body]) -> list[tuple[dict[str, str], NodeGpus]]:
    """Each node's GPUs as its labels say (as the controller judges policies)."""
    found = []
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        labels = dict(node["metadata"].get("labels") or {})
        gpus = node_gpus(str(node["metadata"]["name"]), labels)
        if gpus is not None:
            found.append((labels, gpus))
    return found


def policy_totals(policies: Iterable[Body], pools: Sequence[Pool], claims: Iterable[Body],
                  nodes: Iterable[Body]) -> list[PolicyTotals]:
    known = inventory(nodes)
    views = [v for c in claims if (v := ClaimView.from_claim(
        str(c["metadata"].get("namespace", "")), str(c["metadata"]["name"]), c.get("status") or {})) is not None]
    devices = [d for pool in pools for d in pool.devices]
    info = {DeviceRef(d.node, d.name): DeviceInfo(d.device.kind, d.device.memory) for d in devices}
    found = []
    for body in sorted(policies, key=lambda b: str(b["metadata"]["name"])):
        name = str(body["metadata"]["name"])
        conditions = tuple(ConditionView(str(c.get("type")), str(c.get("status")), str(c.get("reason", "")),
                                         str(c.get("message", "")))
                           for c in (body.get("status") or {}).get("conditions") or [])
        mine = [d for d in devices if d.device.policy == name]
        states = Counter(d.state for d in mine)
        reasons = Counter(r for d in mine for r in d.reasons)
        parsed = parse_policy(body)
        mode = str(((body.get("spec") or {}).get("slicing") or {}).get("mode", "?"))
        refs = {DeviceRef(d.node, d.name) for d in mine}
        used = usage(refs, views, info)
        tenants: list[TenantUse] = []
        foreign: list[str] = []
        problem = ""
        if isinstance(parsed, ParseProblem):
            problem = parsed.first
        else:
            kinds = device_kinds(parsed, select(parsed, known))
            for tenant in parsed.spec.tenants:
                held = used.kinds_by_namespace.get(tenant.namespace, {})
                limits = {k.kind: quota(tenant, k) for k in kinds}
                tenants.append(TenantUse(
                    tenant.namespace, name, used.by_namespace.get(tenant.namespace, 0),
                    sum(v or 0 for v in limits.values()) if tenant.count_limited else None,
                    used.bytes_by_namespace.get(tenant.namespace, 0), limit_bytes(tenant, kinds),
                    tuple(KindUse(k.kind, held.get(k.kind, 0), limits[k.kind], k.memory) for k in kinds),
                    tenant.max_memory_bytes))
            foreign = foreign_claims(refs, views, {t.namespace for t in parsed.spec.tenants},
                                     set(parsed.spec.admin_access.namespaces))
        found.append(PolicyTotals(
            name, mode, len(mine), sum(1 for d in mine if d.allocated), states["held"], states["draining"],
            states["tainted"], states["free"], len({d.node for d in mine}),
            len({(d.node, d.device.gpu_uuid) for d in mine}), conditions, tuple(tenants),
            tuple(sorted(reasons.items())), tuple(foreign), problem))
    return found


def tenant_totals(policies: Sequence[PolicyTotals]) -> list[TenantTotals]:
    by_namespace: dict[str, list[TenantUse]] = {}
    for policy in policies:
        for tenant in policy.tenants:
            by_namespace.setdefault(tenant.namespace, []).append(tenant)
    found = []
    for namespace, uses in sorted(by_namespace.items()):
        limits = [u.limit for u in uses]
        byte_limits = [u.limit_bytes for u in uses]
        found.append(TenantTotals(
            namespace, sum(u.allocated for u in uses),
            None if None in limits else sum(v or 0 for v in limits),
            sum(u.allocated_bytes for u in uses),
            None if None in byte_limits else sum(v or 0 for v in byte_limits),
            tuple(u.policy for u in uses)))
    return found
