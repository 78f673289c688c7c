"""LIST then WATCH, for ever: a small informer without a cache.

Kopf watches whole collections and filters on the client; a node agent needs its own
node's objects only, which the API server can select (``fieldSelector``) before it sends
anything. This is the loop client-go's reflector runs: list (in pages), watch from the
list's resourceVersion with bookmarks, and list again when the server says the version
is too old (410) or the connection breaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp

from gpuslice.backoff import Backoff
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.kube.transport import ApiError

# type is None for objects of the (re)list, as Kopf reports its initial listing; else ADDED,
# MODIFIED or DELETED.
Handler = Callable[[str | None, dict[str, Any]], Awaitable[None] | None]
PAGE = 500
CONNECT_TIMEOUT = 30.0
# Seconds between tries at most: a watch is back within this long of an API server that returns.
MAX_BACKOFF = 5.0
# Seconds a stream may go without a line (an event or a bookmark, which the API server sends about
# every minute) before it is taken for dead and opened again: a long watch must not hide a dead
# connection for as long as it runs.
STALL = 300.0


async def list_all(kube: KubeClient, path: str, query: Mapping[str, str | int | bool] | None = None,
                   page: int = PAGE) -> tuple[list[dict[str, Any]], str]:
    """Every object of a collection, ``page`` at a time; returns them and the list's resourceVersion."""
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        params: dict[str, str | int | bool] = {**(query or {}), "limit": page}
        if token:
            params["continue"] = token
        body = await kube.get(path, **params)
        items.extend(body.get("items") or [])
        token = (body.get("metadata") or {}).get("continue") or ""
        if not token:
            return items, str((body.get("metadata") or {}).get("resourceVersion") or "")


class Gone(Exception):
    """The server no longer has the resourceVersion we watch from: list again."""


async def _stream(kube: KubeClient, path: str, query: Mapping[str, str | int | bool], version: str,
                  server_timeout: int, handler: Handler) -> str:
    params = {**query, "watch": True, "resourceVersion": version, "allowWatchBookmarks": True,
              "timeoutSeconds": server_timeout}
    try:
        async with kube.transport.stream(path, params, CONNECT_TIMEOUT, min(server_timeout + 30, STALL)) as lines:
            async for line in lines:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise KubeError(int(obj.get("code") or 500), str(obj.get("reason") or "WatchError"),
                                    str(obj.get("message") or obj), obj)
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind != "BOOKMARK":
                    result = handler(kind, obj)
                    if result is not None:
                        await result
    except ApiError as error:
        raise KubeError.from_api(error) from None
    return version


async def watch(kube: KubeClient, path: str, handler: Handler, stop: asyncio.Event, *,
                query: Mapping[str, str | int | bool] | None = None, server_timeout: int = 600,
                on_error: Callable[[BaseException], None] | None = None,
                on_listed: Callable[[], None] | None = None) -> None:
    """Call ``handler`` for every object listed and every change, until ``stop`` is set.

    ``on_listed`` is called after each (re)list has been handed to ``handler``. Errors are
    reported to ``on_error`` and retried with backoff (1 s doubling to 5 s, with jitter); the
    loop never ends on its own.
    """
    version = ""
    backoff = Backoff(1.0, MAX_BACKOFF)
    query = dict(query or {})
    while not stop.is_set():
        try:
            if not version:
                items, version = await list_all(kube, path, query)
                for item in items:
                    result = handler(None, item)
                    if result is not None:
                        await result
                if on_listed is not None:
                    on_listed()
            # Each watch ends after a spread of ``server_timeout``, so a fleet does not reconnect in step.
            version = await _stream(kube, path, query, version, int(server_timeout * random.uniform(0.8, 1.0)), handler)
            backoff.reset()
        except Gone:
            version = ""
        except asyncio.CancelledError:
            raise
        except (KubeError, aiohttp.ClientError, TimeoutError, OSError, ValueError) as error:
            if on_error is not None:
                on_error(error)
            version = ""
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff.next())
