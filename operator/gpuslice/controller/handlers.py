"""The controller's Kopf handlers, registered on a registry of their own.

Kopf watches policies, namespaces, nodes, our ResourceSlices and the
ResourceClaims, and keeps in-memory indexes of what it saw, so a reconcile
reads the cluster from memory and only writes. Foreign objects are only
indexed or observed: no timer, daemon or finalizer ever touches them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import kopf
import structlog

from gpuslice.api.ledger import LEDGER_PLURAL
from gpuslice.api.policy import GROUP, PLURAL, VERSION
from gpuslice.api.resource import GpuSlicePolicy, valid_policy
from gpuslice.controller.admin_access import NamespaceView, plan_labels, sync_admin_labels
from gpuslice.controller.changes import Changes
from gpuslice.controller.crd import crd_leaving as crd_is_leaving
from gpuslice.controller.defrag_auto import Defragmenter
from gpuslice.controller.login import KopfLogin
from gpuslice.controller.overuse import EVICTION_RETRY, OveruseEnforcer, Policies
from gpuslice.controller.reconcile import Context, reconcile, report_deleting
from gpuslice.controller.settings import ControllerSettings
from gpuslice.controller.startup import start_context
from gpuslice.controller.tenancy import LedgerView, QuotaView
from gpuslice.controller.tenancy_labels import routed_as_wanted, sync_routes
from gpuslice.controller.world import FleetMemo, World
from gpuslice.dra.names import DRIVER, LABEL_POLICY
from gpuslice.dra.wire import pool_mark
from gpuslice.kube.client import EndlessBackoff, KubeClient, KubeError
from gpuslice.planning.coexistence import other_driver_gpus
from gpuslice.planning.published import own_pool
from gpuslice.planning.usage import ClaimView, SliceView, slice_policies

POLICY = (GROUP, VERSION, PLURAL)
log = structlog.get_logger(__name__)


def _values(index: Any) -> list[Any]:
    return [value for store in index.values() for value in store]


def _one_per_key(index: Any) -> dict[Any, Any]:
    return {key: value for key, store in index.items() for value in store}


def world(kwargs: dict[str, Any], memo: FleetMemo | None = None, nodes_version: int | None = None) -> World:
    return World(
        policies=_one_per_key(kwargs["policy_index"]),
        namespaces=_one_per_key(kwargs["namespace_index"]),
        nodes=_one_per_key(kwargs["node_index"]),
        slices=_values(kwargs["slice_index"]),
        claims=[c for c in _values(kwargs["claim_index"]) if c is not None],
        foreign_classes={k: v for k, v in _one_per_key(kwargs["class_index"]).items() if v is not False},
        quotas=_one_per_key(kwargs["quota_index"]),
        ledgers=_one_per_key(kwargs["ledger_index"]),
        slice_pools=kwargs["slice_index"],
        policy_pools=kwargs["policy_pool_index"],
        parsed=_one_per_key(kwargs["parsed_index"]),
        nodes_version=nodes_version,
        memo=memo,
        other_drivers={node: list(store) for node, store in kwargs["other_driver_index"].items()},
    )


def _overuse_policies(kwargs: dict[str, Any]) -> Policies:
    """A device's policy as its slice publishes it, and what that policy says about overuse."""
    slices, bodies = kwargs["slice_index"], kwargs["policy_index"]

    def policy_of(pool: str, device: str) -> str | None:
        return next((policy or None for view in slices.get(pool, ()) for name, policy in view.devices
                     if name == device), None)

    def on_overuse(policy: str) -> str:
        return next((str((body.get("spec") or {}).get("onOveruse") or "Report") for body in bodies.get(policy, ())),
                    "Report")

    return Policies(policy_of, on_overuse)


def _class_value(labels: kopf.Labels, spec: kopf.Spec) -> str | bool | None:
    """A DeviceClass's extended resource; False for one of ours (only others' can conflict)."""
    return False if LABEL_POLICY in labels else spec.get("extendedResourceName")


