"""The API client against a real HTTP server on loopback that fails on cue: every failure is a
typed KubeError, and a request is repeated only when repeating it cannot do anything twice."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from gpuslice.kube.client import (
    AlreadyExists,
    Conflict,
    Forbidden,
    Invalid,
    KubeClient,
    KubeError,
    NotFound,
    NotReady,
    RetryPolicy,
    ServerError,
    TooManyRequests,
    Unreachable,
    refused_by_disruption_budget,
)
from gpuslice.kube.credentials import Credentials
from gpuslice.kube.metrics import API_REQUESTS
from gpuslice.kube.transport import AiohttpTransport
from tests.unit.polling import eventually

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
FAST = RetryPolicy(attempts=4, budget=5.0, first_delay=0.01, max_delay=0.05)


def status(code: int, reason: str, message: str = "", headers: dict[str, str] | None = None) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message or reason,
            "reason": reason, "code": code}
    return web.json_response(body, status=code, headers=headers)


class Server:
    """Answers each request with the next handler of a script (the last one repeats); counts hits."""

    def __init__(self) -> None:
        self.script: list[Handler] = []
        self.hits: list[tuple[str, str]] = []
        self.port = 0
        self.released = asyncio.Event()  # hanging handlers return once the test is over

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits.append((request.method, request.path_qs))
        handler = self.script[min(len(self.hits), len(self.script)) - 1]
        return await handler(request)

    def client(self, retry: RetryPolicy = FAST, timeout: float = 5.0, port: int | None = None) -> KubeClient:
        return KubeClient(AiohttpTransport(Credentials(server=f"http://127.0.0.1:{port or self.port}")),
                          timeout=timeout, retry=retry)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    found = Server()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", found.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    found.port = runner.addresses[0][1]
    yield found
    found.released.set()
    await runner.cleanup()


def answer(response: Callable[[], web.StreamResponse]) -> Handler:
    async def handler(_: web.Request) -> web.StreamResponse:
        return response()
    return handler


def ok(body: dict[str, Any] | None = None) -> Handler:
    return answer(lambda: web.json_response(body or {"kind": "Thing", "metadata": {"name": "x"}}))


def hang(server: Server) -> Handler:
    async def handler(_: web.Request) -> web.StreamResponse:
        await server.released.wait()
        return web.Response(status=504)
    return handler


async def drop(request: web.Request) -> web.StreamResponse:
    """Close the connection without an answer, as a restarting apiserver does."""
    assert request.transport is not None
    request.transport.close()
    return web.Response()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(("code", "reason", "kind"), [
    (404, "NotFound", NotFound), (409, "Conflict", Conflict), (409, "AlreadyExists", AlreadyExists),
    (422, "Invalid", Invalid), (403, "Forbidden", Forbidden), (500, "InternalError", ServerError),
    (503, "ServiceUnavailable", ServerError),
])
async def test_each_answer_is_its_typed_error_and_still_a_kube_error(
        server: Server, code: int, reason: str, kind: type[KubeError]) -> None:
    server.script = [answer(lambda: status(code, reason, f"the {reason} message"))]
    async with server.client(retry=RetryPolicy(attempts=1)) as kube:
        with pytest.raises(kind) as raised:
            await kube.get("/api/v1/namespaces/x")
    assert isinstance(raised.value, KubeError)
    assert (raised.value.status, raised.value.reason, raised.value.message) == (code, reason, f"the {reason} message")
    assert raised.value.transient == (code >= 500)


async def test_an_api_server_whose_admission_is_not_ready_yet_is_transient_not_a_denial(server: Server) -> None:
    # What k8s.io/apiserver's admission plugins answer until their informers have synced (a restart).
    server.script = [answer(lambda: status(403, "Forbidden", 'resourceslices "x" is forbidden: not yet ready to'
                                                             " handle request"))]
    async with server.client(retry=RetryPolicy(attempts=1)) as kube:
        with pytest.raises(NotReady) as raised:
            await kube.get("/api/v1/namespaces/x")
    assert isinstance(raised.value, Forbidden)
    assert raised.value.transient


async def test_already_exists_is_a_conflict(server: Server) -> None:
    server.script = [answer(lambda: status(409, "AlreadyExists"))]
    async with server.client() as kube:
        with pytest.raises(Conflict):
            await kube.create("/api/v1/namespaces", {"metadata": {"name": "x"}})


async def test_connection_refused_is_unreachable_and_retried_within_the_budget() -> None:
    async with Server().client(port=closed_port(), retry=RetryPolicy(attempts=3, budget=5, first_delay=0.01)) as kube:
        with pytest.raises(Unreachable) as raised:
            await kube.get("/api/v1/namespaces")
    assert raised.value.status == 0
    assert not raised.value.sent
    assert "no answer from the API server" in str(raised.value)


async def test_a_create_that_never_reached_the_server_is_repeated(server: Server) -> None:
    """Connection refused means nothing was sent: even a create may go again (here: once the server is up)."""
    port = closed_port()
    server.script = [ok()]
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()

    def refused_creates() -> float:
        return sum(s.value for m in API_REQUESTS.collect() for s in m.samples
                   if s.name == "gpuslice_api_requests_total" and s.labels["verb"] == "create"
                   and s.labels["outcome"] == "unreachable")

    before = refused_creates()

    async def start_late() -> None:  # once the create was refused twice
        await eventually(lambda: refused_creates() >= before + 2, what="the create to be refused twice")
        await web.TCPSite(runner, "127.0.0.1", port).start()

    late = asyncio.create_task(start_late())
    try:
        async with server.client(port=port, retry=RetryPolicy(attempts=20, budget=5, first_delay=0.05,
                                                                max_delay=0.1)) as kube:
            await kube.create("/api/v1/namespaces", {"metadata": {"name": "x"}})
    finally:
        await late
        await runner.cleanup()
    assert server.hits == [("POST", "/api/v1/namespaces")]


async def test_idempotent_requests_are_repeated_after_a_server_error(server: Server) -> None:
    server.script = [answer(lambda: status(503, "ServiceUnavailable")), answer(lambda: status(500, "InternalError")),
                     ok()]
    async with server.client() as kube:
        assert (await kube.get("/api/v1/namespaces/x"))["kind"] == "Thing"
    assert len(server.hits) == 3


@pytest.mark.parametrize("call", ["replace", "delete", "merge_patch", "apply"])
async def test_writes_that_are_safe_to_repeat_are_repeated_after_a_dropped_connection(server: Server,
                                                                                     call: str) -> None:
    server.script = [drop, ok()]
    async with server.client() as kube:
        if call == "delete":
            await kube.delete("/api/v1/namespaces/x")
        elif call == "apply":
            await kube.apply("/api/v1/namespaces/x", {"metadata": {"name": "x"}}, field_manager="t")
        else:
            await getattr(kube, call)("/api/v1/namespaces/x", {"metadata": {"name": "x"}})
    assert len(server.hits) == 2


async def test_a_create_that_may_have_been_sent_is_not_repeated(server: Server) -> None:
    server.script = [drop, ok()]
    async with server.client() as kube:
        with pytest.raises(Unreachable) as raised:
            await kube.create("/api/v1/namespaces", {"metadata": {"name": "x"}})
        assert raised.value.sent
        assert len(server.hits) == 1
        server.script = [answer(lambda: status(503, "ServiceUnavailable")), ok()]
        server.hits.clear()
        with pytest.raises(ServerError):
            await kube.create("/api/v1/namespaces", {"metadata": {"name": "x"}})
        assert len(server.hits) == 1
        server.hits.clear()
        await kube.create("/api/v1/namespaces", {"metadata": {"name": "x"}}, idempotent=True)  # caller: harmless
        assert len(server.hits) == 2


async def test_json_patch_is_not_repeated(server: Server) -> None:
    server.script = [answer(lambda: status(503, "ServiceUnavailable")), ok()]
    async with server.client() as kube:
        with pytest.raises(ServerError):
            await kube.request("PATCH", "/api/v1/namespaces/x", [{"op": "add", "path": "/a", "value": 1}],
                               content_type="application/json-patch+json")
    assert len(server.hits) == 1


async def test_too_many_requests_is_repeated_for_any_method_after_retry_after(server: Server) -> None:
    server.script = [answer(lambda: status(429, "TooManyRequests", headers={"Retry-After": "1"})), ok()]
    async with server.client() as kube:
        started = asyncio.get_running_loop().time()
        await kube.create("/api/v1/namespaces", {"metadata": {"name": "x"}})
        waited = asyncio.get_running_loop().time() - started
    assert len(server.hits) == 2
    assert waited >= 0.1, "Retry-After (1 s, capped at twice max_delay) is honoured"
    server.hits.clear()
    async with server.client(retry=RetryPolicy(attempts=1)) as kube:
        with pytest.raises(TooManyRequests) as raised:
            await kube.get("/api/v1/namespaces/x")
    assert raised.value.retry_after == 1.0


async def test_a_timeout_is_unreachable_and_repeats_are_bounded(server: Server) -> None:
    server.script = [hang(server)]
    retry = RetryPolicy(attempts=3, budget=30, first_delay=0.01)
    async with server.client(timeout=0.3, retry=retry) as kube:
        with pytest.raises(Unreachable, match="timed out"):
            await kube.get("/api/v1/namespaces/x")
        assert len(server.hits) == 3, "at most `attempts` tries"
        server.hits.clear()
        with pytest.raises(Unreachable):
            await kube.create("/api/v1/namespaces", {"metadata": {"name": "x"}})
        assert len(server.hits) == 1


async def test_repeats_stop_at_the_time_budget(server: Server) -> None:
    server.script = [answer(lambda: status(503, "ServiceUnavailable"))]
    retry = RetryPolicy(attempts=1000, budget=0.5, first_delay=0.05, max_delay=0.1)
    async with server.client(retry=retry) as kube:
        started = asyncio.get_running_loop().time()
        with pytest.raises(ServerError):
            await kube.get("/api/v1/namespaces/x")
        # 1000 attempts would take over a minute; the budget stops them after half a second (plus the
        # last try, however slow a loaded machine makes it).
        assert asyncio.get_running_loop().time() - started < 10
    assert 2 <= len(server.hits) < 20


async def test_client_errors_are_not_repeated(server: Server) -> None:
    server.script = [answer(lambda: status(422, "Invalid")), ok()]
    async with server.client() as kube:
        with pytest.raises(Invalid):
            await kube.apply("/api/v1/namespaces/x", {"metadata": {"name": "x"}}, field_manager="t")
    assert len(server.hits) == 1


async def test_apply_dry_run_asks_the_server_to_store_nothing(server: Server) -> None:
    server.script = [ok()]
    async with server.client() as kube:
        await kube.apply("/api/v1/namespaces/x", {"metadata": {"name": "x"}}, field_manager="t", dry_run=True)
    [(method, path)] = server.hits
    assert method == "PATCH"
    assert "dryRun=All" in path
    assert "fieldManager=t" in path


def test_kopf_backoffs_never_run_out_and_start_afresh_for_each_request() -> None:
    import itertools

    from gpuslice.kube.client import EndlessBackoff

    backoffs = EndlessBackoff()
    assert list(itertools.islice(backoffs, 7)) == [0.5, 1.0, 2.0, 3.0, 5.0, 5.0, 5.0]
    assert next(iter(backoffs)) == 0.5, "each request iterates anew (Kopf chains the iterable per request)"


def test_an_eviction_refused_by_a_budget_is_told_from_a_server_shedding_load() -> None:
    """The Eviction API's refusals (pkg/registry/core/pod/storage/eviction.go) name the budget in
    their causes; priority and fairness answers 429 too, with no such cause: that one is retried."""
    budget = KubeError.of(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                          {"details": {"causes": [{"reason": "DisruptionBudget",
                                                   "message": "The disruption budget keep needs 1 healthy pods"}]}})
    shed = KubeError.of(429, "TooManyRequests", "Too many requests, please try again later.", {}, 1.0)
    several = KubeError.of(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the"
                           " eviction subresource does not support.")
    failed = KubeError.of(500, "InternalError", "etcdserver: request timed out")
    negative = KubeError.of(403, "Forbidden", "Cannot evict pod as it would violate the pod's disruption budget.",
                            {"details": {"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget"
                                                     " keep does not allow evicting pods currently"}]}})
    rbac = KubeError.of(403, "Forbidden", 'pods "x" is forbidden: User cannot create resource "pods/eviction"')
    assert refused_by_disruption_budget(negative)
    assert not refused_by_disruption_budget(rbac)
    assert refused_by_disruption_budget(budget)
    assert refused_by_disruption_budget(several)
    assert not refused_by_disruption_budget(shed)
    assert not refused_by_disruption_budget(failed)


def test_a_missing_kind_and_an_immutable_field_are_read_from_the_status_not_its_text() -> None:
    missing = KubeError.of(404, "NotFound", 'nodes "gpu-1" not found', {"details": {"name": "gpu-1", "kind": "nodes"}})
    assert isinstance(missing, NotFound)
    assert missing.kind == "nodes"
    assert KubeError.of(404, "NotFound", "the server could not find the requested resource").kind == ""  # type: ignore[attr-defined]
    immutable = KubeError.of(422, "Invalid", 'ResourceClaimTemplate.resource.k8s.io "gpu" is invalid', {
        "details": {"causes": [{"reason": "FieldValueInvalid", "message": "Invalid value: ...: field is immutable",
                                "field": "spec"}]}})
    assert isinstance(immutable, Invalid)
    assert immutable.immutable
    other = KubeError.of(422, "Invalid", "spec.devices: Required value", {"details": {"causes": []}})
    assert isinstance(other, Invalid)
    assert not other.immutable
