"""The controller's handlers of its own objects: Kopf's start, stop and login, and every
GpuSlicePolicy's create, update, resume, timers, daemon and deletion.

What they share is Kopf's ``memo`` (controller.runtime); what they read of the cluster, Kopf's
indexes (controller.indexes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import kopf
import structlog

from gpuslice.api.policy import GROUP
from gpuslice.controller.admin_access import plan_labels, sync_admin_labels
from gpuslice.controller.agent_views import FINALIZER, sync_view_quietly
from gpuslice.controller.crd import crd_leaving as crd_is_leaving
from gpuslice.controller.defrag.auto import Defragmenter
from gpuslice.controller.indexes import (
    PENDING_PODS,
    PODS,
    POLICY,
    node_facts,
    overuse_policies,
    pending_pods,
    views,
)
from gpuslice.controller.overuse import EVICTION_RETRY
from gpuslice.controller.reconcile import reconcile
from gpuslice.controller.retry import SchedulerRetry
from gpuslice.controller.runtime import Runtime
from gpuslice.controller.settings import ControllerSettings
from gpuslice.controller.startup import start_context
from gpuslice.controller.status_write import report_deleting
from gpuslice.controller.tenancy_labels import sync_routes
from gpuslice.dra.names import LABEL_POLICY
from gpuslice.kube.client import EndlessBackoff, KubeError

log = structlog.get_logger(__name__)
# Kopf keeps a handler's progress (retries, delays) in an annotation named by its id. These two
# keep the ids they had as closures, so that an upgrade in the middle of a retry finds its progress.
CHANGED_ID, DELETED_ID = "build_registry.<locals>.policy_changed", "build_registry.<locals>.policy_deleted"


async def startup(settings: kopf.OperatorSettings, memo: Runtime, **_: Any) -> None:
    ours = memo.settings
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.scanning.disabled = True  # no CRD/namespace scanning: no RBAC for it needed
    settings.posting.level = 30  # warnings and errors only; our own Events say the rest
    settings.watching.server_timeout = 600
    # A stream is given up after this long without an event or a bookmark (Kopf's default, 70 s,
    # reopened most of the controller's watches every minute or so: the API server's bookmarks come
    # about every minute, not always within 70 s); the API server ends each stream by 600 s.
    settings.watching.inactivity_timeout = settings.watching.server_timeout + 60
    # Lists (at start, and after a watch's 410 Gone) in pages of 500, as client-go's reflector:
    # a thousand nodes' slices are one ~60 MB answer otherwise, parsed at once.
    settings.watching.chunk_size = 500
    settings.watching.field_selectors[PODS] = PENDING_PODS  # pods not yet on a node only (indexes.py)
    # Only gpuslice's quotas and templates, selected by the API server (the cluster's others never sent).
    for resource in (("v1", "resourcequotas"), ("resource.k8s.io", "resourceclaimtemplates")):
        settings.watching.label_selectors[resource] = LABEL_POLICY
    settings.networking.request_timeout = ours.request_timeout
    settings.networking.error_backoffs = EndlessBackoff()  # back within 5 s of the API server
    settings.execution.default_backoff = 5
    # Kopf handles SIGTERM itself; without a stop flag it waits up to this long for a graceful
    # exit. A request to an apiserver going down with us must not keep us alive for minutes.
    settings.process.ultimate_exiting_timeout = ours.shutdown_grace
    # Set on the memo Kopf copies for each object it then watches: every handler sees them.
    memo.ctx = await start_context(await memo.client(), ours)
    memo.ctx.canary_every = ours.drift_interval  # one tenancy probe per drift interval in all (state.py)
    memo.defrag = Defragmenter(memo.ctx.kube, ours, version=lambda: memo.changes.devices_version,
                               home=memo.ctx.namespace)
    memo.retry = SchedulerRetry(memo.ctx.kube, ours.scheduler_retry_interval, lambda: memo.changes.devices_version)


async def cleanup(memo: Runtime, **_: Any) -> None:
    if memo.ctx is not None:
        await memo.ctx.kube.close()


async def login(memo: Runtime, **_: Any) -> kopf.AiohttpSession:
    """The same identity as gpuslice's own client (controller/login.py says why not Kopf's login)."""
    return await memo.logins.session()


def _orphaned(body: kopf.Body, kwargs: dict[str, Any]) -> bool:
    """A timer of a policy that is gone. Kopf stops a policy's timers when it sees the deletion
    begin, which its finalizer makes sure of; a policy deleted before Kopf put the finalizer on it
    (created and deleted at once) vanishes unseen, and its timers would go on converging its
    objects again from the last body, for good. Such a timer does nothing."""
    name, uid = body["metadata"]["name"], body["metadata"].get("uid")
    return not any((seen.get("metadata") or {}).get("uid") == uid for seen in kwargs["policy_index"].get(name, ()))


async def evict_overusers(name: str, body: kopf.Body, memo: Runtime, **kwargs: Any) -> None:
    """Evictions of this policy's overusing pods that a PodDisruptionBudget refused, tried again
    when due, and those due since the policy turned to Evict."""
    if _orphaned(body, kwargs) or memo.ctx is None:
        return
    await memo.overuse.act(memo.ctx.kube, overuse_policies(kwargs), only=name)


async def policy_changed(body: kopf.Body, memo: Runtime, retry: int, **kwargs: Any) -> None:
    ctx = memo.context()
    memo.changes.everything()  # policies are judged against each other
    # A retry converges only when the backoff is up: the status timer may have tried meanwhile.
    await reconcile(ctx, body, memo.world(kwargs), converge_objects=retry == 0 or ctx.due(body.meta.name))


async def refresh_status(body: kopf.Body, memo: Runtime, **kwargs: Any) -> None:
    if _orphaned(body, kwargs):
        return
    name = body["metadata"]["name"]
    # A view write that failed at the policy's event is tried again here (in memory when it stands).
    home = memo.context().namespace
    await sync_view_quietly(memo.context().kube, body, False, memo.context().views, views(kwargs, home),
                            memo.context().clock(), home)
    judged = (body.get("status") or {}).get("observedGeneration") == body["metadata"].get("generation")
    ctx, changes = memo.context(), memo.changes
    # Probed for this generation, and the apiserver refused the probe as it should; a failed probe
    # is tried again on every refresh (a dry run), not only when the converge's backoff is up.
    state = ctx.policy(name)
    probed, unenforced = state.tenancy or (None, None)
    probed = probed == body["metadata"].get("generation") and not unenforced and not ctx.stale_probe(name)
    if not changes.take(name) and judged and probed and not state.unconverged and not state.clock_wait:
        return  # nothing this policy's status reads has changed since its last refresh
    try:
        await reconcile(ctx, body, memo.world(kwargs), converge_objects=False)
    except kopf.TemporaryError:
        # Logged by reconcile; its delay is the converge's backoff (up to --last-retry), which
        # Kopf would sleep this timer for. The next tick looks again, and ctx.due says whether
        # to converge: a failed tenancy probe is asked again every tick.
        changes.mark([name])
    except BaseException:
        changes.mark([name])
        raise


async def repair_drift(body: kopf.Body, memo: Runtime, **kwargs: Any) -> None:
    if _orphaned(body, kwargs):
        return
    with contextlib.suppress(kopf.TemporaryError):  # logged; not a delay for this timer (refresh_status)
        await reconcile(memo.context(), body, memo.world(kwargs))


async def defragment(body: kopf.Body, memo: Runtime, stopped: kopf.DaemonStopped, **kwargs: Any) -> None:
    """Carries the policy's recorded moves out, and in Auto mode starts them (controller.defrag.auto)."""
    while not stopped:
        if _orphaned(body, kwargs) or memo.defrag is None:
            return
        delay = 10.0
        try:
            delay = await memo.defrag.tick(body, pending_pods(kwargs))
        except KubeError as error:  # the API server away or busy: the record says where to go on
            log.warning("defragmentation step failed; will retry", policy=body["metadata"]["name"],
                        error=str(error))
        except Exception:  # a move must never end the daemon: the next tick reads the record again
            log.exception("defragmentation step failed unexpectedly; will retry", policy=body["metadata"]["name"])
        await _retry(memo, kwargs)
        await stopped.wait(delay)
    if memo.defrag is not None:
        memo.defrag.forget(body["metadata"]["name"])


