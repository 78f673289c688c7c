"""An API server that drops every connection (as one restarting does) fails requests, never a
whole event: each policy an event touches is still reconciled, and an Event that cannot be
posted is a log line. The client is the real one, against a real HTTP server on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gpuslice.controller.events import post_event
from gpuslice.controller.state import Context
from gpuslice.controller.watch_handlers import reconcile_each
from gpuslice.controller.world import World
from gpuslice.kube.client import KubeClient, RetryPolicy
from gpuslice.kube.credentials import Credentials
from gpuslice.kube.transport import AiohttpTransport
from tests.builders import policy


@pytest.fixture
async def dropping() -> AsyncIterator[tuple[KubeClient, list[str]]]:
    hits: list[str] = []

    async def drop(request: web.Request) -> web.StreamResponse:
        hits.append(f"{request.method} {request.path}")
        assert request.transport is not None
        request.transport.close()
        return web.Response()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", drop)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    api = AiohttpTransport(Credentials(server=f"http://127.0.0.1:{runner.addresses[0][1]}"))
    async with KubeClient(api, timeout=5, retry=RetryPolicy(attempts=2, first_delay=0.01)) as kube:
        yield kube, hits
    await runner.cleanup()


async def test_every_policy_an_event_touches_is_tried_when_the_server_drops_connections(
        dropping: tuple[KubeClient, list[str]]) -> None:
    kube, hits = dropping
    ctx = Context(kube=kube, username="system:serviceaccount:gpuslice-system:gpuslice-controller")
    bodies = [policy(n, {"mode": "memory", "sliceSize": "10Gi"}, generation=1, uid=f"u-{n}", tenants=["a"])
              for n in ("first", "second")]
    world = World(policies={b["metadata"]["name"]: b for b in bodies}, namespaces={}, nodes={},  # type: ignore[index]
                  slices=[], claims=[])
    await reconcile_each(ctx, bodies, world)
    # The first gets as far as its tenancy probe, which fails too; never judged, it then tries to
    # say that it is unverified (which fails as well). The second is reconciled after the first failed.
    probe = "POST /apis/resource.k8s.io/v1/namespaces/gpuslice-system/resourceclaims"
    first = "PATCH /apis/gpuslice.dev/v1alpha1/gpuslicepolicies/first/status"
    second = "PATCH /apis/gpuslice.dev/v1alpha1/gpuslicepolicies/second/status"
    assert probe in hits
    assert first in hits[hits.index(probe):]
    assert second in hits[hits.index(first):], "the second policy is reconciled after the first failed"
    assert ctx.unconverged == {"first", "second"}, "the status timer converges both again"


async def test_an_event_that_cannot_be_posted_does_not_fail_the_caller(
        dropping: tuple[KubeClient, list[str]]) -> None:
    kube, hits = dropping
    await post_event(kube, "first", "u-first", "Warning", "InvalidSpec", "a message")
    assert hits == ["POST /api/v1/namespaces/default/events"], "a create that may have been sent is not repeated"
