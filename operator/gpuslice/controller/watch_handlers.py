"""The controller's handlers of what it watches besides its policies: namespaces, nodes, slices,
claims, quotas, ledgers and DeviceClasses. Each notes what the event can change (controller.changes)
and reconciles at once the policies whose status it changes now.

Kopf runs each after the index of the same resource holds the new object, on the event loop.
What they share is Kopf's ``memo`` (controller.runtime).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import kopf
import structlog

from gpuslice.api.ledger import LEDGER_PLURAL
from gpuslice.api.policy import GROUP, VERSION
from gpuslice.controller.admin_access import NamespaceView
from gpuslice.controller.indexes import SLICES, class_value, other_driver, ours, overuse_policies
from gpuslice.controller.reconcile import reconcile
from gpuslice.controller.runtime import Runtime
from gpuslice.controller.state import Context
from gpuslice.controller.tenancy import LedgerView, QuotaView
from gpuslice.controller.tenancy_labels import routed_as_wanted, sync_routes
from gpuslice.controller.world import World
from gpuslice.dra.names import LABEL_POLICY
from gpuslice.dra.policy_wire import admin_namespaces, tenant_namespaces
from gpuslice.kube.client import KubeError
from gpuslice.planning.node.coexistence import other_driver_gpus
from gpuslice.planning.reads.usage import ClaimView, SliceView

log = structlog.get_logger(__name__)


async def reconcile_each(ctx: Context, bodies: Sequence[Any], current: World, *,
                         converge_objects: bool = True) -> None:
    """Reconcile every policy an event touches; one failing does not keep the others waiting
    (it is logged, and the status timer converges it again)."""
    for body in bodies:
        try:
            await reconcile(ctx, body, current, converge_objects=converge_objects)
        except (KubeError, kopf.TemporaryError):
            continue


SETTLE = 1.0  # seconds a policy's quotas and ledgers have to settle before its status follows them


async def _refresh(memo: Runtime, ctx: Context, policy: str, kwargs: dict[str, Any]) -> None:
    """``policy``'s status, within SETTLE seconds: the events of its tenants' quotas come one by one
    (kube-controller-manager syncs each), and each wrote the status before; now those of a second are
    one write. When that fails the status timer looks again (this event will not)."""
    pending = memo.refreshes.get(policy)
    if pending is not None and not pending.done():
        return  # one is coming, and reads the indexes (live) when it runs

    async def later() -> None:
        await asyncio.sleep(SETTLE)
        now = memo.world(kwargs)
        body = now.policies.get(policy)
        if body is not None:
            try:
                await reconcile(ctx, body, now, converge_objects=False)
            except (KubeError, kopf.TemporaryError):
                memo.changes.mark([policy])
            except Exception:  # logged; the status timer looks again
                log.exception("refreshing the policy's status failed unexpectedly", policy=policy)
                memo.changes.mark([policy])

    memo.refreshes[policy] = asyncio.create_task(later())


async def class_event(name: str, labels: kopf.Labels, spec: kopf.Spec, type: str | None, memo: Runtime,
                      **_: Any) -> None:
    memo.changes.shared_seen(f"deviceclass/{name}", None if type == "DELETED" else class_value(labels, spec))


async def ledger_event(name: str, spec: kopf.Spec, status: kopf.Status, type: str | None, memo: Runtime,
                       **kwargs: Any) -> None:
    """A maxMemory ledger came into force (the webhook counted its namespace), changed its limit or
    went: who is admitted follows at once. Its charges alone change nothing here."""
    ctx = memo.ctx
    if type is None or ctx is None:
        return
    seen = None if type == "DELETED" else LedgerView.from_ledger(spec, status)
    before = ctx.ledgers_seen.pop(name, None)
    if seen is not None:
        ctx.ledgers_seen[name] = seen
    which = seen or before
    if which is None or (before is not None and seen is not None and before.model_key() == seen.model_key()):
        return  # only what it holds changed
    await _refresh(memo, ctx, which.policy, kwargs)


async def node_event(name: str, labels: kopf.Labels, type: str | None, memo: Runtime, **_: Any) -> None:
    """Kopf runs this after it updated node_index, and on the event loop: the node version
    (FleetMemo's key) moves only once the index holds what it stands for. Bumped earlier (from
    the index handler, which Kopf runs in a thread before it stores the result), a reconcile in
    between kept the old labels under the new version, for good."""
    memo.changes.node_seen(name, None if type == "DELETED" else dict(labels))


async def other_driver_event(name: str, spec: kopf.Spec, type: str | None, memo: Runtime, **_: Any) -> None:
    """Another driver's GPUs came or went on a node: every policy's status may say so."""
    found = other_driver_gpus(spec)
    seen = (spec.get("nodeName"), found.driver, found.gpu_devices) if found.gpu_devices else None
    memo.changes.shared_seen(f"resourceslice/{name}", None if type == "DELETED" else seen)


async def claim_event(namespace: str | None, name: str, status: kopf.Status, type: str | None, memo: Runtime,
                      **kwargs: Any) -> None:
    """Noted once claim_index holds the claim (changes.py says why); a node agent's overuse mark
    on it is acted on (controller/overuse.py)."""
    key = (namespace or "", name)
    memo.changes.claim_seen(key, None if type == "DELETED" else ClaimView.from_claim(key[0], name, status))
    if memo.ctx is not None:
        await memo.overuse.claim_seen(memo.ctx.kube, key, None if type == "DELETED" else status,
                                      overuse_policies(kwargs))


async def namespace_event(name: str, labels: kopf.Labels, uid: str | None, status: kopf.Status, meta: kopf.Meta,
                          type: str | None, memo: Runtime, **kwargs: Any) -> None:
    # With its resourceVersion: a view without one is taken as the controller's own last write left
    # the namespace (tenancy_labels.plan_tenancy_labels), so a label someone took off was never put back.
    view = None if type == "DELETED" else NamespaceView.from_namespace(labels, uid, status,
                                                                       meta.get("resourceVersion"))
    memo.changes.shared_seen(f"namespace/{name}", view)
    ctx = memo.ctx
    if type is None or view is None or ctx is None:
        return
    now = memo.world(kwargs)
    if view.active and not routed_as_wanted(name, view, now.policies.values(), ctx.namespace):
        # A routing label someone else took off (or put on): put it as the policies say. An added
        # namespace a policy names is labelled by the converge below.
        with contextlib.suppress(KubeError):  # the drift converge tries again
            await sync_routes(ctx.kube, ctx.tenancy_labels, {name: view}, lambda: now.policies_now().values(),
                              ctx.namespace,
                              ctx.routes_written)
    if type != "ADDED":
        return
    affected = []
    for body in now.policies.values():
        if name in {*tenant_namespaces(body), *admin_namespaces(body)}:
            affected.append(body)
    await reconcile_each(ctx, affected, now)


async def slice_event(spec: kopf.Spec, annotations: kopf.Annotations, memo: Runtime, **_: Any) -> None:
    """Devices came or went: their policies' status follows at its next refresh (at most every
    ``--status-interval``), not at once. Nothing a policy makes depends on its devices (taints
    travel on them), so its objects are not converged again; and a status written at each node's
    publish was one write per node per policy while a fleet published, each sent to every watcher
    of the policies: now a policy's status is written at most once per interval, however many
    nodes publish meanwhile."""
    memo.changes.slice_seen(SliceView.from_slice(spec, annotations))  # a deleted slice's devices count too


async def quota_event(namespace: str | None, name: str, labels: kopf.Labels, meta: kopf.Meta,
                      status: kopf.Status, type: str | None, memo: Runtime, **kwargs: Any) -> None:
    """A tenant's quota came, went or changed what it enforces: who is admitted follows at once
    (a limited tenant is admitted only for what its quota's status.hard counts)."""
    ctx = memo.ctx
    if type is None or ctx is None:
        return
    key = (namespace or "", name)
    seen = None if type == "DELETED" else QuotaView.from_quota(labels[LABEL_POLICY], meta, status)
    before = ctx.quotas_seen.pop(key, False)  # False: never seen (None would be a deleted one)
    if seen is not None:
        ctx.quotas_seen[key] = seen
    if before == seen:
        return  # only its usage changed
    await _refresh(memo, ctx, labels[LABEL_POLICY], kwargs)


def register_watch_handlers(registry: kopf.OperatorRegistry) -> None:
    kopf.on.event("resource.k8s.io", "v1", "deviceclasses", registry=registry)(class_event)
    kopf.on.event(GROUP, VERSION, LEDGER_PLURAL, registry=registry)(ledger_event)
    kopf.on.event("v1", "nodes", registry=registry)(node_event)
    kopf.on.event(*SLICES, registry=registry, when=other_driver)(other_driver_event)
    kopf.on.event("resource.k8s.io", "v1", "resourceclaims", registry=registry)(claim_event)
    kopf.on.event("v1", "namespaces", registry=registry)(namespace_event)
    kopf.on.event(*SLICES, registry=registry, when=ours)(slice_event)
    kopf.on.event("v1", "resourcequotas", registry=registry, labels={LABEL_POLICY: kopf.PRESENT})(quota_event)
