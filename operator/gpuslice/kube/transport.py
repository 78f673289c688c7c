"""HTTP to the API server: requests on a ``session`` (the kubeconfig's TLS, proxy, identity and
impersonation, the one Kopf's session is built from too), with a User-Agent that names the
component, tried once more after a 401 with a fresh credential.

gpuslice's own client, not kubernetes_asyncio's, for the controller, the agent and the CLI alike.
Importing kubernetes_asyncio adds about 36 MiB and 0.56 s to a process (measured, Python 3.11,
kubernetes-asyncio 36.1: it imports every generated model) for what gpuslice would use of it,
reading a kubeconfig and an HTTP session; a node agent runs on every GPU node. What a kubeconfig
asks for is read in ``kubeconfig`` and honoured here or refused there, never dropped; only the
oidc auth-provider is handed to kubernetes_asyncio (``auth``). docs/design.md says why this and
not lightkube or kr8s, measured on the same cases.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from gpuslice.kube.auth import Auth, ExecAuth, Used, auth_for
from gpuslice.kube.credentials import Credentials
from gpuslice.kube.kubeconfig import resolve
from gpuslice.kube.session import open_session
from gpuslice.kube.tls import TlsFiles
from gpuslice.kube.useragent import user_agent

Query = Mapping[str, str | int | bool]


class ApiError(Exception):
    """The API server answered with an error status; ``body`` is its Status object if it sent one."""

    def __init__(self, status: int, reason: str, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{status} {reason}")
        self.status, self.reason, self.body = status, reason, body
        self.headers: Mapping[str, str] = headers or {}


class Transport(Protocol):
    async def request(self, method: str, path: str, body: Any, query: Query, content_type: str, accept: str,
                      seconds: float) -> Any: ...

    def stream(self, path: str, query: Query, connect_timeout: float,
               read_timeout: float) -> Any: ...  # an async context manager of an AsyncIterator[bytes]

    async def close(self) -> None: ...


class AiohttpTransport:
    """Requests as client-go sends them for ``credentials``. ``resolver`` is for tests that give a
    name to a loopback server; ``middlewares`` run first on every request, on every session this
    transport opens (the controller's leader write guard)."""

    def __init__(self, credentials: Credentials, *, environ: Mapping[str, str] | None = None,
                 resolver: aiohttp.abc.AbstractResolver | None = None,
                 middlewares: Sequence[aiohttp.ClientMiddlewareType] = ()) -> None:
        self.credentials = credentials
        self._middlewares = tuple(middlewares)
        self.auth: Auth = auth_for(credentials)
        self._files = TlsFiles(credentials)
        self._environ, self._resolver = environ, resolver
        self._pair: tuple[bytes, bytes] | None = None
        self._session = self._new_session()
        self._busy: Counter[aiohttp.ClientSession] = Counter()  # requests running on each session

    @property
    def namespace(self) -> str:
        return self.credentials.namespace

    def _new_session(self) -> aiohttp.ClientSession:
        return open_session(self.credentials, None, self._pair, agent=user_agent(),
                            environ=self._environ, resolver=self._resolver, middlewares=self._middlewares)

    async def _headers(self, content_type: str, accept: str) -> tuple[list[tuple[str, str]], Used]:
        """The request's own headers, Authorization among them, and the credential they carry (for
        ``Auth.refresh`` after a 401); the session adds impersonation and the rest."""
        value = await self.auth.header()
        pair = self.auth.client_pair()
        renewed = self._files.reload()  # a CA or client certificate file changed
        if pair != self._pair or renewed:  # or an exec plugin's certificate, new or renewed: new connections
            old, self._pair, self.credentials = self._session, pair, self._files.credentials
            self._session = self._new_session()
            if not self._busy[old]:  # else its last request closes it (_using)
                await old.close()
        found = [("Content-Type", content_type), ("Accept", accept)]
        if value:
            found.append(("Authorization", value))
        return found, (value, pair)

    async def authenticate(self) -> None:
        """Get the credential now (an exec plugin runs) rather than at the first request."""
        await self._headers("application/json", "application/json")

    @asynccontextmanager
    async def _using(self, content_type: str, accept: str) -> AsyncIterator[tuple[aiohttp.ClientSession,
                                                                                   list[tuple[str, str]], Used]]:
        """The session a request runs on, with its headers; a session replaced meanwhile (a renewed
        client certificate) is closed when its last request ends, as client-go closes the
        connections of a rotated certificate, rather than kept until the transport closes."""
        headers, used = await self._headers(content_type, accept)  # first: it may replace the session
        session = self._session
        self._busy[session] += 1
        try:
            yield session, headers, used
        finally:
            self._busy[session] -= 1
            if not self._busy[session]:
                del self._busy[session]
                if session is not self._session:
                    await session.close()

    @staticmethod
    def _params(query: Query) -> list[tuple[str, str]]:
        return [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in query.items()]

    async def request(self, method: str, path: str, body: Any, query: Query, content_type: str, accept: str,
                      seconds: float) -> Any:
        for retry in (False, True):
            async with self._using(content_type, accept) as (session, headers, used), session.request(
                method, self.credentials.server + path, data=None if body is None else json.dumps(body),
                headers=headers, timeout=aiohttp.ClientTimeout(total=seconds), params=self._params(query),
            ) as response:
                data = await response.read()
                if response.status == 401 and not retry and await self.auth.refresh(used):
                    continue  # an expired plugin credential or rotated token: once more with the new one
                if response.status >= 400:
                    raise ApiError(response.status, response.reason or "", data, dict(response.headers))
                if not data:
                    return {}
                if "json" in (response.content_type or ""):
                    return json.loads(data)
                return data.decode(errors="replace")
        raise AssertionError("unreachable")  # the loop returns or raises

    @asynccontextmanager
    async def stream(self, path: str, query: Query, connect_timeout: float,
                     read_timeout: float) -> AsyncIterator[AsyncIterator[bytes]]:
        timeout = aiohttp.ClientTimeout(connect=connect_timeout, sock_connect=connect_timeout, sock_read=read_timeout)
        for retry in (False, True):
            async with self._using("application/json", "application/json") as (session, headers, used), session.get(
                    self.credentials.server + path, headers=headers, timeout=timeout, params=self._params(query),
            ) as response:
                if response.status == 401 and not retry and await self.auth.refresh(used):
                    continue  # as request(): once more with the new credential
                if response.status >= 400:
                    raise ApiError(response.status, response.reason or "", await response.read())
                yield response.content.__aiter__()
                return

    async def close(self) -> None:
        for session in {self._session, *self._busy}:
            await session.close()


async def connect(path: Path | str | None = None, context: str | None = None, *, pod_first: bool = True,
                  middlewares: Sequence[aiohttp.ClientMiddlewareType] = ()) -> AiohttpTransport:
    """A transport for ``path`` (a kubeconfig) and ``context``. The CLI passes ``pod_first=False``
    for kubectl's order: ``path``, then $KUBECONFIG, then ~/.kube/config, then the pod's
    ServiceAccount. The controller and the agent keep ``pod_first``: the pod's ServiceAccount
    before any kubeconfig but ``path``; the controller's Kopf session is built the same way."""
    # A few small local files, read once.
    transport = AiohttpTransport(resolve(path, context, pod_first=pod_first), middlewares=middlewares)
    if isinstance(transport.auth, ExecAuth):
        try:
            await transport.authenticate()  # run the plugin now: a failure is said before any request
        except BaseException:
            await transport.close()
            raise
    return transport
