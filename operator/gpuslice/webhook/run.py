"""Run the maxMemory webhook: HTTPS for the API server, its caches, and the recalculation loop.

Any number of copies may run (the install runs two): they share nothing but the ledgers, whose
writes are optimistic-concurrency updates, so two copies judging at once are as safe as one. It
needs no leader; while none answers, the API server refuses the allocations it would judge
(failurePolicy Fail) and the scheduler tries them again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import os
import signal
import ssl
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from gpuslice.coordinates import secret_path
from gpuslice.dra.names import CONTROLLER_NAMESPACE, MEMORY_WEBHOOK_PATH
from gpuslice.errors import GpusliceError
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.observability.logging import configure_logging
from gpuslice.observability.metrics import announce, serve_metrics
from gpuslice.webhook.callers import Callers, ClientCaError, verified_chain
from gpuslice.webhook.ledger import Ledgers
from gpuslice.webhook.metrics import CALLERS_REFUSED, LEDGER_METRICS, RECKON_FAILURES, REVIEW_SECONDS, REVIEWS
from gpuslice.webhook.review import Answer, Reviewer
from gpuslice.webhook.settings import WebhookSettings
from gpuslice.webhook.state import State

log = structlog.get_logger(__name__)


class Tls:
    """The serving certificate, read from its Secret and reloaded when it changes (new connections
    get the new one; the listener stays), and the client CAs callers are asked for (``callers``)."""

    def __init__(self, kube: KubeClient, secret: str, callers: Callers, home: str = CONTROLLER_NAMESPACE) -> None:
        self.kube, self.secret, self.callers, self.home = kube, secret, callers, home
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        callers.configure(self.context)
        self._dir = Path(tempfile.mkdtemp(prefix="gpuslice-webhook-"))
        self._seen = b""

    async def refresh(self) -> bool:
        """Load the Secret if it changed (and the client CAs); whether a certificate is loaded."""
        self.callers.reload(self.context)
        try:
            body = await self.kube.get(secret_path(self.home, self.secret))
        except KubeError as error:
            if not self._seen:
                log.warning("no serving certificate yet; waiting for it", secret=self.secret, error=error.message)
            return bool(self._seen)
        data = body.get("data") or {}
        cert, key = (base64.b64decode(data.get(k) or "") for k in ("tls.crt", "tls.key"))
        if not cert or not key or cert + key == self._seen:
            return bool(self._seen)
        cert_file, key_file = self._dir / "tls.crt", self._dir / "tls.key"
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(key)
        cert_file.write_bytes(cert)
        self.context.load_cert_chain(cert_file, key_file)
        self._seen = cert + key
        log.info("serving certificate loaded", secret=self.secret)
        return True

    async def keep(self, stop: asyncio.Event, interval: float) -> None:
        while not stop.is_set():
            await self.refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)


def _response(uid: str, answer: Answer) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": answer.allowed}
    if not answer.allowed:
        response["status"] = {"code": answer.code, "reason": "Forbidden", "message": answer.message}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _peer_chain(request: web.Request) -> list[bytes]:
    """The caller's certificate chain, DER, as the TLS handshake verified it; empty when it gave none."""
    return verified_chain(request.transport.get_extra_info("ssl_object") if request.transport is not None else None)


def application(reviewer: Reviewer, callers: Callers) -> web.Application:
    async def validate(request: web.Request) -> web.Response:
        started = time.monotonic()
        if (why := callers.refusal(_peer_chain(request))) is not None:
            CALLERS_REFUSED.inc()
            callers.tell(str(request.remote), why)
            return web.json_response({"message": f"refused: {why}; only the API server may call this webhook"},
                                     status=403)
        review = await request.json()
        body = review.get("request") or {}
        operation = "allocate" if body.get("operation") == "UPDATE" else "create"
        try:
            answer = await reviewer.review(body)
        except (KubeError, TimeoutError) as error:
            # The ledger could not be read or written: refuse (the scheduler tries again) rather than admit.
            answer = Answer(False, f"the maxMemory webhook could not charge this allocation now ({error}); the"
                                   " scheduler tries again", 500)
        verdict = "allowed" if answer.allowed else "refused"
        REVIEWS.labels(operation, verdict).inc()
        REVIEW_SECONDS.labels(operation, verdict).observe(time.monotonic() - started)
        if not answer.allowed:
            log.info("refused", namespace=body.get("namespace"), name=(body.get("object") or {}).get(
                "metadata", {}).get("name"), operation=operation, message=answer.message)
        return web.json_response(_response(str(body.get("uid", "")), answer))

    app = web.Application()
    app.router.add_post(MEMORY_WEBHOOK_PATH, validate)
    return app


