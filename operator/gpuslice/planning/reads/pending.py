"""Why a pod's (or a claim's) GPU request is pending, in the platform's terms (pure).

The scheduler says "cannot allocate all claims"; the quota controller says
"exceeded quota: gpuslice-inference, ... used: ...=4"; the admission policy says
"is not a tenant". This module puts what the API server holds next to the policy
the request is for and answers the way a platform engineer would: not a tenant of
that policy; over its limit, by how much; no free slice of that size on any node,
and the largest free one; the slices are there but tainted (unhealthy,
reconfiguring, maintenance) or draining; and the decisions recorded in Events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuslice.api.resource import ParseProblem, parse_policy
from gpuslice.dra.names import ATTRIBUTE_DOMAIN, CONTROLLER_NAMESPACE, MEMORY_WEBHOOK, quota_resource
from gpuslice.dra.quantity import format_bytes, quantity_bytes
from gpuslice.dra.wire import (
    AllocationResult,
    DeviceRequest,
    allocation_results,
    device_requests,
    is_allocated,
    match_attributes,
    request_ways,
)
from gpuslice.jsontypes import Body
from gpuslice.planning.kinds import FULL, SHARED, SLICE
from gpuslice.planning.mode_traits import traits_of
from gpuslice.planning.reads.allocatable import memory_findings, record_findings
from gpuslice.planning.reads.availability import largest_free, room_for
from gpuslice.planning.reads.findings import Finding, Request
from gpuslice.planning.reads.occupancy import OccupancyMap
from gpuslice.planning.reads.topology import aligned_room
from gpuslice.planning.reads.totals import PolicyTotals

__all__ = ["Finding", "Request"]  # the vocabulary of a diagnosis, where its readers look for it
IMPLICIT_EXTENDED = "deviceclass.resource.kubernetes.io/"
KIND_WORDS = {"slice": "slice", "full": "whole GPU", "shared": "share of a shared GPU"}


@dataclass(frozen=True)
class Facts:
    """What the API server holds about the subject; every field is optional reading."""

    namespace: str
    pod: Body | None = None
    claim_name: str | None = None  # the subject is this claim, not a pod
    claims: Mapping[str, Body] = field(default_factory=dict)  # the namespace's claims by name
    templates: Mapping[str, Body] = field(default_factory=dict)
    quotas: Sequence[Body] = ()
    namespace_uid: str = ""
    events: Sequence[Body] = ()  # the namespace's Events
    device_classes: Mapping[str, Body] = field(default_factory=dict)
    ledgers: Mapping[str, Body] = field(default_factory=dict)  # the namespace's maxMemory ledgers by policy


@dataclass(frozen=True)
class Diagnosis:
    subject: str
    phase: str
    requests: tuple[Request, ...]
    findings: tuple[Finding, ...]

    @property
    def blocking(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.blocking)


def request_options(request: DeviceRequest, claim: str, spec: Body | None = None) -> list[Request]:
    """The ways one request may be met: its ``exactly``, else its ``firstAvailable`` subrequests;
    with the claim's ``spec``, each with the attributes its devices must share."""
    return [Request(claim, way["name"], way["deviceClassName"], way["count"], way["allocationMode"] == "All",
                    way["adminAccess"], quantity_bytes(memory) if (memory := way.get("memory")) is not None else None,
                    tuple(way.get("selectors") or ()),
                    match_attributes(spec, way["name"]) if spec is not None else ())
            for way in request_ways(request)]


def claim_requests(spec: Body, claim: str) -> list[Request]:
    return [option for request in device_requests(spec) for option in request_options(request, claim, spec)]


