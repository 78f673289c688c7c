"""Run the controller: Kopf, a metrics endpoint, and structured logs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import kopf

from gpuslice.controller.handlers import build_registry
from gpuslice.observability.logging import configure_logging
from gpuslice.observability.metrics import serve_metrics


async def run_controller(kubeconfig: str | None, metrics_port: int | None, liveness_port: int | None) -> None:
    configure_logging()
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # what kopf.login_with_kubeconfig reads
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runner = await serve_metrics(metrics_port) if metrics_port else None
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
