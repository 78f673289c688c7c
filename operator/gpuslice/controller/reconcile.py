"""Reconcile one policy: judge it, converge its objects, write its status.

The same coroutine serves every trigger (the policy changed, a tenant
namespace appeared, the periodic drift check), so it is idempotent and safe to
run again at any point; a per-policy lock keeps two triggers from interleaving.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kopf
import pydantic
import structlog

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.controller.admin_access import NamespaceView, sync_admin_labels
from gpuslice.controller.apply import OWNED_KINDS, converge
from gpuslice.controller.events import post_event
from gpuslice.controller.metrics import RECONCILES
from gpuslice.controller.status import Findings, build_status, status_body
from gpuslice.inventory.nodes import node_gpus
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.planning.cluster_objects import desired_objects
from gpuslice.planning.usage import (
    ClaimView,
    SliceView,
    devices_by_policy,
    devices_in_flux,
    failed_devices,
    pending_devices,
    unhealthy_devices,
    usage,
)
from gpuslice.planning.validation import Problem, Selection, select, validate

log = structlog.get_logger(__name__)
POLICIES = "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"


@dataclass
class Context:
    """What every handler shares: the API client and per-policy locks."""

    kube: KubeClient
    username: str
    taint_rule_api: str = "resource.k8s.io/v1"
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # Policies whose last converge failed. Event handlers (a namespace appeared, a slice changed)
    # are not retried by Kopf, so the status timer converges these again instead of only reporting.
    unconverged: set[str] = field(default_factory=set)

    def lock(self, policy: str) -> asyncio.Lock:
        return self.locks.setdefault(policy, asyncio.Lock())

    def forget(self, policy: str) -> None:
        """A deleted policy's bookkeeping goes with it."""
        self.locks.pop(policy, None)
        self.unconverged.discard(policy)


@dataclass(frozen=True)
class World:
    """The controller's view of the cluster, from its watches (no API calls)."""

    policies: Mapping[str, Mapping[str, Any]]
    namespaces: Mapping[str, NamespaceView]
    nodes: Mapping[str, Mapping[str, str]]
    slices: Sequence[SliceView]
    claims: Sequence[ClaimView]

    def inventory(self) -> list[tuple[dict[str, str], Any]]:
        found = []
        for name, labels in sorted(self.nodes.items()):
            gpus = node_gpus(name, labels)
            if gpus is not None:
                found.append((dict(labels), gpus))
        return found

    def parsed_policies(self) -> list[GpuSlicePolicy]:
        parsed = []
        for body in self.policies.values():
            try:
                policy = GpuSlicePolicy.from_body(body)
            except pydantic.ValidationError:
                continue
            if not policy.metadata.deletion_timestamp:
                parsed.append(policy)
        return parsed


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def reconcile(ctx: Context, body: Mapping[str, Any], world: World, *, converge_objects: bool = True) -> None:
    name = body["metadata"]["name"]
    converge_objects = converge_objects or name in ctx.unconverged
    async with ctx.lock(name):
        try:
            await _reconcile(ctx, body, world, converge_objects)
            RECONCILES.labels(result="ok").inc()
        except (KubeError, kopf.TemporaryError) as error:
            RECONCILES.labels(result="error").inc()
            if converge_objects:
                ctx.unconverged.add(name)
            log.warning("reconcile failed; will retry", policy=name, error=str(error))
            raise
        if converge_objects:
            ctx.unconverged.discard(name)


