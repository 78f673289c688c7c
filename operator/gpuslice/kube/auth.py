"""Who the requests are from: the Authorization header, and a client certificate that may change.

- A token or basic credentials from the kubeconfig: fixed.
- A token file (a kubeconfig's ``tokenFile``, the pod's ServiceAccount token): re-read every
  minute, as client-go does, since the kubelet rotates bound tokens.
- An exec credential plugin (EKS, GKE, AKS, OIDC logins): run as client-go runs it (exec.go): its
  stderr and, when interactive, its stdin are the terminal's, so a login prompt is seen;
  ``KUBERNETES_EXEC_INFO`` carries the cluster when ``provideClusterInfo`` asks; its credential is
  kept until its ``expirationTimestamp`` and fetched again after a 401.
- The ``oidc`` auth-provider: kubernetes_asyncio (the ``cli`` extra) reads and refreshes its token,
  imported only then; a refreshed token is written back to its kubeconfig (``persist``). gcp and
  azure, removed from client-go, are refused in ``kubeconfig_fields``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from gpuslice.kube.credentials import Credentials, ExecPlugin, KubeconfigError
from gpuslice.kube.persist import persist_auth_provider
from gpuslice.kube.tls import ssl_context

TOKEN_REREAD = 60.0  # seconds: bound ServiceAccount tokens are rotated by the kubelet
EXPIRY_MARGIN = 10.0  # seconds: fetch a new credential this long before the old one expires
# seconds a plugin may take when no terminal can answer it (a controller's, a script's); longer than
# the browser logins of kubelogin (180 s), so only one that hangs is stopped. client-go waits for
# ever; a hung plugin would then stall every request, which wait for its lock.
EXEC_TIMEOUT = 300.0
Pair = tuple[bytes, bytes]
Used = tuple[str | None, Pair | None]  # the Authorization value and client pair a request was sent with


class Auth(Protocol):
    async def header(self) -> str | None:
        """The Authorization header's value, or None to send none."""

    async def refresh(self, used: Used) -> bool:
        """After a 401 for a request sent with ``used`` (its Authorization and client pair): fetch
        a new credential unless another request did since, as client-go's maybeRefreshCreds; True
        when the current one differs from ``used``, so that the request may be tried again."""

    def client_pair(self) -> Pair | None:
        """A client certificate and key the credential brings (an exec plugin's), else None."""

    def expiry(self) -> float | None:
        """When the current credential must be fetched again (a Unix time), or None: it is kept
        until refused (a token file is re-read every minute on its own)."""


class StaticAuth:
    def __init__(self, value: str | None) -> None:
        self.value = value

    async def header(self) -> str | None:
        return self.value

    async def refresh(self, used: Used) -> bool:
        return False

    def client_pair(self) -> Pair | None:
        return None

    def expiry(self) -> float | None:
        return None


class TokenFileAuth(StaticAuth):
    """A token file, re-read every minute; the last token read wins over the kubeconfig's ``token``,
    which serves until the file could be read (client-go's rule)."""

    def __init__(self, path: Path, token: str | None = None) -> None:
        super().__init__(f"Bearer {token}" if token else None)
        self.path, self.read_at = path, -TOKEN_REREAD

    def _read(self) -> str | None:
        try:
            token = self.path.read_text().strip()
        except OSError as error:
            if self.value is not None:
                return self.value
            raise KubeconfigError(f"token file {self.path}: {error.strerror or error}") from None
        self.read_at = time.monotonic()
        return f"Bearer {token}" if token else self.value

    async def header(self) -> str | None:
        if time.monotonic() - self.read_at > TOKEN_REREAD:
            self.value = self._read()
        return self.value

    async def refresh(self, used: Used) -> bool:
        self.value = self._read()
        return self.value != used[0]


