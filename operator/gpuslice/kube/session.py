"""The aiohttp session both of the controller's clients send with: gpuslice's own (``transport``)
and Kopf's (``controller.login``), so that they are one identity by construction.

It carries what the kubeconfig says about the road and the identity: the TLS context, the proxy
(``proxy``), and, on every request to the API server's own origin, the impersonation headers,
``Accept-Encoding: identity`` for ``disable-compression``, the Authorization header from the
credential's ``Auth`` (unless the request brings its own, as client-go's exec round-tripper
lets a caller's header stand) and ``tls-server-name`` as the name sent and checked. A request to
any other origin (a redirect) gets none of them.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence

import aiohttp
from yarl import URL

from gpuslice.kube.credentials import Credentials, KubeconfigError
from gpuslice.kube.proxy import proxy_for
from gpuslice.kube.tls import ssl_context

Header = Callable[[], Awaitable[str | None]]


def identity_middleware(credentials: Credentials, header: Header | None) -> aiohttp.ClientMiddlewareType:
    """``header``: where the Authorization of a request that brings none comes from (Kopf's); None
    when every request brings its own (gpuslice's transport, which must know what it sent)."""
    origin = URL(credentials.server).origin()
    fixed = list(credentials.impersonate.headers()) if credentials.impersonate else []
    if credentials.disable_compression:
        fixed.append(("Accept-Encoding", "identity"))

    async def middleware(request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
        if request.url.origin() == origin:
            for name, value in fixed:
                if name == "Accept-Encoding":
                    request.headers[name] = value
                else:
                    request.headers.add(name, value)
            if header is not None and "Authorization" not in request.headers:
                try:
                    authorization = await header()
                except KubeconfigError as error:  # a token file gone, a plugin failing: retried, as a network fault
                    raise aiohttp.ClientConnectionError(str(error)) from None
                if authorization:
                    request.headers["Authorization"] = authorization
            if credentials.tls_server_name:
                request.server_hostname = credentials.tls_server_name
        return await handler(request)

    return middleware


def open_session(credentials: Credentials, header: Header | None, pair: tuple[bytes, bytes] | None, *, agent: str,
                 environ: Mapping[str, str] | None = None, resolver: aiohttp.abc.AbstractResolver | None = None,
                 trace_configs: Sequence[aiohttp.TraceConfig] = (), limit: int = 100,
                 stale: Callable[[], bool] | None = None,
                 middlewares: Sequence[aiohttp.ClientMiddlewareType] = ()) -> aiohttp.ClientSession:
    """A session to ``credentials.server``. ``pair``: an exec plugin's client certificate and key,
    over the kubeconfig's. ``limit=0`` for Kopf's (unlimited connections, as Kopf's own).
    ``stale``: asked before each request; once True (a TLS file changed), the session closes itself
    and the request fails with the RuntimeError Kopf takes for a closed session, so that Kopf logs
    in again and gets a session with the new material. ``middlewares``: the caller's, first of all
    (the controller's leader write guard refuses a write before anything else runs)."""
    proxy = proxy_for(credentials.server, credentials.proxy_url, os.environ if environ is None else environ)
    chain = [*middlewares, identity_middleware(credentials, header)]
    if stale is not None:
        async def renew(request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
            if stale():
                await session.close()
                raise RuntimeError("the TLS material changed: this session is closed, a new one is needed")
            return await handler(request)

        chain.insert(len(middlewares), renew)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=ssl_context(credentials, pair, "the exec plugin's client certificate"),
                                       resolver=resolver, limit=limit),
        headers={"User-Agent": agent}, proxy=proxy, middlewares=tuple(chain),
        trace_configs=list(trace_configs) or None)
    return session
