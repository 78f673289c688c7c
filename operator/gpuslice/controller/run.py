"""Run the controller: check the server, take the leader Lease, then Kopf; metrics and logs around it."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import signal
from collections.abc import Awaitable, Callable

import kopf
import structlog

from gpuslice.controller.admin_access import NamespaceView
from gpuslice.controller.crd import CRD_NAME, FIX, CrdState, crd_state, until_crd_leaves, wait_for_crd
from gpuslice.controller.handlers import build_registry
from gpuslice.controller.leader import GuardedClient, LeaderElector, WriteGuard, identity
from gpuslice.controller.login import KopfLogin
from gpuslice.controller.metrics import LEADER
from gpuslice.controller.runtime import Runtime
from gpuslice.controller.settings import ControllerSettings
from gpuslice.controller.startup import check_label_guard, own_namespace, whoami
from gpuslice.controller.tenancy_labels import MEMORY_ROUTE, sync_tenancy_labels
from gpuslice.controller.webhook_tls import TlsSettings, keep_webhook_tls, service_hosts, watch_webhook_config
from gpuslice.coordinates import NAMESPACES
from gpuslice.errors import GpusliceError
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.kube.compatibility import check_server
from gpuslice.kube.transport import connect
from gpuslice.observability.logging import configure_logging
from gpuslice.observability.metrics import announce, serve_metrics

log = structlog.get_logger(__name__)


class ControllerStopped(GpusliceError):
    """The controller cannot (or may no longer) act; the message says why. Exit status 1."""


class StartupChecks:
    """/readyz of the controller: ready once its start-up checks of the API server passed, the
    leader and a copy waiting for the Lease alike (a rollout must not wait for a Lease, and a
    PodDisruptionBudget counts ready copies); before that it says what it waits for."""

    passed = False

    def ready(self) -> tuple[bool, str]:
        return (True, "ok") if self.passed else (False, "checking what the API server serves and allows")


async def _wait_any(*events: asyncio.Event) -> None:
    waits = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def run_controller(settings: ControllerSettings) -> None:
    configure_logging(settings.log_level, settings.log_format)
    announce("controller")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    checked = StartupChecks()
    runner = await serve_metrics(settings.metrics_port, ready=checked.ready) if settings.metrics_port else None
    kube = await KubeClient.from_kubeconfig(settings.kubeconfig, request_timeout=settings.request_timeout)
    elector: LeaderElector | None = None
    try:
        try:
            verdict = await check_server(kube)
            username = await whoami(kube)
            namespace = own_namespace(username, settings.namespace)
            # Before the Lease: a copy that could never act says so at once rather than wait to lead.
            await check_label_guard(kube, username)
        except KubeError as error:
            raise ControllerStopped(f"the API server could not be asked what it serves: {error}") from None
        except kopf.PermanentError as error:
            raise ControllerStopped(str(error)) from None
        for warning in verdict.warnings:
            log.warning("server check", warning=warning)
        if not verdict.ok:
            raise ControllerStopped("; ".join(verdict.problems))
        checked.passed = True
        if settings.leader_election:
            elector = LeaderElector(kube, identity(), namespace=namespace, lease_duration=settings.lease_duration,
                                    renew_deadline=settings.renew_deadline, retry_period=settings.retry_period)
            if not await elector.acquire(stop):
                return  # stopped while waiting for the Lease
            LEADER.set(1)
        await _operate(settings, elector, stop, namespace)
        if elector is not None and elector.lost.is_set():
            raise ControllerStopped("lost the leader Lease; exiting so that this copy waits for it again")
    finally:
        LEADER.set(0)
        if elector is not None and not elector.lost.is_set():
            await elector.release()
        await kube.close()
        if runner is not None:
            with contextlib.suppress(Exception):
                await runner.cleanup()


async def _operate(settings: ControllerSettings, elector: LeaderElector | None, stop: asyncio.Event,
                   namespace: str) -> None:
    """Kopf while the GpuSlicePolicy CRD is served, waiting for it while it is not (controller.crd),
    until ``stop`` or until the Lease is lost (then at once: no write after it)."""
    halt = asyncio.Event()
    keeper = asyncio.create_task(elector.keep(stop)) if elector is not None else None
    # On every session to the API server from here on, Kopf's included (Runtime.logins).
    guards = [WriteGuard(elector)] if elector is not None else []

    async def client() -> KubeClient:
        transport = await connect(settings.kubeconfig, middlewares=guards)
        if elector is None:
            return KubeClient(transport, timeout=settings.request_timeout)
        return GuardedClient(transport, elector, timeout=settings.request_timeout)

    async def halter() -> None:
        await _wait_any(stop, *([elector.lost] if elector is not None else []))
        halt.set()

    watcher = asyncio.create_task(halter())
    kube = await client()
    lock = asyncio.Lock()
    tls = None
    config_watch = None
    if settings.webhook_certs == "managed":
        changed = asyncio.Event()
        config_watch = asyncio.create_task(watch_webhook_config(kube, halt, changed))
        tls = asyncio.create_task(keep_webhook_tls(kube, TlsSettings(
            service_hosts(settings.webhook_hosts, namespace), datetime.timedelta(hours=settings.webhook_cert_hours),
            datetime.timedelta(hours=settings.webhook_ca_hours), namespace), halt, settings.webhook_cert_interval,
            changed))
    try:
        while await wait_for_crd(kube, halt, lambda: _unlabel_all(kube, lock, namespace)):
            if not await _run_kopf(settings, client, KopfLogin(settings.kubeconfig, middlewares=guards), kube, halt):
                break
    finally:
        watcher.cancel()
        for task in (tls, config_watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await kube.close()
        if keeper is not None:
            stop_keeping = not keeper.done()
            if stop_keeping:
                keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper


async def _unlabel_all(kube: KubeClient, lock: asyncio.Lock, own: str) -> None:
    """With no CRD no policy names a namespace: every tenancy label but the controller's own goes."""
    namespaces = {ns["metadata"]["name"]: NamespaceView.from_namespace(
        (ns["metadata"].get("labels") or {}), ns["metadata"].get("uid"), ns.get("status") or {})
        for ns in await kube.list(NAMESPACES)}
    await sync_tenancy_labels(kube, lock, namespaces, {own})
    await sync_tenancy_labels(kube, lock, namespaces, {own}, MEMORY_ROUTE)


