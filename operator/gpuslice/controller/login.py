"""Kopf's connection, on a session whose requests ``gpuslice_api_requests_total`` counts.

Kopf makes most of the controller's API requests (its watches, its patches of the policies'
finalizers and annotations); left to itself it builds its own aiohttp session, which no one
counts. A login handler may hand Kopf a session instead (``kopf.AiohttpSession``): this one is
built as Kopf builds its own (same TLS, headers, proxy, unlimited connections), plus a trace
that counts each request as gpuslice's own client does. Kopf closes it when it logs in again.

The same credentials get the same session object: Kopf refuses a login equal to one the server
already rejected (401), which it tells by comparing them, and a new session each time would never
compare equal, so a rejected token would make every watcher log in again without pause.
"""

from __future__ import annotations

from importlib.metadata import version

import aiohttp
import kopf

from gpuslice.kube.metrics import trace_config
from gpuslice.kube.useragent import user_agent

_SESSIONS: dict[kopf.ConnectionInfo, kopf.AiohttpSession] = {}


def counted_session(info: kopf.ConnectionInfo) -> kopf.AiohttpSession:
    known = _SESSIONS.get(info)
    if known is not None:
        return known
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers={**info.as_http_headers(), "User-Agent": user_agent(f"kopf/{version('kopf')}", "gpuslice-controller")},
        proxy=info.proxy_url,
        trust_env=info.trust_env,
        trace_configs=[trace_config()],
    )
    _SESSIONS[info] = kopf.AiohttpSession(aiohttp_session=session, server=info.server, priority=info.priority,
                                          default_namespace=info.default_namespace, expiration=info.expiration)
    return _SESSIONS[info]