async def _reconcile(ctx: Context, body: Mapping[str, Any], world: World, converge_objects: bool) -> None:
    try:
        policy = GpuSlicePolicy.from_body(body)
    except pydantic.ValidationError as error:
        await _write_invalid_shape(ctx, body, parse_problem(body["metadata"]["name"], error))
        return
    if policy.metadata.deletion_timestamp:
        return
    inventory = world.inventory()
    selection = select(policy, inventory)
    others = [(p, select(p, inventory)) for p in world.parsed_policies() if p.name != policy.name]
    problems = validate(policy, selection, others)
    devices = devices_by_policy(world.slices).get(policy.name, set())
    errors: list[str] = []
    if not problems and converge_objects:
        active = {n for n, view in world.namespaces.items() if view.active}
        # A pool being rewritten keeps its devices' taint rules until the rewrite is complete.
        ruled = devices | devices_in_flux(world.slices).get(policy.name, set())
        desired = desired_objects(policy, active, ruled, taint_rule_api=ctx.taint_rule_api)
        kinds = [*OWNED_KINDS, (ctx.taint_rule_api, "DeviceTaintRule")]
        result = await converge(ctx.kube, policy.name, desired.all(), kinds)
        errors = result.errors
        try:
            await sync_admin_labels(ctx.kube, policy.name, set(policy.spec.admin_access.namespaces), world.namespaces)
        except KubeError as error:
            errors.append(f"labelling admin-access namespaces: {error.message}")
    # Held back for a claim, not merely draining for a few seconds before a change (no news).
    allocated = {ref for claim in world.claims for ref in claim.devices}
    pending = len(devices & pending_devices(world.slices) & allocated)
    findings = Findings(problems, selection, len(devices), usage(devices, world.claims), errors, pending=pending,
                        mig_failed=len(devices & failed_devices(world.slices)),
                        unhealthy=len(devices & unhealthy_devices(world.slices)))
    await write_status(ctx, policy, findings)
    if errors:
        # Often transient: e.g. the apiserver has not loaded our updated tenancy policy yet
        # and denies the template for a tenant we just added. Status says it; retry soon.
        raise kopf.TemporaryError(f"{len(errors)} objects could not be applied: {errors[0]}", delay=2)


async def write_status(ctx: Context, policy: GpuSlicePolicy, findings: Findings) -> None:
    """Patch status when it changed, and post Events on transitions a human must see."""
    status = build_status(policy, findings, _now())
    new = status_body(status)
    old = policy.status.model_dump(by_alias=True, exclude_none=True, mode="json")
    if new == old:
        return
    await ctx.kube.merge_patch(f"{POLICIES}/{policy.name}/status", {"status": new})
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


def parse_problem(name: str, error: pydantic.ValidationError) -> str:
    """What a human needs from a spec that does not parse: the fields, what is wrong, the fix."""
    fields = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()[:5])
    return (f"GpuSlicePolicy {name} does not parse: {fields}. Fix these fields (kubectl edit gsp {name});"
            " if the apiserver accepted them, the installed CRD is older than the controller: apply crds/.")


async def _write_invalid_shape(ctx: Context, body: Mapping[str, Any], message: str) -> None:
    """Valid=False for a spec that does not parse; written once, not on every status refresh."""
    name = body["metadata"]["name"]
    status = body.get("status") or {}
    old: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Valid"), {})
    generation = body["metadata"].get("generation")
    if (old.get("reason"), old.get("message"), status.get("observedGeneration")) == (
            "InvalidSpec", message[:2000], generation):
        return
    log.warning("policy does not parse", policy=name, error=message)
    since = old.get("lastTransitionTime") if old.get("status") == "False" else None
    condition = {"type": "Valid", "status": "False", "reason": "InvalidSpec", "message": message[:2000],
                 "lastTransitionTime": since or _now()}
    others = [c for c in status.get("conditions") or [] if c.get("type") != "Valid"]
    await ctx.kube.merge_patch(f"{POLICIES}/{name}/status", {"status": {
        "observedGeneration": generation, "conditions": [condition, *others]}})


async def report_deleting(ctx: Context, body: Mapping[str, Any], world: World) -> list[str]:
    """Status while deletion waits for claims; returns the claims still holding devices."""
    name = body["metadata"]["name"]
    devices = devices_by_policy(world.slices).get(name, set())
    held = usage(devices, world.claims)
    try:
        policy = GpuSlicePolicy.from_body(body)
    except pydantic.ValidationError:
        return held.holding_claims  # a spec that never parsed: nothing to report on, deletion still waits
    if held.holding_claims:
        inventory = world.inventory()
        findings = Findings(list[Problem](), select(policy, inventory) if inventory else Selection(()),
                            len(devices), held, deleting=True)
        await write_status(ctx, policy, findings)
    return held.holding_claims
