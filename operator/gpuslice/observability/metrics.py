"""The /metrics endpoint (Prometheus text format) served from the component's own loop."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


async def serve_metrics(port: int, host: str = "0.0.0.0") -> web.AppRunner:
    """Start serving; call ``cleanup()`` on the result to stop."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
