"""Kopf's logins: sessions built from gpuslice's own credentials, so that Kopf's requests (its
watches, its patches of the policies) are the same identity as gpuslice's own client's.

Kopf's ``login_with_kubeconfig`` reads a kubeconfig its own way and drops ``tokenFile``,
``as``/``as-groups`` (impersonation), ``exec`` plugins, ``tls-server-name`` and relative paths:
the controller's two clients would act as two users, or one as nobody. Here Kopf gets a session
from the same ``resolve`` and ``Auth`` as gpuslice's client (``kube.session``: the same TLS,
proxy, impersonation and Authorization), whose requests ``gpuslice_api_requests_total`` counts
as it counts the client's own.

Kopf logs in again when a session expires or is refused (401):

- An exec credential's session expires with it (``expirationTimestamp``, 10 s early), so Kopf
  logs in again in time and gets a session with the new token or client certificate.
- On every login after the first the credential is fetched anew (an exec plugin run, a token file
  re-read, an oidc token refreshed) if the one last handed to Kopf is still the current one
  (client-go's maybeRefreshCreds).
- A CA or client certificate file that changes (read again every minute, as client-go reads
  them) closes the session, which Kopf takes as a reason to log in again.
- The same credentials give back the same session object: Kopf refuses a login equal to one the
  server already rejected, which it tells by comparing them, and a new session each time would
  never compare equal, so a rejected token would make every watcher log in again without pause.
  A session that expired is never handed back: Kopf closed it. Each run of Kopf has its own
  ``KopfLogin`` (in its memo, controller.runtime): the controller runs Kopf again once its CRD is
  back, and the sessions the last run closed when it stopped must not be handed to the next.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import aiohttp
import kopf

from gpuslice.kube.auth import EXPIRY_MARGIN, Auth, Used, auth_for
from gpuslice.kube.kubeconfig import resolve
from gpuslice.kube.metrics import trace_config
from gpuslice.kube.session import open_session
from gpuslice.kube.tls import TlsFiles
from gpuslice.kube.useragent import user_agent

MIN_LIFETIME = 30.0  # seconds: a credential that expires sooner still gets this long (no login loop)
KEPT = 3  # sessions remembered for Kopf's comparison, as Kopf remembers the last three refused


class KopfLogin:
    """Kopf's logins for one controller (``kubeconfig`` as gpuslice's client reads it, the pod's
    ServiceAccount first). ``middlewares`` run first on every request of Kopf's (the leader write
    guard: controller.leader); ``environ`` and ``account`` are for tests."""

    def __init__(self, kubeconfig: Path | None, *, middlewares: Sequence[aiohttp.ClientMiddlewareType] = (),
                 environ: dict[str, str] | None = None, account: Path | None = None) -> None:
        self.kubeconfig, self.environ, self.account = kubeconfig, environ, account
        self.middlewares = tuple(middlewares)
        self.files: TlsFiles | None = None
        self.auth: Auth | None = None
        self.sessions: dict[tuple[Any, ...], kopf.AiohttpSession] = {}
        self.handed: Used | None = None  # the credential of the last session handed to Kopf

    def _source(self) -> tuple[TlsFiles, Auth]:
        if self.files is None or self.auth is None:
            credentials = resolve(self.kubeconfig, pod_first=True, environ=self.environ, account=self.account)
            self.files, self.auth = TlsFiles(credentials), auth_for(credentials)
        return self.files, self.auth

    async def session(self) -> kopf.AiohttpSession:
        files, auth = self._source()
        if self.handed is not None:
            await auth.refresh(self.handed)  # the last session expired or was refused
        value, pair, expiry = await auth.header(), auth.client_pair(), auth.expiry()
        self.handed = (value, pair)
        credentials = files.credentials  # with what its CA and client certificate files hold now
        key = (value, pair, expiry, credentials.ca_pem, credentials.cert_pem)
        known = self.sessions.get(key)
        now = time.time()
        if known is not None and (known.expiration is None or known.expiration.timestamp() > now):
            return known
        expiration = None if expiry is None else datetime.datetime.fromtimestamp(
            max(expiry - EXPIRY_MARGIN, now + MIN_LIFETIME), datetime.UTC)
        session = open_session(credentials, auth.header, pair, environ=self.environ, trace_configs=[trace_config()],
                               agent=user_agent(f"kopf/{version('kopf')}", "gpuslice-controller"), limit=0,
                               stale=files.reload, middlewares=self.middlewares)
        self.sessions.pop(key, None)  # an expired one of the same credentials: the new one is the newest
        self.sessions[key] = kopf.AiohttpSession(aiohttp_session=session, server=credentials.server,
                                                 default_namespace=credentials.namespace, expiration=expiration)
        for old in list(self.sessions)[:-KEPT]:
            del self.sessions[old]
        return self.sessions[key]

