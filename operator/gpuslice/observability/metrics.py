"""The metrics endpoint (Prometheus text format) and health checks, served from the process's own loop.

``/metrics`` for Prometheus; ``/healthz`` says the process is alive (its loop answers and, for
the agent, its publish loop runs); ``/readyz`` says it does its job (for the agent: it published
successfully recently). A check that fails answers 503 with the reason, which is what a kubelet
probe logs and what a person reads.
"""

from __future__ import annotations

import platform
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, generate_latest

from gpuslice import __version__
from gpuslice.kube.metrics import set_component

BUILD_INFO = Gauge("gpuslice_build_info", "Always 1: the version of the process serving these metrics.",
                   ["component", "version", "python_version"])
# One series for both processes: a node's agent counts the pods it marked (reported), the controller
# what it did about them (evicted, eviction_blocked); ``node`` is the pod's node either way.
OVERUSE_ACTIONS = Counter("gpuslice_overuse_actions_total", "Pods found using more GPU memory than they were"
                          " allocated (beyond the tolerance, for the grace), by what was done: reported (the node"
                          " agent marked an overused claim: one count per claim, however many pods share it),"
                          " evicted, eviction_blocked (a PodDisruptionBudget refused"
                          " the controller's eviction).", ["node", "policy", "namespace", "action"])
# A check answers (healthy, what to say about it).
Check = Callable[[], tuple[bool, str]]


def announce(component: str) -> None:
    """Name the process (``controller`` or ``agent``) in its metrics, and say which version it is."""
    BUILD_INFO.labels(component, __version__, platform.python_version()).set(1)
    set_component(component)


def _answer(check: Check | None) -> web.Response:
    ok, words = check() if check is not None else (True, "ok")
    return web.Response(status=200 if ok else 503, text=words + "\n")


async def serve_metrics(port: int, host: str = "0.0.0.0", *, alive: Check | None = None,
                        ready: Check | None = None) -> web.AppRunner:
    """Start serving ``/metrics``, ``/healthz`` and ``/readyz``; call ``cleanup()`` on the result to stop."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return _answer(alive)

    async def readyz(_: web.Request) -> web.Response:
        return _answer(ready)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)  # no line per scrape or probe (a probe every 5 s per pod)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
