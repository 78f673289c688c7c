"""Each API request is counted once per attempt, by Kubernetes verb and an outcome a person acts on."""

from __future__ import annotations

import aiohttp
import pytest

from gpuslice.kube.metrics import outcome, verb


@pytest.mark.parametrize(("method", "path", "content_type", "query", "expected"), [
    ("GET", "/api/v1/nodes", "application/json", {}, "list"),
    ("GET", "/api/v1/nodes/n1", "application/json", {}, "get"),
    ("GET", "/api/v1/namespaces/a/pods", "application/json", {}, "list"),
    ("GET", "/api/v1/namespaces/a/pods/p", "application/json", {}, "get"),
    ("GET", "/api/v1/namespaces/a", "application/json", {}, "get"),
    ("GET", "/apis/resource.k8s.io/v1/resourceslices", "application/json", {"watch": "true"}, "watch"),
    ("GET", "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/p/status", "application/json", {}, "get"),
    ("POST", "/api/v1/namespaces/a/events", "application/json", {}, "create"),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/x/leases/l", "application/json", {}, "update"),
    ("PATCH", "/apis/resource.k8s.io/v1/resourceslices/s", "application/apply-patch+yaml", {}, "apply"),
    ("PATCH", "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/p/status", "application/merge-patch+json", {}, "patch"),
    ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/s", "application/json", {}, "delete"),
])
def test_verbs(method: str, path: str, content_type: str, query: dict[str, object], expected: str) -> None:
    assert verb(method, path, content_type, query) == expected


def test_outcomes_are_few() -> None:
    assert [outcome(s) for s in (200, 201, 404, 409, 422, 429, 403, 500, 503, None, 418)] == [
        "ok", "ok", "not_found", "conflict", "invalid", "throttled", "forbidden", "server_error", "server_error",
        "unreachable", "client_error"]


async def test_a_session_with_the_trace_counts_as_the_client_does() -> None:
    """What Kopf's session in the controller is given (controller/login.py)."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer
    from prometheus_client import REGISTRY

    from gpuslice.kube.metrics import trace_config

    async def answer(request: web.Request) -> web.Response:
        return web.json_response({}, status=404 if request.path.endswith("/gone") else 200)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)

    def counted(verb: str, outcome: str) -> float:
        return REGISTRY.get_sample_value("gpuslice_api_requests_total",
                                         {"component": "gpuslice", "verb": verb, "outcome": outcome}) or 0.0

    before = (counted("watch", "ok"), counted("patch", "ok"), counted("get", "not_found"), counted("list", "unreachable"))
    async with TestServer(app) as server, aiohttp.ClientSession(trace_configs=[trace_config()]) as session:
        async with session.get(server.make_url("/apis/gpuslice.dev/v1alpha1/gpuslicepolicies?watch=true")):
            pass
        async with session.patch(server.make_url("/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/p"), data=b"{}",
                                 headers={"Content-Type": "application/merge-patch+json"}):
            pass
        async with session.get(server.make_url("/api/v1/nodes/gone")):
            pass
        port = server.port
    with pytest.raises(aiohttp.ClientError):
        async with aiohttp.ClientSession(trace_configs=[trace_config()]) as session:
            await session.get(f"http://127.0.0.1:{port}/api/v1/nodes")
    after = (counted("watch", "ok"), counted("patch", "ok"), counted("get", "not_found"), counted("list", "unreachable"))
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 1, 1]