async def _run_kopf(settings: ControllerSettings, client: Callable[[], Awaitable[KubeClient]], logins: KopfLogin,
                    kube: KubeClient, halt: asyncio.Event) -> bool:
    """Kopf until ``halt``, or until the CRD leaves (controller.crd): then True (wait for it again).
    ``logins`` are this run's alone: the sessions the last run closed when it stopped must not be
    handed to the next (controller.login)."""
    operator_stop, leaving = asyncio.Event(), asyncio.Event()

    async def stopper() -> None:
        await _wait_any(halt, leaving)
        operator_stop.set()

    tasks = [asyncio.create_task(stopper()),
             asyncio.create_task(until_crd_leaves(kube, leaving, settings.crd_interval))]
    try:
        await kopf.operator(
            registry=build_registry(settings),
            memo=Runtime(settings, client, logins, leaving),
            clusterwide=True,
            standalone=True,
            stop_flag=operator_stop,
            liveness_endpoint=f"http://0.0.0.0:{settings.liveness_port}/healthz" if settings.liveness_port else None,
        )
    except Exception:
        with contextlib.suppress(KubeError):
            if not halt.is_set() and await crd_state(kube) is not CrdState.SERVED:
                log.warning("Kopf stopped: the GpuSlicePolicy CRD is no longer served; waiting for it",
                            crd=CRD_NAME, fix=FIX)
                return True
        raise
    finally:
        for task in tasks:
            task.cancel()
    return leaving.is_set() and not halt.is_set()