def _cluster_info(credentials: Credentials) -> dict[str, Any]:
    """The cluster as client.authentication.k8s.io's ExecCredential.spec.cluster spells it."""
    info: dict[str, Any] = {"server": credentials.server}
    if credentials.tls_server_name:
        info["tls-server-name"] = credentials.tls_server_name
    if credentials.insecure:
        info["insecure-skip-tls-verify"] = True
    if credentials.ca_pem:
        info["certificate-authority-data"] = base64.b64encode(credentials.ca_pem).decode()
    if credentials.proxy_url:
        info["proxy-url"] = credentials.proxy_url
    if credentials.disable_compression:
        info["disable-compression"] = True
    if credentials.cluster_extension is not None:
        info["config"] = credentials.cluster_extension
    return info


def _expiry(value: Any, where: str) -> float | None:
    if not value:
        return None
    try:
        moment = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:  # without one, local time or UTC? Go's parser refuses it too
        raise KubeconfigError(f"exec plugin {where}: expirationTimestamp {value!r} is not RFC 3339 with a time"
                              " zone (2030-01-01T00:00:00Z)")
    return moment.timestamp()


class ExecAuth:
    """An exec credential plugin's token or client certificate, fetched when needed."""

    def __init__(self, plugin: ExecPlugin, credentials: Credentials) -> None:
        self.plugin, self.credentials = plugin, credentials
        self.token: str | None = None
        self.pair: Pair | None = None
        self.expires: float | None = None
        self.fetched = False
        self._lock = asyncio.Lock()

    def _interactive(self) -> bool:
        mode, terminal = self.plugin.interactive_mode, sys.stdin is not None and sys.stdin.isatty()
        if mode == "Always" and not terminal:
            raise KubeconfigError(f"exec plugin {self.plugin.command} of {self.plugin.where} needs a terminal"
                                  " (interactiveMode: Always), and standard input is not one")
        return mode != "Never" and terminal

    async def fetch(self) -> None:
        plugin, where = self.plugin, self.plugin.where
        interactive = self._interactive()
        spec: dict[str, Any] = {"interactive": interactive}
        if plugin.provide_cluster_info:
            spec["cluster"] = _cluster_info(self.credentials)
        env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": json.dumps(
            {"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": spec})}
        try:
            process = await asyncio.create_subprocess_exec(
                plugin.command, *plugin.args, env=env, stdout=asyncio.subprocess.PIPE,
                stdin=None if interactive else asyncio.subprocess.DEVNULL, stderr=None)  # prompts reach the terminal
        except OSError as error:
            hint = f"\n\n{plugin.install_hint}" if plugin.install_hint else ""
            raise KubeconfigError(f"exec plugin {plugin.command} of {where} could not be run"
                                  f" ({error.strerror or error}){hint}") from None
        try:
            out, _ = await asyncio.wait_for(process.communicate(), None if interactive else EXEC_TIMEOUT)
        except TimeoutError:
            raise KubeconfigError(
                f"exec plugin {plugin.command} of {where} gave no credential within {EXEC_TIMEOUT:g} s and was"
                " stopped (standard input is not a terminal, so it cannot be waiting for an answer there); run it"
                " by hand to see what it waits for") from None
        finally:
            if process.returncode is None:  # timed out, or the request was cancelled: the plugin goes too
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if process.returncode:
            raise KubeconfigError(f"exec plugin {plugin.command} of {where} failed (exit status"
                                  f" {process.returncode}); what it printed is above")
        try:
            answer = json.loads(out)
        except ValueError:
            raise KubeconfigError(f"exec plugin {plugin.command} of {where} printed no JSON ExecCredential") from None
        if not isinstance(answer, dict) or answer.get("apiVersion") != plugin.api_version:
            got = answer.get("apiVersion") if isinstance(answer, dict) else None
            raise KubeconfigError(f"exec plugin {plugin.command} of {where} answered in {got!r}; it is configured"
                                  f" for {plugin.api_version}")
        if answer.get("kind") != "ExecCredential":
            raise KubeconfigError(f"exec plugin {plugin.command} of {where} answered with kind {answer.get('kind')!r},"
                                  " not ExecCredential")
        status = answer.get("status") or {}
        token, cert, key = status.get("token"), status.get("clientCertificateData"), status.get("clientKeyData")
        if not token and not (cert or key):
            raise KubeconfigError(f"exec plugin {plugin.command} of {where} returned no token and no certificate")
        if bool(cert) != bool(key):
            raise KubeconfigError(f"exec plugin {plugin.command} of {where} returned a certificate or a key, not"
                                  " both")
        pair = (str(cert).encode(), str(key).encode()) if cert else None
        if pair is not None:  # unusable, it is named here rather than at the first connection
            ssl_context(self.credentials, pair, f"exec plugin {plugin.command} of {where}: the clientCertificateData"
                                                " and clientKeyData it returned")
        self.token, self.pair = (str(token) if token else None), pair
        self.expires = _expiry(status.get("expirationTimestamp"), f"{plugin.command} of {where}")
        self.fetched = True

    async def header(self) -> str | None:
        async with self._lock:
            if not self.fetched or (self.expires is not None and time.time() > self.expires - EXPIRY_MARGIN):
                await self.fetch()
        return f"Bearer {self.token}" if self.token else None

    def _current(self) -> Used:
        return (f"Bearer {self.token}" if self.token else None), self.pair

    async def refresh(self, used: Used) -> bool:
        async with self._lock:
            if self._current() == used:  # still the one refused: nobody fetched a new one meanwhile
                await self.fetch()
            return self._current() != used

    def client_pair(self) -> Pair | None:
        return self.pair

    def expiry(self) -> float | None:
        return self.expires