def class_owner(device_class: str, policies: Iterable[Body]) -> tuple[str, str] | None:
    """(policy, kind) of one of gpuslice's DeviceClasses: from the policy's status, else its name."""
    for body in policies:
        for entry in (body.get("status") or {}).get("deviceClasses") or []:
            if entry.get("name") == device_class:
                return str(body["metadata"]["name"]), str(entry.get("kind", ""))
    suffix = f".{ATTRIBUTE_DOMAIN}"
    if not device_class.endswith(suffix):
        return None
    parts = device_class.removesuffix(suffix).split(".")
    names = {str(b["metadata"]["name"]) for b in policies}
    if parts[-1] not in names:
        return None
    mode = next(str(((b.get("spec") or {}).get("slicing") or {}).get("mode", "")) for b in policies
                if b["metadata"]["name"] == parts[-1])
    traits = traits_of(mode)
    kind = ".".join(parts[:-1]) or (SHARED if traits is not None and traits.consumable else SLICE)
    return parts[-1], kind


def pod_claim_names(pod: Body) -> dict[str, str]:
    """The pod's claim entries -> the claim each got (template claims once made)."""
    made = {str(s.get("name")): str(s.get("resourceClaimName")) for s in
            (pod.get("status") or {}).get("resourceClaimStatuses") or [] if s.get("resourceClaimName")}
    names = {}
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            names[str(entry["name"])] = str(entry["resourceClaimName"])
        elif str(entry.get("name")) in made:
            names[str(entry["name"])] = made[str(entry["name"])]
    return names


def _served(device_classes: Mapping[str, Body], policies: Sequence[Body]) -> dict[str, str]:
    """Extended resource names, and the DeviceClass that serves each."""
    served = {str(c["spec"]["extendedResourceName"]): name for name, c in device_classes.items()
              if (c.get("spec") or {}).get("extendedResourceName")}
    served.update({str((b.get("spec") or {})["extendedResourceName"]): f"{b['metadata']['name']}.{ATTRIBUTE_DOMAIN}"
                   for b in policies if (b.get("spec") or {}).get("extendedResourceName")})
    return served


def _resources(pod: Body) -> list[tuple[str, str, Any]]:
    """(container, resource, quantity) of every request and limit of the pod's containers."""
    found = []
    for container in [*((pod.get("spec") or {}).get("initContainers") or []),
                      *((pod.get("spec") or {}).get("containers") or [])]:
        resources = container.get("resources") or {}
        for key, value in {**(resources.get("requests") or {}), **(resources.get("limits") or {})}.items():
            found.append((str(container.get("name")), str(key), value))
    return found


def asks_for_devices(pod: Body, device_classes: Mapping[str, Body], policies: Sequence[Body]) -> bool:
    """Whether ``pod`` asks for any device at all (claims, or an extended resource a DeviceClass
    serves): the others would only be diagnosed NoClaims, so ``why -A`` reads nothing for them."""
    if (pod.get("spec") or {}).get("resourceClaims"):
        return True
    served = _served(device_classes, policies)
    return any(key in served or key.startswith(IMPLICIT_EXTENDED) for _, key, _ in _resources(pod))


def _extended(pod: Body, facts: Facts, policies: Sequence[Body]) -> list[Request]:
    """Requests made the device-plugin way (``resources.limits``) that a policy's class serves."""
    served = _served(facts.device_classes, policies)
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    claim = str(status.get("resourceClaimName") or "the claim the scheduler makes for the extended resources")
    found = []
    for container, key, value in _resources(pod):
        device_class = served.get(key) or (key.removeprefix(IMPLICIT_EXTENDED)
                                           if key.startswith(IMPLICIT_EXTENDED) else None)
        if device_class:
            found.append(Request(claim, f"{container}: {key}", device_class, int(value)))
    return found


def _events_about(facts: Facts, names: set[str]) -> list[Body]:
    events = [e for e in facts.events if str((e.get("involvedObject") or {}).get("name")) in names]
    return sorted(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))