def _orphaned(body: kopf.Body, kwargs: dict[str, Any]) -> bool:
    """A timer of a policy that is gone. Kopf stops a policy's timers when it sees the deletion
    begin, which its finalizer makes sure of; a policy deleted before Kopf put the finalizer on it
    (created and deleted at once) vanishes unseen, and its timers would go on converging its
    objects again from the last body, for good. Such a timer does nothing."""
    name, uid = body["metadata"]["name"], body["metadata"].get("uid")
    return not any((seen.get("metadata") or {}).get("uid") == uid for seen in kwargs["policy_index"].get(name, ()))


async def _reconcile_each(ctx: Context, bodies: list[Any], current: World, *, converge_objects: bool = True) -> None:
    """Reconcile every policy an event touches; one failing does not keep the others waiting
    (it is logged, and the status timer converges it again)."""
    for body in bodies:
        try:
            await reconcile(ctx, body, current, converge_objects=converge_objects)
        except (KubeError, kopf.TemporaryError):
            continue


def build_registry(settings: ControllerSettings, client: Callable[[], Awaitable[KubeClient]],
                   crd_leaving: asyncio.Event | None = None) -> kopf.OperatorRegistry:
    """``client`` makes the API client reconciles write with (the leader's guarded one);
    ``crd_leaving`` is set when the last policy went with its CRD being deleted (controller.crd)."""
    kubeconfig = settings.kubeconfig
    registry = kopf.OperatorRegistry()
    ours = settings
    changes = Changes()
    fleet = FleetMemo()
    overuse = OveruseEnforcer()

    def current(kwargs: dict[str, Any]) -> World:
        return world(kwargs, fleet, changes.nodes_version)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        settings.persistence.finalizer = f"{GROUP}/policy-cleanup"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=GROUP, key="last-handled-configuration")
        settings.scanning.disabled = True  # no CRD/namespace scanning: no RBAC for it needed
        settings.posting.level = 30  # warnings and errors only; our own Events say the rest
        settings.watching.server_timeout = 600
        # Lists (at start, and after a watch's 410 Gone) in pages of 500, as client-go's reflector:
        # a thousand nodes' slices are one ~60 MB answer otherwise, parsed at once.
        settings.watching.chunk_size = 500
        settings.networking.request_timeout = ours.request_timeout
        settings.networking.error_backoffs = EndlessBackoff()  # back within 5 s of the API server
        settings.execution.default_backoff = 5
        # Kopf handles SIGTERM itself; without a stop flag it waits up to this long for a graceful
        # exit. A request to an apiserver going down with us must not keep us alive for minutes.
        settings.process.ultimate_exiting_timeout = ours.shutdown_grace
        memo.ctx = await start_context(await client(), ours)
        memo.defrag = Defragmenter(memo.ctx.kube, ours)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        if "ctx" in memo:
            await memo.ctx.kube.close()

    logins = KopfLogin(kubeconfig)  # this run's (a run of Kopf after the CRD came back gets new ones)

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.AiohttpSession:
        """The same identity as gpuslice's own client (controller/login.py says why not Kopf's login)."""
        return await logins.session()

    @kopf.index(*POLICY, registry=registry, id="policy_index")
    def policy_index(name: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {name: dict(body)}

    @kopf.index(*POLICY, registry=registry, id="parsed_index")
    def parsed_index(name: str, body: kopf.Body, **_: Any) -> dict[str, GpuSlicePolicy | None]:
        """Each policy parsed once per change: every reconcile judges it against all the others."""
        return {name: valid_policy(body)}

    @kopf.index("v1", "namespaces", registry=registry, id="namespace_index")
    def namespace_index(name: str, labels: kopf.Labels, uid: str | None, status: kopf.Status,
                        **_: Any) -> dict[str, NamespaceView]:
        """What changed is noted by namespace_event, once this index holds it (changes.py says why)."""
        return {name: NamespaceView.from_namespace(labels, uid, status)}

    @kopf.index("resource.k8s.io", "v1", "deviceclasses", registry=registry, id="class_index")
    def class_index(name: str, labels: kopf.Labels, spec: kopf.Spec, **_: Any) -> dict[str, str | bool | None]:
        """DeviceClasses gpuslice did not make, with their extended resource (ours map to False)."""
        return {name: _class_value(labels, spec)}

    @kopf.on.event("resource.k8s.io", "v1", "deviceclasses", registry=registry)
    async def class_event(name: str, labels: kopf.Labels, spec: kopf.Spec, type: str | None, **_: Any) -> None:
        changes.shared_seen(f"deviceclass/{name}", None if type == "DELETED" else _class_value(labels, spec))

    @kopf.index("v1", "resourcequotas", registry=registry, id="quota_index", labels={LABEL_POLICY: kopf.PRESENT})
    def quota_index(namespace: str | None, name: str, labels: kopf.Labels, meta: kopf.Meta, status: kopf.Status,
                    **_: Any) -> dict[tuple[str, str], QuotaView]:
        return {(namespace or "", name): QuotaView.from_quota(labels[LABEL_POLICY], meta, status)}

    @kopf.index(GROUP, VERSION, LEDGER_PLURAL, registry=registry, id="ledger_index")
    def ledger_index(name: str, spec: kopf.Spec, status: kopf.Status, **_: Any) -> dict[str, LedgerView]:
        return {name: LedgerView.from_ledger(spec, status)}

    @kopf.on.event(GROUP, VERSION, LEDGER_PLURAL, registry=registry)
    async def ledger_event(name: str, spec: kopf.Spec, status: kopf.Status, type: str | None, memo: kopf.Memo,
                           **kwargs: Any) -> None:
        """A maxMemory ledger came into force (the webhook counted its namespace), changed its limit or
        went: who is admitted follows at once. Its charges alone change nothing here."""
        if type is None or "ctx" not in memo:
            return
        ctx: Context = memo.ctx
        seen = None if type == "DELETED" else LedgerView.from_ledger(spec, status)
        before = ctx.ledgers_seen.pop(name, None)
        if seen is not None:
            ctx.ledgers_seen[name] = seen
        which = seen or before
        if which is None or (before is not None and seen is not None and before.model_key() == seen.model_key()):
            return  # only what it holds changed
        now = current(kwargs)
        body = now.policies.get(which.policy)
        if body is not None:
            try:
                await reconcile(ctx, body, now, converge_objects=False)
            except (KubeError, kopf.TemporaryError):
                changes.mark([which.policy])  # the status timer looks again; this event will not

    @kopf.index("v1", "nodes", registry=registry, id="node_index")
    def node_index(name: str, labels: kopf.Labels, **_: Any) -> dict[str, dict[str, str]]:
        return {name: dict(labels)}

    @kopf.on.event("v1", "nodes", registry=registry)
    async def node_event(name: str, labels: kopf.Labels, type: str | None, **_: Any) -> None:
        """Kopf runs this after it updated node_index, and on the event loop: the node version
        (FleetMemo's key) moves only once the index holds what it stands for. Bumped earlier (from
        the index handler, which Kopf runs in a thread before it stores the result), a reconcile in
        between kept the old labels under the new version, for good."""
        changes.node_seen(name, None if type == "DELETED" else dict(labels))

    @kopf.index("resource.k8s.io", "v1", "resourceslices", registry=registry, id="slice_index",
                when=lambda spec, **_: own_pool(spec))
    def slice_index(spec: kopf.Spec, annotations: kopf.Annotations, **_: Any) -> dict[str, SliceView]:
        """Our slices by pool (a Store holds each of a pool's slices). What changed is noted by
        slice_event, which Kopf runs after this index is updated, for every event."""
        view = SliceView.from_slice(spec, annotations)
        return {view.pool: view}

    @kopf.index("resource.k8s.io", "v1", "resourceslices", registry=registry, id="policy_pool_index",
                when=lambda spec, **_: own_pool(spec))
    def policy_pool_index(spec: kopf.Spec, annotations: kopf.Annotations, **_: Any) -> dict[str, str]:
        """The pool of each slice, under every policy it publishes devices of or leaves out."""
        pool = pool_mark(spec)[0]
        return {policy: pool for policy in slice_policies(spec, annotations)}

    @kopf.index("resource.k8s.io", "v1", "resourceslices", registry=registry, id="other_driver_index",
                when=lambda spec, **_: spec.get("driver") != DRIVER and bool(spec.get("nodeName")))
    def other_driver_index(spec: kopf.Spec, **_: Any) -> dict[str, tuple[str, int]]:
        """Other drivers' slices that name GPUs, by node (planning.coexistence)."""
        found = other_driver_gpus(spec)
        return {str(spec["nodeName"]): (found.driver, found.gpu_devices)} if found.gpu_devices else {}

    @kopf.on.event("resource.k8s.io", "v1", "resourceslices", registry=registry,
                   when=lambda spec, **_: spec.get("driver") != DRIVER and bool(spec.get("nodeName")))
    async def other_driver_event(name: str, spec: kopf.Spec, type: str | None, **_: Any) -> None:
        """Another driver's GPUs came or went on a node: every policy's status may say so."""
        found = other_driver_gpus(spec)
        seen = (spec.get("nodeName"), found.driver, found.gpu_devices) if found.gpu_devices else None
        changes.shared_seen(f"resourceslice/{name}", None if type == "DELETED" else seen)

    @kopf.index("resource.k8s.io", "v1", "resourceclaims", registry=registry, id="claim_index")
    def claim_index(namespace: str | None, name: str, status: kopf.Status, **_: Any) -> dict[tuple[str, str], Any]:
        return {(namespace or "", name): ClaimView.from_claim(namespace or "", name, status)}

    @kopf.on.event("resource.k8s.io", "v1", "resourceclaims", registry=registry)
    async def claim_event(namespace: str | None, name: str, status: kopf.Status, type: str | None, memo: kopf.Memo,
                          **kwargs: Any) -> None:
        """Noted once claim_index holds the claim (changes.py says why); a node agent's overuse mark
        on it is acted on (controller/overuse.py)."""
        key = (namespace or "", name)
        changes.claim_seen(key, None if type == "DELETED" else ClaimView.from_claim(key[0], name, status))
        if "ctx" in memo:
            await overuse.claim_seen(memo.ctx.kube, key, None if type == "DELETED" else status,
                                     _overuse_policies(kwargs))

    @kopf.timer(*POLICY, registry=registry, interval=EVICTION_RETRY, initial_delay=EVICTION_RETRY,
                when=lambda spec, **_: spec.get("onOveruse") == "Evict")
    async def evict_overusers(name: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
        """Evictions of this policy's overusing pods that a PodDisruptionBudget refused, tried again
        when due, and those due since the policy turned to Evict."""
        if _orphaned(body, kwargs) or "ctx" not in memo:
            return
        await overuse.act(memo.ctx.kube, _overuse_policies(kwargs), only=name)

    @kopf.on.resume(*POLICY, registry=registry)
    @kopf.on.create(*POLICY, registry=registry)
    @kopf.on.update(*POLICY, registry=registry)
    async def policy_changed(body: kopf.Body, memo: kopf.Memo, retry: int, **kwargs: Any) -> None:
        changes.everything()  # policies are judged against each other
        # A retry converges only when the backoff is up: the status timer may have tried meanwhile.
        await reconcile(memo.ctx, body, current(kwargs), converge_objects=retry == 0 or memo.ctx.due(body.meta.name))

    @kopf.timer(*POLICY, registry=registry, interval=settings.status_interval,
                initial_delay=settings.status_interval)
    async def refresh_status(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
        if _orphaned(body, kwargs):
            return
        name = body["metadata"]["name"]
        judged = (body.get("status") or {}).get("observedGeneration") == body["metadata"].get("generation")
        ctx: Context = memo.ctx
        # Probed for this generation, and the apiserver refused the probe as it should; a failed probe
        # is tried again on every refresh (a dry run), not only when the converge's backoff is up.
        probed, unenforced = ctx.tenancy.get(name, (None, None))
        probed = probed == body["metadata"].get("generation") and not unenforced
        if (not changes.take(name) and judged and probed and name not in ctx.unconverged
                and name not in ctx.clock_waits):
            return  # nothing this policy's status reads has changed since its last refresh
        try:
            await reconcile(memo.ctx, body, current(kwargs), converge_objects=False)
        except kopf.TemporaryError:
            # Logged by reconcile; its delay is the converge's backoff (up to --last-retry), which
            # Kopf would sleep this timer for. The next tick looks again, and ctx.due says whether
            # to converge: a failed tenancy probe is asked again every tick.
            changes.mark([name])
        except BaseException:
            changes.mark([name])
            raise

    @kopf.timer(*POLICY, registry=registry, interval=settings.drift_interval,
                initial_delay=settings.drift_interval)
    async def repair_drift(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
        if _orphaned(body, kwargs):
            return
        with contextlib.suppress(kopf.TemporaryError):  # logged; not a delay for this timer (refresh_status)
            await reconcile(memo.ctx, body, current(kwargs))

    @kopf.daemon(*POLICY, registry=registry, initial_delay=1.0, cancellation_timeout=5.0)
    async def defragment(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, **kwargs: Any) -> None:
        """Carries the policy's recorded moves out, and in Auto mode starts them (controller.defrag_auto)."""
        while not stopped:
            if _orphaned(body, kwargs) or "defrag" not in memo:
                return
            delay = 10.0
            try:
                delay = await memo.defrag.tick(body)
            except KubeError as error:  # the API server away or busy: the record says where to go on
                log.warning("defragmentation step failed; will retry", policy=body["metadata"]["name"],
                            error=str(error))
            except Exception:  # a move must never end the daemon: the next tick reads the record again
                log.exception("defragmentation step failed unexpectedly; will retry", policy=body["metadata"]["name"])
            await stopped.wait(delay)
        memo.defrag.forget(body["metadata"]["name"])

    @kopf.on.event("v1", "namespaces", registry=registry)
    async def namespace_event(name: str, labels: kopf.Labels, uid: str | None, status: kopf.Status,
                              type: str | None, memo: kopf.Memo, **kwargs: Any) -> None:
        view = None if type == "DELETED" else NamespaceView.from_namespace(labels, uid, status)
        changes.shared_seen(f"namespace/{name}", view)
        if type is None or view is None or "ctx" not in memo:
            return
        now = current(kwargs)
        ctx: Context = memo.ctx
        if view.active and not routed_as_wanted(name, view, now.policies.values(), ctx.namespace):
            # A routing label someone else took off (or put on): put it as the policies say. An added
            # namespace a policy names is labelled by the converge below.
            with contextlib.suppress(KubeError):  # the drift converge tries again
                await sync_routes(ctx.kube, ctx.tenancy_labels, {name: view}, now.policies.values(), ctx.namespace)
        if type != "ADDED":
            return
        affected = []
        for body in now.policies.values():
            spec = body.get("spec") or {}
            named = {t.get("namespace") for t in spec.get("tenants") or []}
            named |= set((spec.get("adminAccess") or {}).get("namespaces") or [])
            if name in named:
                affected.append(body)
        await _reconcile_each(memo.ctx, affected, now)

    @kopf.on.event("resource.k8s.io", "v1", "resourceslices", registry=registry,
                   when=lambda spec, **_: own_pool(spec))
    async def slice_event(spec: kopf.Spec, annotations: kopf.Annotations, type: str | None, memo: kopf.Memo,
                          **kwargs: Any) -> None:
        """Devices came or went: their policies' status follows at once. Nothing a policy makes
        depends on its devices (taints travel on them), so its objects are not converged again: at
        1,000 nodes that was a third of the requests until the fleet was published."""
        view = SliceView.from_slice(spec, annotations)
        told = changes.slice_seen(view)  # a deleted slice's devices count too
        if type is None or "ctx" not in memo:
            return  # the initial listing: resume handlers cover it
        now = current(kwargs)
        names = sorted(told)
        await _reconcile_each(memo.ctx, [now.policies[n] for n in names if n in now.policies], now,
                              converge_objects=False)

    @kopf.on.event("v1", "resourcequotas", registry=registry, labels={LABEL_POLICY: kopf.PRESENT})
    async def quota_event(namespace: str | None, name: str, labels: kopf.Labels, meta: kopf.Meta,
                          status: kopf.Status, type: str | None, memo: kopf.Memo, **kwargs: Any) -> None:
        """A tenant's quota came, went or changed what it enforces: who is admitted follows at once
        (a limited tenant is admitted only for what its quota's status.hard counts)."""
        if type is None or "ctx" not in memo:
            return
        ctx: Context = memo.ctx
        key = (namespace or "", name)
        seen = None if type == "DELETED" else QuotaView.from_quota(labels[LABEL_POLICY], meta, status)
        before = ctx.quotas_seen.pop(key, False)  # False: never seen (None would be a deleted one)
        if seen is not None:
            ctx.quotas_seen[key] = seen
        if before == seen:
            return  # only its usage changed
        now = current(kwargs)
        body = now.policies.get(labels[LABEL_POLICY])
        if body is not None:
            try:
                await reconcile(ctx, body, now, converge_objects=False)
            except (KubeError, kopf.TemporaryError):
                changes.mark([labels[LABEL_POLICY]])  # the status timer looks again; this event will not

    @kopf.on.event(*POLICY, registry=registry)
    async def policy_event(type: str | None, memo: kopf.Memo, **kwargs: Any) -> None:
        """The last policy gone: if its CRD is being deleted, Kopf must stop before the CRD goes."""
        if type == "DELETED" and crd_leaving is not None and not kwargs["policy_index"] and "ctx" in memo:
            with contextlib.suppress(KubeError):  # the periodic check asks again
                if await crd_is_leaving(memo.ctx.kube):
                    crd_leaving.set()

    @kopf.on.delete(*POLICY, registry=registry)
    async def policy_deleted(name: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
        ctx: Context = memo.ctx
        # Under the policy's lock: a reconcile already running on the old body must not put the
        # admin-access label back after it is removed here.
        async with ctx.lock(name):
            now = current(kwargs)
            waiting = await report_deleting(ctx, body, now)
            if waiting:
                raise kopf.TemporaryError(waiting, delay=5)
            mine = ctx.label_records.get(name, frozenset((body.get("status") or {}).get("adminAccessLabels") or []))
            plan = plan_labels(set(), now.namespaces, mine, now.label_records(ctx.label_records, but=name))

            async def record(_: list[str]) -> None:
                return None  # the record goes with the policy

            await sync_admin_labels(ctx.kube, name, plan, mine, record)
            # The namespaces only this policy named lose their tenancy label before it goes: with
            # the CRD deleted next, none is left routed to a rule whose parameter is gone.
            others = (b for n, b in now.policies.items() if n != name)
            await sync_routes(ctx.kube, ctx.tenancy_labels, now.namespaces, others, ctx.namespace)
        ctx.forget(name, str(body["metadata"].get("uid") or ""))
        changes.forget(name)
        changes.everything()  # a conflict it caused may be gone
        # Owner references take everything else away with the policy.

    return registry
