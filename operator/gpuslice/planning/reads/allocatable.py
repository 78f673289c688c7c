"""Whether a claim already made would be admitted when the scheduler writes its allocation (pure).

The tenancy rule (``planning.cluster.tenancy_rule``) judges a claim again at its allocation, and
the maxMemory webhook charges it then. Some of what they refuse is known before any device is
free: the namespace is not admitted (by UID), a limited tenant's limits or classes are not in force
yet, the claim was made before its tenant's quota, the tenant's maxMemory has no room for it. One
judge for ``gpuslice why`` (which says it) and for the defragmenter (which frees no GPU for a claim
that would be refused: evicting others' pods for it would be for nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuslice.api.resource import GpuSlicePolicy, ParseProblem, parse_policy
from gpuslice.api.status import ClassInForce, LimitsInForce
from gpuslice.dra.wire import ExactRequest
from gpuslice.jsontypes import Body
from gpuslice.planning.defrag.node_taints import parse_time
from gpuslice.planning.max_memory import request_least, shown
from gpuslice.planning.reads.findings import Finding, Request


@dataclass(frozen=True)
class MemoryRoom:
    """A maxMemory tenant's ledger as read: what it holds of its limit."""

    held: int
    limit: int

    @property
    def left(self) -> int:
        return max(0, self.limit - self.held)


def ledger_room(ledger: Body | None, limit: int) -> MemoryRoom | None:
    """The room a ledger leaves; None while it is not in force (not there, or it has not counted
    this incarnation of the namespace): its claims are refused until it is."""
    status, spec = ((ledger or {}).get("status") or {}), ((ledger or {}).get("spec") or {})
    if ledger is None or not status.get("since") or status.get("namespaceUid") != spec.get("namespaceUid"):
        return None
    return MemoryRoom(int(status.get("heldBytes") or 0), min(limit, int(spec.get("limitBytes") or limit)))


def asked_memory(request: Request, classes: Sequence[ClassInForce]) -> int:
    """The least ``request`` can be charged, as its class is in force (0: a class not in force)."""
    klass = next((c for c in classes if c.name == request.device_class), None)
    way = ExactRequest(name=request.name, deviceClassName=request.device_class, count=request.count,
                       allocationMode="All" if request.all_devices else "ExactCount", adminAccess=request.admin)
    if request.memory is not None:
        way["memory"] = str(request.memory)
    return request_least(way, klass) if klass is not None else 0


def memory_findings(request: Request, ledger: Body | None, classes: Sequence[ClassInForce], policy: str,
                    ns: str, limit: int) -> list[Finding]:
    """maxMemory: what the namespace holds of its limit (its ledger's charges) and what this asks."""
    room = ledger_room(ledger, limit)
    if room is None:
        return [Finding("NotAdmitted", f"Namespace {ns} has a maxMemory in {policy}, but it is not in force yet (its"
                                       f" ledger {policy}.{ns}, in gpuslice's namespace, has not counted what the"
                                       " namespace holds); its claims wait until it is.")]
    asked = asked_memory(request, classes)
    if room.held + asked <= room.limit:
        return [Finding("MemoryLeft", f"Namespace {ns} holds {shown(room.held)} of its {shown(room.limit)} maxMemory"
                                      f" in policy {policy}; this claim asks {shown(asked)}, which fits.",
                        blocking=False)]
    return [Finding("OverMemory", f"namespace {ns} holds {shown(room.held)} of its {shown(room.limit)} maxMemory in"
                                  f" policy {policy}; this claim asks {shown(asked)}. It is allocated once the"
                                  " namespace's other claims release enough, or ask the platform team to raise"
                                  f" spec.tenants[{ns}].maxMemory of {policy}.")]


def record_findings(request: Request, policy: GpuSlicePolicy, ns: str, namespace_uid: str,
                    created: str) -> list[Finding]:
    """What the tenancy rule refuses at the allocation of a claim of a tenant ``ns`` made at
    ``created``, from the controller's record (``status.admittedTenants``): the namespace not
    admitted (this incarnation, by UID); a limited tenant's limits not in force, its class not
    counted yet, or the claim made before its quota. An unknown UID or creation time is not judged."""
    name = policy.metadata.name
    tenant = next((t for t in policy.spec.tenants if t.namespace == ns), None)
    if tenant is None or not namespace_uid:
        return []
    record = next((a for a in policy.status.admitted_tenants if a.namespace == ns and a.uid == namespace_uid), None)
    if record is None:
        return [Finding("NotAdmitted", f"Namespace {ns} is a tenant of {name}, but gpuslice has not admitted it"
                                       " (status.admittedTenants: this namespace, by UID); its claims are not"
                                       " allocated until it has.")]
    if tenant.limited and (record.limits or LimitsInForce()) != LimitsInForce.of(tenant):
        return [Finding("LimitsNotInForce", f"The limits of namespace {ns} in {name} changed, and gpuslice has not yet"
                                            " put them in force (status.admittedTenants); its claims are not"
                                            " allocated until it has.")]
    if not tenant.count_limited:
        return []
    if request.device_class not in (record.classes or []):
        return [Finding("ClassNotInForce", f"The quota of namespace {ns} for {name} does not count"
                                           f" {request.device_class} yet (it counts"
                                           f" {', '.join(record.classes or []) or 'none'}); the claim is not"
                                           " allocated until it does.")]
    made, since = parse_time(created), parse_time(record.since or "")
    if made is not None and (since is None or made <= since):
        return [Finding("MadeBeforeQuota", f"The claim {request.claim} was made ({created})"
                                           f" before the quota of namespace {ns} for {name} ({record.since}), so the"
                                           " quota never counted it and it is never allocated: delete it and make it"
                                           " again.")]
    return []


@dataclass(frozen=True)
class Admission:
    """The judgement of one request of a made claim: refused (the first reason), or the room a
    maxMemory tenant has left (None: no maxMemory)."""

    refused: Finding | None = None
    room: MemoryRoom | None = None


def admission(request: Request, body: Body, ns: str, namespace_uid: str, created: str,
              ledger: Body | None, ledgers_read: bool = True) -> Admission:
    """Whether the allocation of ``request`` (of a claim of ``ns`` made at ``created``, of the policy
    ``body``) would be admitted, as far as it can be told before a device is free. ``ledgers_read``:
    False when the maxMemory ledgers could not be read (a maxMemory tenant is then not judged fit)."""
    parsed = parse_policy(body)
    name = str((body.get("metadata") or {}).get("name", ""))
    if isinstance(parsed, ParseProblem):
        return Admission(Finding("PolicyInvalid", f"GpuSlicePolicy {name} does not parse ({parsed.first})"))
    tenant = next((t for t in parsed.spec.tenants if t.namespace == ns), None)
    if tenant is None:
        return Admission(Finding("NotATenant", f"namespace {ns} is not a tenant of {name}"))
    found = record_findings(request, parsed, ns, namespace_uid, created)
    if found:
        return Admission(found[0])
    limit = tenant.max_memory_bytes
    if limit is None:
        return Admission()
    if not ledgers_read:
        return Admission(Finding("MemoryUnknown", f"namespace {ns} has a maxMemory in {name}, and its ledger could not"
                                                  " be read (gpusliceledgers in gpuslice's namespace)"))
    blocking = [f for f in memory_findings(request, ledger, parsed.status.classes_in_force, name, ns, limit)
                if f.blocking]
    if blocking:
        return Admission(blocking[0])
    return Admission(room=ledger_room(ledger, limit))
