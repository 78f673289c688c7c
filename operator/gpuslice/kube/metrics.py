"""What every API request did, for ``gpuslice_api_requests_total``: one series per verb and outcome.

Kubernetes' own verbs (get, list, create, update, patch, apply, delete, watch), and outcomes a
person acts on rather than raw status codes, so the number of series stays small whatever the
server answers. Counted per attempt: a request retried twice counts three times.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import aiohttp
from prometheus_client import Counter

API_REQUESTS = Counter("gpuslice_api_requests", "API requests of the process by verb (get, list, watch, create,"
                       " update, patch, apply, delete) and outcome (ok, not_found, conflict, forbidden, invalid,"
                       " throttled, server_error, unreachable, ...): each attempt (a request retried twice counts"
                       " three times), a watch once when it opens; the controller's include Kopf's own.",
                       ["component", "verb", "outcome"])
OUTCOMES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 409: "conflict",
            410: "gone", 422: "invalid", 429: "throttled"}
_component = "gpuslice"


def set_component(name: str) -> None:
    """``controller`` or ``agent``: the process the counted requests come from."""
    global _component
    _component = name


def verb(method: str, path: str, content_type: str, query: dict[str, object]) -> str:
    if method == "GET":
        if query.get("watch") in (True, "true", "1", 1):
            return "watch"
        return "list" if _is_collection(path) else "get"
    if method == "PATCH":
        return "apply" if content_type == "application/apply-patch+yaml" else "patch"
    return {"POST": "create", "PUT": "update", "DELETE": "delete"}.get(method, method.lower())


def _is_collection(path: str) -> bool:
    """``/api/v1/namespaces/x/pods`` is a collection; ``.../pods/y`` and ``.../pods/y/status`` are not."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    return len(rest) == 1


def outcome(status: int | None) -> str:
    if status is None:
        return "unreachable"
    if status < 400:
        return "ok"
    if status >= 500:
        return "server_error"
    return OUTCOMES.get(status, "client_error")


def count(method: str, path: str, content_type: str, query: dict[str, object], status: int | None) -> None:
    API_REQUESTS.labels(_component, verb(method, path, content_type, query), outcome(status)).inc()


def trace_config() -> aiohttp.TraceConfig:
    """Counts the requests of an aiohttp session gpuslice's client does not make (Kopf's, in the
    controller) the same way as its own: once per attempt, a watch once when it opens."""

    def _count(params: aiohttp.TraceRequestEndParams | aiohttp.TraceRequestExceptionParams,
               status: int | None) -> None:
        count(params.method, params.url.path, params.headers.get("Content-Type", ""), dict(params.url.query), status)

    async def ended(_: aiohttp.ClientSession, __: SimpleNamespace, params: aiohttp.TraceRequestEndParams) -> None:
        _count(params, params.response.status)

    async def failed(_: aiohttp.ClientSession, __: SimpleNamespace,
                     params: aiohttp.TraceRequestExceptionParams) -> None:
        if not isinstance(params.exception, asyncio.CancelledError):  # stopped by us, not the server's doing
            _count(params, None)

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(ended)
    trace.on_request_exception.append(failed)
    return trace