def _admission(events: Sequence[Body]) -> list[Finding]:
    """Decisions of admission and quota the Events recorded (the latest of each reason)."""
    latest: dict[str, Body] = {}
    for event in events:
        if event.get("type") == "Warning":
            latest[str(event.get("reason"))] = event
    found = []
    for reason, event in latest.items():
        message = str(event.get("message", ""))
        if f'failed calling webhook "{MEMORY_WEBHOOK}"' in message:
            found.append(Finding("WebhookDown", (
                f"{reason}: {message}. The maxMemory webhook ({MEMORY_WEBHOOK}) did not answer, and it fails closed:"
                " allocations of tenants with maxMemory wait until it does, running pods are untouched. Check its"
                f" pods: kubectl -n <gpuslice's namespace, {CONTROLLER_NAMESPACE} by default> get pods"
                " -l app.kubernetes.io/component=webhook.")))
        elif any(w in message for w in ("denied request", "denied the request", "exceeded quota", "forbidden")):
            found.append(Finding("AdmissionDenied", f"{reason}: {message}"))
        else:
            found.append(Finding("Event", f"{reason}: {message}", blocking=False))
    return found


def _kind_words(kind: str) -> str:
    return KIND_WORDS.get(kind, f"MIG {kind} instance")


def _quota(facts: Facts, policy: str, device_class: str) -> tuple[int, int] | None:
    """(used, hard) of the class in the tenant's gpuslice quota."""
    key = quota_resource(device_class)
    for quota in facts.quotas:
        if quota["metadata"]["name"] != f"gpuslice-{policy}":
            continue
        hard = ((quota.get("status") or {}).get("hard") or (quota.get("spec") or {}).get("hard") or {}).get(key)
        used = ((quota.get("status") or {}).get("used") or {}).get(key, "0")
        if hard is not None:
            return int(quantity_bytes(str(used))), int(quantity_bytes(str(hard)))
    return None


def _policy_findings(request: Request, made: bool, facts: Facts, body: Body, kind: str,
                     totals: PolicyTotals | None, cluster: OccupancyMap, created: str = "") -> list[Finding]:
    name = str(body["metadata"]["name"])
    parsed = parse_policy(body)
    if isinstance(parsed, ParseProblem):
        return [Finding("PolicyInvalid", f"GpuSlicePolicy {name} does not parse ({parsed.first}); nothing of it is"
                                         " allocatable until it is fixed.")]
    tenants = {t.namespace: t for t in parsed.spec.tenants}
    admins = set(parsed.spec.admin_access.namespaces)
    ns = facts.namespace
    if ns not in tenants:
        if ns in admins and request.admin:
            return [Finding("AdminAccess", f"{ns} is an admin-access namespace of {name}: its adminAccess claim"
                                           " takes no device from anyone.", blocking=False)]
        also = (" It is one of spec.adminAccess.namespaces, so it may claim the devices only with"
                " adminAccess: true." if ns in admins else "")
        return [Finding("NotATenant", f"Namespace {ns} is not a tenant of GpuSlicePolicy {name} (tenants:"
                                      f" {', '.join(sorted(tenants)) or 'none'}), so it may not use {name}'s"
                                      f" DeviceClass {request.device_class}.{also} Ask the platform team to add it to"
                                      f" spec.tenants.")]
    found = []
    if request.admin and ns not in admins:
        found.append(Finding("AdminAccessRefused", f"Namespace {ns} asks for adminAccess, which only"
                                                   f" spec.adminAccess.namespaces of {name} may"
                                                   f" ({', '.join(sorted(admins)) or 'none'})."))
    admitted = {(a.namespace, a.uid) for a in parsed.status.admitted_tenants}
    if not made and facts.namespace_uid and (ns, facts.namespace_uid) not in admitted:
        found.append(Finding("NotAdmitted", f"Namespace {ns} is a tenant of {name}, but gpuslice has not put its"
                                            " quota in place yet (status.admittedTenants); claims wait until it has."))
    if made:  # judged again at its allocation, from the controller's record
        found += record_findings(request, parsed, ns, facts.namespace_uid, created)
    use = next((t for t in totals.tenants if t.namespace == ns), None) if totals else None
    quota = _quota(facts, name, request.device_class)
    one = next((k.memory for k in (use.kinds if use else ()) if k.kind == kind), 0)
    if quota is not None and not made:
        used, hard = quota
        asked = request.count
        if used + asked > hard:
            over = used + asked - hard
            memory = f" ({format_bytes(over * one)} of GPU memory)" if one else ""
            total = (f" In all, {ns} holds {format_bytes(use.allocated_bytes)} of {format_bytes(use.limit_bytes)}"
                     f" through {name}." if use and use.limit_bytes is not None else "")
            found.append(Finding("OverLimit", (
                f"Over the limit: {ns} may hold {hard} x {_kind_words(kind)} of {name}"
                + (f" ({format_bytes(hard * one)})" if one else "") + f" and its claims already count {used};"
                f" this asks {asked} more, {over} over the limit{memory}. Release a claim, or ask the platform team"
                f" to raise spec.tenants[{ns}] of {name}.{total}")))
    tenant = tenants[ns]
    if tenant.max_memory_bytes is not None:  # charged at allocation, so whether made or not
        found += memory_findings(request, facts.ledgers.get(name), parsed.status.classes_in_force, name, ns,
                                 tenant.max_memory_bytes)
    ready = totals.condition("Ready") if totals else None
    if ready is not None and ready.status != "True":
        found.append(Finding("PolicyNotReady", f"GpuSlicePolicy {name} is not Ready ({ready.reason}):"
                                               f" {ready.message}", blocking=ready.reason != "Deleting"))
    return found + (_capacity(request, name, kind, cluster) if made else [])


