"""Run the controller: Kopf, a metrics endpoint, and structured logs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import kopf
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpuslice.controller.handlers import build_registry
from gpuslice.observability.logging import configure_logging


async def _serve_metrics(port: int) -> web.AppRunner:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner


async def run_controller(kubeconfig: str | None, metrics_port: int | None, liveness_port: int | None) -> None:
    configure_logging()
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # what kopf.login_with_kubeconfig reads
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runner = await _serve_metrics(metrics_port) if metrics_port else None
    try:
        await kopf.operator(
            registry=build_registry(kubeconfig),
            clusterwide=True,
            standalone=True,
            stop_flag=stop,
            liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
        )
    finally:
        if runner is not None:
            with contextlib.suppress(Exception):
                await runner.cleanup()
