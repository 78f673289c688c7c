"""Writing a policy's status: the full status when it changed, the verdict alone when the full one
cannot be worked out or written, and the status while its deletion waits.

What the controller recorded for admission and for itself (admin-access labels, admitted tenants,
classes in force) is kept in memory between writes (``Context.policy``): a status is built from
that record, not from a body read earlier, which may lag the controller's own writes.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from gpuslice.api.resource import GpuSlicePolicy, ParseProblem
from gpuslice.api.status import AdmittedTenant, ClassInForce
from gpuslice.controller.events import post_event
from gpuslice.controller.metrics import POLICY_METRICS, PolicyFigures
from gpuslice.controller.state import Context
from gpuslice.controller.status import STATUS_REFUSED, Findings, build_status, status_body
from gpuslice.controller.world import World
from gpuslice.coordinates import policy_path, policy_status_path
from gpuslice.kube.client import Conflict, KubeError
from gpuslice.planning.reads.usage import devices_by_policy, published_by_policy, usage
from gpuslice.planning.selection import Problem

log = structlog.get_logger(__name__)


def now_stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def records(ctx: Context, policy: GpuSlicePolicy) -> tuple[frozenset[str], list[AdmittedTenant]]:
    state = ctx.policy(policy.name)
    labels = state.label_record if state.label_record is not None else frozenset(policy.status.admin_access_labels)
    return labels, state.admitted if state.admitted is not None else list(policy.status.admitted_tenants)


def in_force(ctx: Context, policy: GpuSlicePolicy) -> list[ClassInForce]:
    kept = ctx.policy(policy.name).in_force
    return kept if kept is not None else list(policy.status.classes_in_force)


async def write_status(ctx: Context, policy: GpuSlicePolicy, findings: Findings,
                       labels: frozenset[str] | None = None, admitted: list[AdmittedTenant] | None = None) -> None:
    """Patch status when it changed, and post Events on transitions a human must see."""
    if labels is None or admitted is None:
        labels, admitted = records(ctx, policy)
    status = build_status(policy, findings, now_stamp()).model_copy(update={
        "admin_access_labels": sorted(labels), "admitted_tenants": admitted,
        "classes_in_force": in_force(ctx, policy)})
    POLICY_METRICS.record(policy.name, PolicyFigures(status, findings.pending, findings.draining,
                                                     findings.mig_failed, findings.unhealthy,
                                                     dict(findings.usage.alignments)))
    new = status_body(status)
    old = policy.status.model_dump(by_alias=True, exclude_none=True, mode="json")
    # Moves under way are the defragmenter's to write (controller.defrag): never from a body read earlier.
    old.pop("defragmentation", None)
    if new == old:
        return
    try:
        await ctx.kube.merge_patch(policy_status_path(policy.name), {"status": new})
    except KubeError as error:
        if not error.transient:
            # The policy must say why it has no verdict: the condition alone, which the API server
            # takes whatever else it refused (the failure still counts in the backoff).
            await _write_verdict_only(ctx, policy.name, policy.metadata.generation, STATUS_REFUSED, seen=old, message=(
                f"The API server refused the status gpuslice worked out for GpuSlicePolicy {policy.name}:"
                f" {error.message}. Without it the policy's devices stay as they are and nothing new is"
                " published; gpuslice tries again with a growing delay. Change the spec field the message"
                " names; if the spec is valid, this is a gpuslice bug: report it with this message."))
        raise
    was = {c.type: c for c in policy.status.conditions}
    now = {c.type: c for c in status.conditions}
    for kind, event_type in (("Valid", "Warning"), ("Degraded", "Warning")):
        bad = now[kind].status == ("False" if kind == "Valid" else "True")
        before = was.get(kind)
        if bad and (before is None or before.status != now[kind].status or before.reason != now[kind].reason):
            await post_event(ctx.kube, policy.name, policy.metadata.uid, event_type, now[kind].reason,
                             now[kind].message)
    if was.get("Valid") and was["Valid"].status == "False" and now["Valid"].status == "True":
        await post_event(ctx.kube, policy.name, policy.metadata.uid, "Normal", "SpecValid",
                         "The spec is valid again; its objects are being brought up to date.")


def parse_problem(name: str, problem: ParseProblem) -> str:
    """What a human needs from a spec that does not parse: the fields, what is wrong, the fix."""
    fields = problem.fields(5)
    return (f"GpuSlicePolicy {name} does not parse: {fields}. Fix these fields (kubectl edit gsp {name});"
            " if the apiserver accepted them, the installed CRD is older than the controller: apply crds/.")


async def write_invalid_shape(ctx: Context, body: Mapping[str, Any], message: str) -> None:
    """Valid=False for a spec that does not parse; written once, not on every status refresh."""
    await _write_verdict_only(ctx, body["metadata"]["name"], body["metadata"].get("generation"), "InvalidSpec",
                              message, seen=body.get("status") or {})


async def write_failing(ctx: Context, body: Mapping[str, Any], message: str) -> None:
    """``Degraded=True`` (``ApplyFailed``: as the next full status says it) for a reconcile that keeps
    failing outside its converge, with nothing else of the status changed: the verdict a status holds
    stands (a restarted API server must not make every agent withdraw the policy's devices).
    Written once, not on every try."""
    generation = (body.get("metadata") or {}).get("generation")

    def degraded(status: Mapping[str, Any]) -> dict[str, Any] | None:
        conditions = list(status.get("conditions") or [])
        old: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Degraded"), {})
        if (old.get("status"), old.get("reason"), old.get("message")) == ("True", "ApplyFailed", message[:2000]):
            return None
        since = old.get("lastTransitionTime") if old.get("status") == "True" else None
        condition = {"type": "Degraded", "status": "True", "reason": "ApplyFailed", "message": message[:2000],
                     "lastTransitionTime": since or now_stamp(), "observedGeneration": generation}
        return {"conditions": [c for c in conditions if c.get("type") != "Degraded"] + [condition]}

    await _patch_conditions(ctx, body["metadata"]["name"], degraded, seen=body.get("status") or {})


async def _write_verdict_only(ctx: Context, name: str, generation: int | None, reason: str, message: str, *,
                              seen: Mapping[str, Any]) -> None:
    """Valid=False with ``reason`` at ``generation``, and nothing else of the status changed: for when
    the full status cannot be worked out (a spec that does not parse) or written (the API server
    refused it). Written once, not on every try."""

    def verdict(status: Mapping[str, Any]) -> dict[str, Any] | None:
        old: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Valid"), {})
        recorded = (old.get("reason"), old.get("message"), status.get("observedGeneration"))
        if recorded == (reason, message[:2000], generation):
            return None
        since = old.get("lastTransitionTime") if old.get("status") == "False" else None
        condition = {"type": "Valid", "status": "False", "reason": reason, "message": message[:2000],
                     "lastTransitionTime": since or now_stamp()}
        others = [c for c in status.get("conditions") or [] if c.get("type") != "Valid"]
        return {"observedGeneration": generation, "conditions": [condition, *others]}

    try:
        if await _patch_conditions(ctx, name, verdict, seen=seen):
            log.warning("policy has no verdict", policy=name, reason=reason, error=message)
    except KubeError as error:
        log.error("the policy's verdict could not be written either", policy=name, error=str(error))


async def _patch_conditions(ctx: Context, name: str, change: Callable[[Mapping[str, Any]], dict[str, Any] | None],
                            *, seen: Mapping[str, Any]) -> bool:
    """Patch the status ``change`` makes of the policy's status as the API server has it now, under
    its resourceVersion; whether it wrote. A merge patch replaces the conditions list whole: one made
    from a body read before another condition was written (the verdict, then ApplyFailed) would drop
    that condition. Nothing is read when the status ``seen`` (the caller's body) needs no change."""
    if change(seen) is None:
        return False
    for attempt in range(3):
        body = await ctx.kube.get(policy_path(name))
        patch = change(body.get("status") or {})
        if patch is None:
            return False
        try:
            await ctx.kube.merge_patch(policy_status_path(name), {
                "metadata": {"resourceVersion": body["metadata"]["resourceVersion"]}, "status": patch})
            return True
        except Conflict:
            if attempt == 2:
                raise
    return False


async def report_deleting(ctx: Context, body: Mapping[str, Any], world: World) -> str | None:
    """Status while deletion waits; what it waits for, or None when the policy may go.

    It waits for the claims that hold its devices, and then for the node agents to remove its
    devices: the policy is the tenancy rule's parameter, and with it gone a device still
    published would be open to any namespace (its DeviceClass lingers until garbage collection,
    a late scheduler write is no longer judged)."""
    name = body["metadata"]["name"]
    mine = world.slices_of(name)
    devices = devices_by_policy(mine).get(name, set())
    held = usage(devices, world.claims)
    parsed = world.policy_of(body)
    policy = parsed if isinstance(parsed, GpuSlicePolicy) else None  # None: it never parsed; deletion still waits
    publishing = {ref.pool for ref in published_by_policy(mine).get(name, set())}
    # Only the nodes the policy selects now hold it: a node that publishes its devices anyway (a
    # compromised agent) must not keep it from going, for good; nor one taken out of its selection
    # since (whose agent drains them: the drain rule, not the policy, keeps them from claims).
    selected = set(world.nodes_selected(policy)) if policy else publishing
    nodes = sorted(publishing & selected)
    if publishing - selected:
        log.warning("deletion does not wait for nodes the policy does not select", policy=name,
                    nodes=sorted(publishing - selected))
    if not held.holding_claims and not nodes:
        return None
    if policy is not None:
        findings = Findings(list[Problem](), world.selection(policy),
                            len(devices), held, deleting=True, publishing_nodes=nodes)
        await write_status(ctx, policy, findings)
    if held.holding_claims:
        claims = held.holding_claims
        return f"waiting for {len(claims)} claims to release devices of {name}: {', '.join(claims[:10])}"
    return (f"waiting for the node agents of {len(nodes)} nodes to remove the devices of {name}:"
            f" {', '.join(nodes[:10])}")