def _aligned(request: Request, policy: str, kind: str, cluster: OccupancyMap) -> list[Finding] | None:
    """For whole GPUs that must share attributes (planning.aligned): whether a node has that many free
    that do, and if none has, the nearest set and the claims whose release would free one; None for
    any other request."""
    if not request.match or request.count < 2 or kind != FULL:
        return None
    room = aligned_room(cluster.gpus, policy, kind, request.count, request.match)
    what = f"{request.count} x whole GPU of {policy} that {room.phrase}"
    if room.fits:
        return [Finding("AlignedFree", f"{request.name}: {what} are free now ({room.where}): the scheduler should"
                                       " place it (see its Events below).", blocking=False)]
    nearest = (f" The most free ones that do: {room.best} ({room.where})." if room.best else
               f" No free {_kind_words(kind)} of {policy} publishes what they must share.")
    if room.freeing:
        then = (f" Releasing {', '.join(room.freeing)} would free {request.count} that do: {room.freeing_where}.")
    elif room.kept_off:
        then = f" The nearest set waits for GPUs kept off ({'; '.join(room.kept_off)}): {room.freeing_where}."
    else:
        then = (f" No node of {policy} has {request.count} such GPUs at all: it waits for one that has, or ask for a"
                " looser alignment.")
    return [Finding("NoAlignedSet", f"{request.name}: {room.free} x whole GPU of {policy} are free, but no"
                                    f" {request.count} of them on one node {room.phrase}.{nearest}{then}")]