async def _retry(memo: Runtime, kwargs: dict[str, Any]) -> None:
    """Pods the scheduler turned away whose devices are free (controller.retry): looked for from
    every policy's daemon, at most once per interval in all, only while this copy leads, in what
    the watches hold."""
    if memo.retry is None:
        return
    try:
        policies = [b for store in kwargs["policy_index"].values() for b in store]
        await memo.retry.tick(policies, pending_pods(kwargs), node_facts(kwargs))
    except KubeError as error:
        log.warning("could not look for pods the scheduler turned away; will look again", error=str(error))
    except Exception:  # never ends the daemon
        log.exception("looking for pods the scheduler turned away failed unexpectedly; will look again")


async def policy_event(type: str | None, body: kopf.Body, memo: Runtime, **kwargs: Any) -> None:
    """The policy's agent view follows it (controller.agent_views). The last policy gone: if its CRD
    is being deleted, Kopf must stop before the CRD goes."""
    if memo.ctx is not None:
        await sync_view_quietly(memo.ctx.kube, body, type == "DELETED", memo.ctx.views,
                                views(kwargs, memo.ctx.namespace), memo.ctx.clock(), memo.ctx.namespace)
    if type == "DELETED" and memo.crd_leaving is not None and not kwargs["policy_index"] and memo.ctx is not None:
        with contextlib.suppress(KubeError):  # the periodic check asks again
            if await crd_is_leaving(memo.ctx.kube):
                memo.crd_leaving.set()


