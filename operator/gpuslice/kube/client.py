"""The one place that talks to the API server.

We speak plain JSON (dicts) rather than kubernetes_asyncio's generated models:
the models lag the server (resource.k8s.io gains fields every minor) and
silently drop what they do not know, which for ResourceSlices would mean
rewriting a driver's devices without fields the scheduler relies on. The HTTP
session and the credentials are ``transport``'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from gpuslice.kube.transport import ApiError, Transport, connect

Object = dict[str, Any]

# Seconds for one request, connection included: a half-open connection must not hang a
# reconcile (holding its policy's lock) or the agent's publish cycle for good.
REQUEST_TIMEOUT = 60


class KubeError(Exception):
    """An API error, with the server's own message (what kubectl would print)."""

    def __init__(self, status: int, reason: str, message: str, body: Object | None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}

    @classmethod
    def from_api(cls, error: ApiError) -> KubeError:
        try:
            body = json.loads(error.body) if error.body else {}
        except (TypeError, ValueError):
            body = {"message": error.body.decode(errors="replace")}
        if not isinstance(body, dict):
            body = {"message": str(body)}
        return cls(error.status, str(body.get("reason") or error.reason),
                   str(body.get("message", error.reason)), body)


class KubeClient:
    """A small async JSON client; create with :meth:`from_kubeconfig` and close when done."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    @classmethod
    async def from_kubeconfig(cls, path: Path | str | None = None) -> KubeClient:
        """From ``path``; without one, the pod's ServiceAccount, then $KUBECONFIG or ~/.kube/config."""
        return cls(await connect(path))

    async def close(self) -> None:
        await self.transport.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Object:
        try:
            result = await self.transport.request(method, path, body, query or {}, content_type, accept,
                                                  REQUEST_TIMEOUT)
        except ApiError as error:
            raise KubeError.from_api(error) from None
        return cast(Object, result or {})

    async def get(self, path: str, **query: str | int | bool) -> Object:
        return await self.request("GET", path, query=query)

    async def list(self, path: str, **query: str | int | bool) -> list[Object]:
        return cast(list[Object], (await self.get(path, **query)).get("items", []))

    async def create(self, path: str, body: Object) -> Object:
        return await self.request("POST", path, body)

    async def replace(self, path: str, body: Object) -> Object:
        return await self.request("PUT", path, body)

    async def merge_patch(self, path: str, patch: Object) -> Object:
        return await self.request("PATCH", path, patch, content_type="application/merge-patch+json")

    async def apply(self, path: str, body: Object, *, field_manager: str, force: bool = True) -> Object:
        """Server-side apply: ``body`` is the whole intent of ``field_manager``."""
        return await self.request(
            "PATCH", path, body,
            query={"fieldManager": field_manager, "force": force},
            content_type="application/apply-patch+yaml",
        )

    async def delete(self, path: str, **query: str | int | bool) -> Object:
        return await self.request("DELETE", path, query=query)