def _capacity(request: Request, policy: str, kind: str, cluster: OccupancyMap) -> list[Finding]:
    places, memory = room_for(cluster.gpus, policy, kind, request.memory)
    free = sum(p.free for p in places)
    what = f"{_kind_words(kind)}" + (f" of {format_bytes(memory)}" if memory else "")
    if free >= max(1, request.count):
        aligned = _aligned(request, policy, kind, cluster)
        if aligned is not None:
            return aligned
        return [Finding("FreeDevices", f"{free} x {what} of {policy} are free now, on"
                                       f" {len({p.gpu.node for p in places if p.free})} nodes: the scheduler should"
                                       " place it (see its Events below, e.g. the pod's node selector or"
                                       " another of its claims).", blocking=False)]
    kept = [p for p in places if p.kept_off]
    findings = []
    nodes = len({g.node for g in cluster.gpus if policy in g.policies})
    largest = largest_free(cluster.gpus, policy)
    biggest = (f" The largest free one: {_kind_words(largest[1])} ({format_bytes(largest[2])}) on {largest[0].node}"
               f" GPU {largest[0].index}." if largest else f" Nothing of {policy} is free.")
    findings.append(Finding("NoFreeDevice", f"No free {what} of {policy} on any of its {nodes} nodes"
                                            f" ({request.count} asked, {free} free).{biggest}"))
    if kept:
        reasons: dict[str, list[str]] = {}
        for place in kept:
            for reason in place.reasons or ("kept off",):
                reasons.setdefault(reason, []).append(f"{place.gpu.node} GPU {place.gpu.index}")
        parts = [f"{reason} ({', '.join(gpus[:4])}{' ...' if len(gpus) > 4 else ''})"
                 for reason, gpus in sorted(reasons.items())]
        findings.append(Finding("KeptOff", f"{sum(p.kept_off for p in kept)} x {what} of {policy} would fit but"
                                           f" are kept off: {'; '.join(parts)}. Tainted devices come back when the"
                                           " GPU is healthy or reconfigured; draining and held ones when the change"
                                           " they wait for is done."))
    return findings


def _overuse_findings(namespace: str, claim: str, results: Sequence[AllocationResult],
                      cluster: OccupancyMap) -> list[Finding]:
    """Who uses more of the claim's GPUs than they were allocated, as the node agents found (their
    GpuMemoryOveruse condition): on a shared GPU a neighbour over its slice is why this pod's own
    CUDA allocations fail, though the scheduler's accounts are right."""
    findings, said = [], set()
    for result in results:
        for gpu in cluster.gpus:
            if gpu.node != result["pool"] or not any(d.name == result["device"] for d in gpu.devices):
                continue
            for holder in gpu.overusing:
                if (gpu.uuid, holder.ref) in said:
                    continue
                said.add((gpu.uuid, holder.ref))
                if holder.ref == f"{namespace}/{claim}":
                    findings.append(Finding("Overusing", f"This pod uses more GPU memory than it was allocated on"
                                                         f" {gpu.node} GPU {gpu.index}: {holder.overuse}",
                                            blocking=False))
                else:
                    findings.append(Finding("NeighbourOverusing", (
                        f"A neighbour on {gpu.node} GPU {gpu.index} ({gpu.product}) uses more GPU memory than it was"
                        f" allocated, so allocations on that GPU can fail although its slices are accounted right:"
                        f" {holder.overuse}"), blocking=False))
    return findings