async def policy_deleted(name: str, body: kopf.Body, memo: Runtime, **kwargs: Any) -> None:
    ctx = memo.context()
    # Under the policy's lock: a reconcile already running on the old body must not put the
    # admin-access label back after it is removed here.
    async with ctx.lock(name):
        now = memo.world(kwargs)
        waiting = await report_deleting(ctx, body, now)
        if waiting:
            raise kopf.TemporaryError(waiting, delay=5)
        mine = ctx.policy(name).label_record
        if mine is None:
            mine = frozenset((body.get("status") or {}).get("adminAccessLabels") or [])
        plan = plan_labels(set(), now.namespaces, mine, now.label_records(ctx.label_records(), but=name))

        async def record(_: list[str]) -> None:
            return None  # the record goes with the policy

        await sync_admin_labels(ctx.kube, name, plan, mine, record)
        # The namespaces only this policy named lose their tenancy label before it goes: with
        # the CRD deleted next, none is left routed to a rule whose parameter is gone.
        def others() -> list[Mapping[str, Any]]:
            return [b for n, b in now.policies_now().items() if n != name]

        await sync_routes(ctx.kube, ctx.tenancy_labels, now.namespaces, others, ctx.namespace, ctx.routes_written)
    ctx.forget(name, str(body["metadata"].get("uid") or ""))
    memo.changes.forget(name)
    memo.changes.everything()  # a conflict it caused may be gone
    # Owner references take everything else away with the policy.


def register_policy_handlers(registry: kopf.OperatorRegistry, settings: ControllerSettings) -> None:
    """``settings``: the timers' intervals."""
    kopf.on.startup(registry=registry)(startup)
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.on.login(registry=registry)(login)
    kopf.timer(*POLICY, registry=registry, interval=EVICTION_RETRY, initial_delay=EVICTION_RETRY,
               when=lambda spec, **_: spec.get("onOveruse") == "Evict")(evict_overusers)
    for on in (kopf.on.resume, kopf.on.create, kopf.on.update):
        on(*POLICY, registry=registry, id=CHANGED_ID)(policy_changed)
    kopf.timer(*POLICY, registry=registry, interval=settings.status_interval,
               initial_delay=settings.status_interval)(refresh_status)
    kopf.timer(*POLICY, registry=registry, interval=settings.drift_interval,
               initial_delay=settings.drift_interval)(repair_drift)
    kopf.daemon(*POLICY, registry=registry, initial_delay=1.0, cancellation_timeout=5.0)(defragment)
    kopf.on.event(*POLICY, registry=registry)(policy_event)
    kopf.on.delete(*POLICY, registry=registry, id=DELETED_ID)(policy_deleted)
