"""Reconcile one policy: judge it, converge its objects, write its status.

The same coroutine serves every trigger (the policy changed, a tenant
namespace appeared, the periodic drift check), so it is idempotent and safe to
run again at any point; a per-policy lock keeps two triggers from interleaving.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import kopf
import structlog

from gpuslice.api.resource import GpuSlicePolicy, ParseProblem
from gpuslice.api.status import AdmittedTenant, ClassInForce
from gpuslice.controller.admin_access import plan_labels, sync_admin_labels
from gpuslice.controller.apply import LEDGER_KINDS, LIMIT_KINDS, REST_KINDS, ApplyResult, converge
from gpuslice.controller.metrics import POLICY_METRICS, RECONCILE_DURATION, RECONCILES
from gpuslice.controller.state import Context
from gpuslice.controller.status import TENANCY_NOT_ENFORCED, Findings
from gpuslice.controller.status_write import (
    in_force,
    parse_problem,
    records,
    write_failing,
    write_invalid_shape,
    write_status,
)
from gpuslice.controller.tenancy import (
    admitted_tenants,
    memory_in_force,
    memory_webhook_unenforced,
    tenancy_unenforced,
)
from gpuslice.controller.tenancy_labels import sync_routes
from gpuslice.controller.world import World
from gpuslice.coordinates import DEVICE_CLASSES, policy_status_path
from gpuslice.errors import GpusliceError
from gpuslice.kube.client import KubeError
from gpuslice.planning.cluster.cluster_objects import DeviceRef, desired_ledgers, desired_objects
from gpuslice.planning.kinds import DeviceKind, classes_in_force
from gpuslice.planning.modes import device_kinds, mode_of
from gpuslice.planning.node.coexistence import mig_manager_active
from gpuslice.planning.reads.usage import (
    device_info,
    devices_by_policy,
    failed_devices,
    foreign_claims,
    pending_devices,
    unhealthy_devices,
    usage,
)
from gpuslice.planning.selection import Problem
from gpuslice.planning.validation import validate

log = structlog.get_logger(__name__)
CLOCK_WAIT = 2.0  # the most a reconcile waits for a new quota's second to pass (tenancy.SECOND)
MEMORY_PROBE_FOR = 30.0  # seconds a probe of the maxMemory webhook stands for


async def reconcile(ctx: Context, body: Mapping[str, Any], world: World, *, converge_objects: bool = True) -> None:
    """Judge, converge (when asked, or when a failed converge's backoff is up) and report a policy.
    A failure raises kopf.TemporaryError with the backoff's delay."""
    name = body["metadata"]["name"]
    generation = int(body["metadata"].get("generation") or 0)
    # A generation whose tenancy was never probed (a restart, or a timer that saw the edit before the
    # update handler did) is converged and probed now, rather than reported as unverified.
    tenancy = ctx.policy(name).tenancy
    unprobed = tenancy is None or tenancy[0] != generation
    converge_objects = converge_objects or unprobed or (ctx.policy(name).unconverged and ctx.due(name))
    uid = str(body["metadata"].get("uid") or "")
    async with ctx.lock(name):
        if uid and uid in ctx.gone:
            return  # deleted since this body was read: nothing of it is reported again
        state = ctx.policy(name)  # after the lock: a deletion may have forgotten the one before
        seen_uid, seen = state.newest or (uid, generation)
        if seen_uid == uid and generation < seen:
            return  # an older body than one already reconciled: the newer one's work stands
        state.newest = (uid, generation)
        started = time.monotonic()
        try:
            await _reconcile(ctx, body, world, converge_objects)
            RECONCILES.labels(result="ok").inc()
        except (KubeError, ConvergeFailed) as error:
            RECONCILES.labels(result="error").inc()
            transient = isinstance(error, KubeError) and error.transient
            # Every failure counts, a status write's too: a status the API server refuses (or a
            # refresh that keeps failing) is tried again after a growing delay, never every 2 s.
            # A converge's own errors are in the status it wrote (and kept for the refreshes after);
            # any other failure is reported by the next status written.
            delay = ctx.failed(name, generation, transient, why="" if isinstance(error, ConvergeFailed) else str(error))
            log.warning("reconcile failed; will retry", policy=name, error=str(error), retry_in=delay)
            if not isinstance(error, ConvergeFailed) and state.failed_because:
                with contextlib.suppress(KubeError):  # the status says so, if it can be written
                    await write_failing(ctx, body, state.failed_because[0])
            raise kopf.TemporaryError(str(error), delay=delay) from error
        finally:
            RECONCILE_DURATION.labels("converge" if converge_objects else "status").observe(time.monotonic() - started)
            POLICY_METRICS.reconciled(name, "converge" if converge_objects else "status")
        if converge_objects:
            ctx.succeeded(name)


class ConvergeFailed(GpusliceError):
    """Something the policy needs could not be put in place (status says what)."""


async def _write_records(ctx: Context, policy: GpuSlicePolicy, labels: frozenset[str] | None = None,
                         admitted: list[AdmittedTenant] | None = None,
                         classes: list[ClassInForce] | None = None, defer: bool = False) -> None:
    """What the controller records for admission (the classes in force, admitted tenants) and for
    itself (labels it set), written on its own before the step that depends on it; with ``defer``
    (a status refresh: no step depends on it) kept for the status write that follows, in one patch."""
    patch: dict[str, Any] = {}
    if labels is not None and labels != records(ctx, policy)[0]:
        patch["adminAccessLabels"] = sorted(labels)
    if admitted is not None and admitted != records(ctx, policy)[1]:
        patch["admittedTenants"] = [a.model_dump(by_alias=True, exclude_none=True) for a in admitted]
    if classes is not None and classes != in_force(ctx, policy):
        patch["classesInForce"] = [c.model_dump(by_alias=True, exclude_none=True) for c in classes]
    if patch and not defer:
        await ctx.kube.merge_patch(policy_status_path(policy.name), {"status": patch})
    state = ctx.policy(policy.name)
    if labels is not None:
        state.label_record = labels
    if admitted is not None:
        state.admitted = admitted
    if classes is not None:
        state.in_force = classes


async def _memory_probe(ctx: Context, policy: GpuSlicePolicy, world: World) -> str | None:
    """What keeps a maxMemory tenant of ``policy`` from being put in force by the webhook's side, or
    None. The webhook is probed (a dry run) only while a tenant's ledger is in force but its
    record is not yet, and a probe stands for MEMORY_PROBE_FOR seconds."""
    recorded = {(a.namespace, a.limits.max_memory if a.limits else None) for a in records(ctx, policy)[1]}
    waiting = [t for t in policy.spec.tenants if t.memory_limited and (t.namespace, t.max_memory) not in recorded
               and (view := world.namespaces.get(t.namespace)) is not None
               and memory_in_force(policy, t, view, world.ledgers)]
    if not waiting:
        return None
    if ctx.memory_probe is None or ctx.clock() - ctx.memory_probe[0] > MEMORY_PROBE_FOR:
        try:
            found = await memory_webhook_unenforced(ctx.kube, ctx.namespace)
        except KubeError as error:  # the probe's own answer is judged inside; this is the API server
            found = f"the maxMemory webhook could not be probed: {error}"
        ctx.memory_probe = (ctx.clock(), found)
    return ctx.memory_probe[1]


async def _admit(ctx: Context, policy: GpuSlicePolicy, world: World, kinds: Sequence[DeviceKind], *,
                 converged: bool = False, defer: bool = False) -> str | None:
    """Record the admitted tenants; what keeps a maxMemory tenant out, if anything. A tenant whose
    quota was made less than a second ago is admitted once that second is over (tenancy.SECOND):
    waited for here, under the policy's lock."""
    unproven = await _memory_probe(ctx, policy, world)
    memory_wait = {policy.name} if unproven else set()
    while True:
        admission = admitted_tenants(policy, world.namespaces, records(ctx, policy)[1], kinds=kinds,
                                     quotas=world.quotas, ledgers=world.ledgers, webhook_proven=unproven is None,
                                     converged=converged)
        await _write_records(ctx, policy, admitted=admission.tenants, defer=defer)
        if admission.again_in is None or admission.again_in > CLOCK_WAIT:
            # A clock far behind the apiserver's: the status refresh looks again (nothing else will).
            ctx.policy(policy.name).clock_wait = admission.again_in is not None or bool(memory_wait)
            return unproven
        await asyncio.sleep(admission.again_in)


async def _reconcile(ctx: Context, body: Mapping[str, Any], world: World, converge_objects: bool) -> None:
    policy = world.policy_of(body)  # parsed once per change by the index (world.py)
    if isinstance(policy, ParseProblem):
        await write_invalid_shape(ctx, body, parse_problem(body["metadata"]["name"], policy))
        return
    if policy.metadata.deletion_timestamp:
        return
    selection = world.selection(policy)
    nodes = world.nodes_selected(policy)
    others = [(p, world.selection(p)) for p in world.parsed_policies() if p.name != policy.name]
    problems = validate(policy, selection, others, foreign_extended=world.foreign_extended(),
                        controller_namespace=ctx.namespace, selected_nodes=len(nodes))
    kinds = device_kinds(policy, selection)
    mine = world.slices_of(policy.name)
    devices = devices_by_policy(mine).get(policy.name, set())
    errors: list[str] = []
    taken: list[str] = []
    unanswered: KubeError | None = None
    # Removals and changed limits take effect at once (the admission policy also reads spec.tenants);
    # additions wait for a converge, and limited tenants for their quota to be in force (a quota's
    # change of status.hard brings the controller back here: quota_event).
    labelling: list[str] = []
    memory_unproven: str | None = None  # what keeps maxMemory from being put in force, if anything
    if converge_objects:
        # First, whatever the verdict: the label routes a namespace's claims to the rule that judges
        # them against the policies (tenancy_labels), and an added tenant's claims are then told
        # that its quota is on the way rather than that it is no tenant.
        labelling = await _sync_tenancy_labels(ctx, world)
    if not problems and converge_objects:
        active = {n for n, view in world.namespaces.items() if view.active}
        desired = desired_objects(policy, active)
        # What the watches hold of the policy's objects (None: a World made by hand; they are listed).
        watched = world.owned.get(policy.name, []) if world.owned is not None else None
        limits = await converge(ctx.kube, policy.name, desired.limits(), LIMIT_KINDS, watched, ctx.applied)
        # What the classes now enforce, before anyone is admitted under it: the admission policy
        # judges claims against this record, never against a spec not converged (tenancy_rule).
        failed = {path.rsplit("/", 1)[1] for path in limits.failed if path.startswith(f"{DEVICE_CLASSES}/")}
        await _write_records(ctx, policy, classes=classes_in_force(kinds, failed, in_force(ctx, policy)))
        # The maxMemory ledgers (their spec: the limit in force) before anyone is admitted under them.
        uids = {n: view.uid for n, view in world.namespaces.items() if view.active and view.uid}
        wanted = desired_ledgers(policy, uids, ctx.namespace)
        ledgers = ApplyResult()
        if wanted or any(found.policy == policy.name for found in world.ledgers.values()):
            ledgers = await converge(ctx.kube, policy.name, wanted, LEDGER_KINDS, watched, ctx.applied)
        memory_unproven = await _admit(ctx, policy, world, kinds, converged=True)
        # DeviceTaintRules are no longer made (taints travel on the devices); listing the kind, where
        # it is served, prunes those an earlier version made, once per generation of the policy.
        generation = policy.metadata.generation or 0
        pruned = ctx.taint_rules_pruned.get(policy.name) == generation
        prune = [(ctx.taint_rule_api, "DeviceTaintRule")] if ctx.taint_rule_api and not pruned else []
        rest = await converge(ctx.kube, policy.name, desired.rest(), [*REST_KINDS, *prune], watched, ctx.applied)
        if prune and not any("devicetaintrule" in e.lower() for e in rest.errors):
            ctx.taint_rules_pruned[policy.name] = generation
        errors, taken = labelling + limits.errors + ledgers.errors + rest.errors, limits.taken + rest.taken
        ctx.policy(policy.name).failed_because = list(errors)  # what status refreshes report until a converge succeeds
        try:
            plan = plan_labels(set(policy.spec.admin_access.namespaces), world.namespaces, records(ctx, policy)[0],
                               world.label_records(ctx.label_records(), but=policy.name))
            await sync_admin_labels(ctx.kube, policy.name, plan, records(ctx, policy)[0],
                                    lambda record: _write_records(ctx, policy, labels=frozenset(record)))
        except KubeError as error:
            errors.append(f"labelling admin-access namespaces: {error.message}")
        if ctx.probe_due(policy.name, policy.metadata.generation):
            unanswered = await _probe(ctx, policy, kinds[0].class_name)
    else:
        # Written with the status below, in one patch (a quota's events refreshed it in two).
        memory_unproven = await _admit(ctx, policy, world, kinds, defer=True)
        if not converge_objects:
            errors = list(ctx.policy(policy.name).failed_because)  # the last converge's, until one succeeds
        probed = ctx.policy(policy.name).tenancy
        refused = probed is not None and bool(probed[1]) and probed[0] == policy.metadata.generation
        if not problems and (refused or ctx.stale_probe(policy.name)):
            # This generation's probe failed, or another policy's canary did: probe again (a dry run),
            # not only at the next converge.
            unanswered = await _probe(ctx, policy, kinds[0].class_name)
    if unanswered is not None and policy.status.observed_generation == policy.metadata.generation:
        raise unanswered  # the status already judged this generation: it stands until an answer comes
    if not problems:
        generation, unenforced = ctx.policy(policy.name).tenancy or (-1, None)
        if generation != policy.metadata.generation:
            unenforced = "gpuslice has not yet verified that tenancy is enforced for this generation of the policy."
            if unanswered is not None:
                unenforced += f" The dry-run probe got no verdict yet: {unanswered}."
        if unenforced:
            problems = [Problem(TENANCY_NOT_ENFORCED, unenforced)]
    # Held back for a claim, not merely draining for a few seconds before a change (no news).
    allocated = {ref for claim in world.claims for ref in claim.taken}  # admin access holds nothing back
    tainted = devices & pending_devices(mine)
    pending = len(tainted & allocated)
    tenants, admins = {t.namespace for t in policy.spec.tenants}, set(policy.spec.admin_access.namespaces)
    findings = Findings(
        problems, selection, len(devices), usage(devices, world.claims, device_info(mine)), errors,
        pending=pending, kinds=kinds, taken=taken, foreign=foreign_claims(devices, world.claims, tenants, admins),
        draining=len(tainted - allocated),
        mig_failed=len(devices & failed_devices(mine)),
        unhealthy=len(devices & unhealthy_devices(mine)),
        other_drivers=world.other_drivers_on(selection.nodes),
        mig_manager_nodes=sorted(n for n in selection.nodes if mode_of(policy).traits.instances
                                 and mig_manager_active(world.nodes.get(n, {}))),
        left_out=world.left_out(policy.name, set(selection.nodes)),
        # The record the tenancy rule reads moves with valid specs only: a frozen policy's devices
        # stay where they were, and so do the nodes they may be allocated on.
        selected_nodes=None if problems else nodes,
        unselected=_unselected(policy, nodes, devices - tainted),
        memory_unenforced=memory_unproven or "",
    )
    labels, admitted = records(ctx, policy)
    await write_status(ctx, policy, findings, labels, admitted)
    if unanswered is not None:
        raise unanswered  # retried after the (transient) failure's backoff
    unproven = [p.message for p in problems if p.reason == TENANCY_NOT_ENFORCED]
    if converge_objects and (errors or taken or unproven):
        # Bounded backoff (reconcile): bad input is tried again now and then, never in a loop.
        raise ConvergeFailed("; ".join([*errors, *(f"{t} exists and is not gpuslice's" for t in taken), *unproven]))


async def _sync_tenancy_labels(ctx: Context, world: World) -> list[str]:
    """The tenancy labels of every namespace, as every policy names them; what failed, if anything
    (the converge is then tried again)."""
    try:
        await sync_routes(ctx.kube, ctx.tenancy_labels, world.namespaces, lambda: world.policies_now().values(),
                          ctx.namespace, ctx.routes_written)
    except KubeError as error:
        return [f"labelling tenant namespaces: {error.message}"]
    return []


def _unselected(policy: GpuSlicePolicy, nodes: Sequence[str], devices: set[DeviceRef]) -> list[str]:
    """Nodes that publish devices of ``policy`` (untainted: an agent removing them taints them first)
    though the policy selects them neither now nor in its record: a node agent publishing what its
    policy does not give it (a compromised node). The tenancy rule refuses their allocation."""
    known = set(nodes) | set(policy.status.selected_nodes)
    return sorted({ref.pool for ref in devices if ref.pool not in known})


async def _probe(ctx: Context, policy: GpuSlicePolicy, class_name: str) -> KubeError | None:
    """Probe tenancy for this generation of ``policy``. A transient failure (the API server busy,
    restarting or not yet ready) is no verdict: it is returned, to be raised once the status is
    written. A status that judged this generation stands (a restarted controller and API server
    must not withdraw every policy's devices); one that has not judged it yet says that it is
    unverified, and why (a new policy showed no Valid condition at all until an answer came)."""
    try:
        unenforced = await tenancy_unenforced(ctx.kube, ctx.namespace, policy.name, class_name)
    except KubeError as error:
        if not error.transient:
            raise
        return error
    ctx.probed(policy.name, policy.metadata.generation, unenforced)
    return None