def diagnose(facts: Facts, policies: Sequence[Body], totals: Sequence[PolicyTotals],
             cluster: OccupancyMap) -> Diagnosis:
    """The findings for ``facts.pod`` (or ``facts.claim_name``), most decisive first."""
    requests: list[tuple[Request, bool, Body | None]] = []
    event_names: set[str] = set()
    phase = ""
    if facts.pod is not None:
        pod = facts.pod
        subject = f"{facts.namespace}/{pod['metadata']['name']}"
        phase = str((pod.get("status") or {}).get("phase", ""))
        event_names.add(str(pod["metadata"]["name"]))
        names = pod_claim_names(pod)
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            claim_name = names.get(str(entry.get("name")))
            claim = facts.claims.get(claim_name) if claim_name else None
            if claim is not None:
                requests += [(r, True, claim) for r in claim_requests(claim.get("spec") or {}, claim_name or "")]
                event_names.add(str(claim_name))
            elif entry.get("resourceClaimTemplateName"):
                template = facts.templates.get(str(entry["resourceClaimTemplateName"]))
                label = f"pod claim {entry.get('name')} (template {entry['resourceClaimTemplateName']},"
                label += " not created yet)"
                if template is None:
                    requests.append((Request(label, str(entry.get("name")), ""), False, None))
                else:
                    spec = (template.get("spec") or {}).get("spec") or {}
                    requests += [(r, False, None) for r in claim_requests(spec, label)]
            else:
                requests.append((Request(f"{claim_name or entry.get('resourceClaimName')} (missing)",
                                         str(entry.get("name")), ""), False, None))
        extended = _extended(pod, facts, policies)
        ext_claim = next((c for n, c in facts.claims.items() if extended and n == extended[0].claim), None)
        requests += [(r, ext_claim is not None, ext_claim) for r in extended]
    else:
        subject = f"{facts.namespace}/{facts.claim_name}"
        claim = facts.claims.get(facts.claim_name or "")
        if claim is not None:
            requests += [(r, True, claim) for r in claim_requests(claim.get("spec") or {}, str(facts.claim_name))]
        event_names.add(str(facts.claim_name))

    findings: list[Finding] = []
    if facts.pod is None and not facts.claims.get(facts.claim_name or ""):
        findings.append(Finding("NotFound", f"No pod or ResourceClaim {subject}."))
    by_policy = {t.name: t for t in totals}
    ours = [(r, made, claim, owner) for r, made, claim in requests
            if (owner := class_owner(r.device_class, policies)) is not None]
    if requests and not ours:
        classes = ", ".join(sorted({r.device_class or "?" for r, _, _ in requests}))
        findings.append(Finding("NotGpuslice", f"{subject} asks for no device of a GpuSlicePolicy (classes:"
                                               f" {classes}).", blocking=False))
    if not requests and facts.pod is not None:
        findings.append(Finding("NoClaims", f"{subject} asks for no device (no resourceClaims, no extended"
                                            " resource a DeviceClass serves).", blocking=False))
    for request, made, claim, (policy, kind) in ours:
        if claim is not None and is_allocated(claim):
            results = allocation_results(claim, driver=None)
            where = ", ".join(f"{r['device']} on {r['pool']}" for r in results
                              if r["request"] in (request.name, request.name.split("/")[0]))
            findings.append(Finding("Allocated", f"Claim {request.claim} is allocated: {where or 'yes'}.",
                                    blocking=False))
            findings += _overuse_findings(facts.namespace, request.claim, results, cluster)
            continue
        body = next(b for b in policies if b["metadata"]["name"] == policy)
        created = str(((claim or {}).get("metadata") or {}).get("creationTimestamp") or "")
        findings += _policy_findings(request, made, facts, body, kind, by_policy.get(policy), cluster, created)
    findings += _admission(_events_about(facts, event_names))
    if phase and phase != "Pending":
        findings.insert(0, Finding("NotPending", f"{subject} is {phase}.", blocking=False))
    elif facts.pod is not None and ours and all(f.code in ("Allocated", "Event", "AdminAccess", "Overusing",
                                                           "NeighbourOverusing") for f in findings):
        findings.append(Finding("WaitingOnNode", "Every claim is allocated; the pod waits for its node (the kubelet"
                                                 " prepares the devices): see the Events above.", blocking=False))
    order = ["NotFound", "NotATenant", "AdminAccessRefused", "PolicyInvalid", "WebhookDown", "NotAdmitted", "OverLimit",
             "LimitsNotInForce", "ClassNotInForce", "MadeBeforeQuota", "OverMemory", "PolicyNotReady", "NoFreeDevice",
             "NoAlignedSet", "KeptOff", "AdmissionDenied", "NotPending", "Overusing", "NeighbourOverusing"]
    findings.sort(key=lambda f: order.index(f.code) if f.code in order else len(order))
    return Diagnosis(subject, phase, tuple(r for r, _, _ in requests), tuple(findings))