class OidcAuth:
    """The ``oidc`` auth-provider, read and refreshed by kubernetes_asyncio (the ``cli`` extra)."""

    def __init__(self, provider: Any, credentials: Credentials) -> None:
        try:
            from kubernetes_asyncio.config.kube_config import KubeConfigLoader
        except ImportError:
            raise KubeconfigError(f"{credentials.source} uses the oidc auth-provider, which gpuslice reads through"
                                  " kubernetes-asyncio, not installed here: pip install 'gpuslice[cli]'") from None
        origin = credentials.user_origin

        def persist(config: dict[str, Any]) -> None:  # called by the loader after each refresh
            if origin is not None:
                persist_auth_provider(*origin, config["users"][0]["user"]["auth-provider"]["config"])

        self.loader = KubeConfigLoader(config_dict={
            "current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "clusters": [{"name": "k", "cluster": {"server": credentials.server}}],
            "users": [{"name": "u", "user": {"auth-provider": dict(provider)}}],
        }, config_persister=persist)
        self.value: str | None = None
        self._lock = asyncio.Lock()

    async def _load(self) -> str | None:
        from kubernetes_asyncio.client import Configuration

        configuration = Configuration()
        try:
            await self.loader.load_and_set(configuration)  # refreshes an expired id-token
        except Exception as error:  # its errors are of many kinds: say which provider failed
            raise KubeconfigError(f"the oidc auth-provider could not give a token: {error}") from None
        token = configuration.api_key.get("BearerToken")
        return str(token) if token else None

    async def header(self) -> str | None:
        if self.value is None:
            self.value = await self._load()
        return self.value

    async def refresh(self, used: Used) -> bool:
        async with self._lock:
            if self.value == used[0]:
                self.value = await self._load()
            return self.value != used[0]

    def client_pair(self) -> Pair | None:
        return None

    def expiry(self) -> float | None:
        return None


def auth_for(credentials: Credentials) -> Auth:
    """client-go's precedence: a token (or token file), else basic credentials, set the header; an exec
    plugin only when there is neither and no client certificate (exec.go's UpdateTransportConfig steps
    aside, so it is never run); the oidc auth-provider only when no header is set yet."""
    if credentials.token_file is not None:
        return TokenFileAuth(credentials.token_file, credentials.token)
    if credentials.token is not None:
        return StaticAuth(f"Bearer {credentials.token}")
    if credentials.basic is not None:
        user, password = credentials.basic
        return StaticAuth("Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    if credentials.exec_plugin is not None and credentials.cert_pem is None:
        return ExecAuth(credentials.exec_plugin, credentials)
    if credentials.auth_provider is not None:
        return OidcAuth(credentials.auth_provider, credentials)
    return StaticAuth(None)