async def _reckon_loop(ledgers: Ledgers, state: State, stop: asyncio.Event, settings: WebhookSettings) -> None:
    """Recalculate a namespace's ledgers when its claims or ledgers change, and every ledger every
    ``resync`` seconds; a pass that fails is tried again on the next. Nothing ends the loop but
    ``stop``: it is what releases the charges of allocation writes that never happened, and without
    it a tenant whose writes failed (the webhook killed mid-request) would wait below its limit for
    good."""
    grace = datetime.timedelta(seconds=settings.charge_grace)
    last_full: float | None = None  # the first pass is full, however long ago the machine booted
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.changed.wait(), timeout=min(settings.resync, settings.charge_grace / 2))
        await asyncio.sleep(0.1)  # a burst of events is one pass
        state.changed.clear()
        full = last_full is None or time.monotonic() - last_full >= settings.resync
        dirty, state.dirty = state.dirty, set()
        if full:
            last_full = time.monotonic()
        for name, ledger in list(state.ledgers.items.items()):
            if not (full or ledger.spec.namespace in dirty or not ledger.in_force):
                continue
            try:
                await ledgers.reckon_ledger(name, grace)
            except Exception as error:  # the loop never dies: a ledger not recounted holds its charges
                if isinstance(error, KubeError):
                    log.warning("ledger could not be recounted; trying again", ledger=name, error=str(error))
                else:
                    log.exception("ledger could not be recounted (unexpectedly); trying again", ledger=name)
                    RECKON_FAILURES.inc()
                state.changed.set()
                await asyncio.sleep(1.0)


class TaskEnded(GpusliceError):
    """A task the webhook needs ended before it was stopped; the process exits (non-zero) for its
    Deployment to start it again."""


async def _until_stop_or_task_ends(stop: asyncio.Event, tasks: list[asyncio.Task[None]]) -> None:
    """Wait for ``stop``; a task of the process that ends before it (it never should) ends the
    process, with its error logged, so that its Deployment starts a whole one again instead of
    one that answers while its caches or its recounts have stopped."""
    stopping = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if stop.is_set():
        return  # stopping: the tasks that watch ``stop`` may end in the same turn, and that is no failure
    for task in done:
        if task is not stopping:
            error = "cancelled" if task.cancelled() else repr(task.exception())
            log.error("a task of the webhook ended; stopping so that the webhook is started again",
                      task=task.get_name(), error=error)
            raise TaskEnded(f"the webhook's {task.get_name()} task ended ({error})")


async def run_webhook(settings: WebhookSettings) -> None:
    configure_logging(settings.log_level, settings.log_format)
    announce("webhook")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    kube = await KubeClient.from_kubeconfig(settings.kubeconfig, request_timeout=settings.request_timeout)
    state = State(kube, home=settings.home)
    LEDGER_METRICS.ledgers = lambda: list(state.ledgers.items.values())
    ledgers = Ledgers(state)
    try:
        tls = Tls(kube, settings.tls_secret, Callers(settings.client_ca_file, frozenset(settings.client_allowed_names)),
                  settings.home)
    except ClientCaError:
        await kube.close()
        raise

    def ready() -> tuple[bool, str]:
        if not tls._seen:
            return False, f"no serving certificate yet (Secret {settings.home}/{settings.tls_secret})"
        return (True, "ok") if state.synced else (False, "caches not synced yet")

    metrics = await serve_metrics(settings.metrics_port, ready=ready) if settings.metrics_port else None
    tasks = [asyncio.create_task(state.run(stop), name="caches"),
             asyncio.create_task(tls.keep(stop, settings.tls_interval), name="certificates")]
    runner: web.AppRunner | None = None
    try:
        while not await tls.refresh():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 2.0)
            if stop.is_set():
                return
        for mirror in (state.policies, state.ledgers, state.slices, state.claims):
            await mirror.synced.wait()
        runner = web.AppRunner(application(Reviewer(ledgers), tls.callers), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, settings.address, settings.port, ssl_context=tls.context).start()
        log.info("webhook started", address=settings.address, port=settings.port, path=MEMORY_WEBHOOK_PATH)
        tasks.append(asyncio.create_task(_reckon_loop(ledgers, state, stop, settings), name="recounts"))
        await _until_stop_or_task_ends(stop, tasks)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if runner is not None:
            await runner.cleanup()
        if metrics is not None:
            await metrics.cleanup()
        await kube.close()
