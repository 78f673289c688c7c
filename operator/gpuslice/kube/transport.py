"""HTTP to the API server: credentials from a kubeconfig or the pod's ServiceAccount, TLS, one
aiohttp session.

kubernetes_asyncio costs a process about 60 MiB of memory (its package imports every generated
model) for what gpuslice uses of it: reading a kubeconfig and an HTTP session. A node agent
runs on every GPU node, so that is read here instead, for the cases a cluster gives an
operator: in-cluster ServiceAccount tokens (re-read as the kubelet rotates them), bearer tokens
and token files, client certificates, CA data or files. A kubeconfig this does not cover (an
exec or auth-provider plugin, several files to merge) is handed to kubernetes_asyncio, imported
only then.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD = 60.0  # seconds: bound ServiceAccount tokens are rotated by the kubelet
Query = Mapping[str, str | int | bool]


class KubeconfigError(ValueError):
    """No credentials could be loaded; the message says why and what to do."""


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


@dataclass(frozen=True)
class Credentials:
    server: str
    ca_pem: bytes | None = None
    insecure: bool = False
    token: str | None = None
    token_file: Path | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None


def _data_or_file(entry: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    if entry.get(f"{key}-data"):
        return base64.b64decode(entry[f"{key}-data"])
    if entry.get(key):
        return (base / os.path.expanduser(str(entry[key]))).read_bytes()
    return None


def from_kubeconfig_file(path: Path) -> Credentials | None:
    """Credentials of the current context; None when they need a plugin (exec, auth-provider)."""
    config = yaml.safe_load(path.read_text()) or {}
    base = path.parent

    def named(kind: str, name: str) -> dict[str, Any]:
        found = next((item.get(kind[:-1]) or {} for item in config.get(kind) or [] if item.get("name") == name), None)
        if found is None:
            raise ValueError(f"kubeconfig {path} has no {kind[:-1]} named {name!r}")
        return dict(found)

    context = named("contexts", str(config.get("current-context") or ""))
    cluster, user = named("clusters", str(context.get("cluster"))), named("users", str(context.get("user")))
    if user.get("exec") or user.get("auth-provider") or user.get("username"):
        return None
    token_file = user.get("tokenFile")
    return Credentials(
        server=str(cluster["server"]).rstrip("/"),
        ca_pem=_data_or_file(cluster, "certificate-authority", base),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        token=user.get("token"),
        token_file=(base / os.path.expanduser(str(token_file))) if token_file else None,
        cert_pem=_data_or_file(user, "client-certificate", base),
        key_pem=_data_or_file(user, "client-key", base),
    )


def in_cluster() -> Credentials | None:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not (SERVICE_ACCOUNT / "token").is_file():
        return None
    host = f"[{host}]" if ":" in host else host
    return Credentials(server=f"https://{host}:{port}", ca_pem=(SERVICE_ACCOUNT / "ca.crt").read_bytes(),
                       token_file=SERVICE_ACCOUNT / "token")


def ssl_context(credentials: Credentials) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=credentials.ca_pem.decode() if credentials.ca_pem else None)
    if credentials.insecure:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    if credentials.cert_pem and credentials.key_pem:
        # The ssl module loads a key pair only from files: a private directory, gone at once.
        with tempfile.TemporaryDirectory(prefix="gpuslice-tls-") as directory:
            cert, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
            cert.write_bytes(credentials.cert_pem)
            key.touch(mode=0o600)
            key.write_bytes(credentials.key_pem)
            context.load_cert_chain(cert, key)
    return context


class AiohttpTransport:
    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context(credentials)))
        self._token = credentials.token
        self._token_read = 0.0

    def _headers(self, content_type: str, accept: str) -> dict[str, str]:
        file = self.credentials.token_file
        if file is not None and time.monotonic() - self._token_read > TOKEN_REREAD:
            self._token, self._token_read = file.read_text().strip(), time.monotonic()
        headers = {"Content-Type": content_type, "Accept": accept}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    @staticmethod
    def _params(query: Query) -> list[tuple[str, str]]:
        return [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in query.items()]

    async def request(self, method: str, path: str, body: Any, query: Query, content_type: str, accept: str,
                      seconds: float) -> Any:
        async with self._session.request(
            method, self.credentials.server + path, params=self._params(query),
            data=None if body is None else json.dumps(body), headers=self._headers(content_type, accept),
            timeout=aiohttp.ClientTimeout(total=seconds),
        ) as response:
            data = await response.read()
            if response.status >= 400:
                raise ApiError(response.status, response.reason or "", data, dict(response.headers))
            if not data:
                return {}
            if "json" in (response.content_type or ""):
                return json.loads(data)
            return data.decode(errors="replace")

    @asynccontextmanager
    async def stream(self, path: str, query: Query, connect_timeout: float,
                     read_timeout: float) -> AsyncIterator[AsyncIterator[bytes]]:
        timeout = aiohttp.ClientTimeout(connect=connect_timeout, sock_connect=connect_timeout, sock_read=read_timeout)
        async with self._session.get(self.credentials.server + path, params=self._params(query),
                                     headers=self._headers("application/json", "application/json"),
                                     timeout=timeout) as response:
            if response.status >= 400:
                raise ApiError(response.status, response.reason or "", await response.read())
            yield response.content.__aiter__()

    async def close(self) -> None:
        await self._session.close()


class LibraryTransport:
    """kubernetes_asyncio, for kubeconfigs that need its auth plugins."""

    def __init__(self, api: Any) -> None:
        self._api = api

    @classmethod
    async def load(cls, path: Path | str | None) -> LibraryTransport:
        try:
            from kubernetes_asyncio import config as kube_config
            from kubernetes_asyncio.client import ApiClient, Configuration
        except ImportError:
            where = f"kubeconfig {path}" if path is not None else "$KUBECONFIG (or ~/.kube/config)"
            raise KubeconfigError(
                f"no ServiceAccount token, and {where} is missing or needs kubernetes-asyncio (an exec or"
                " auth-provider plugin, or several files to merge), which is not installed: pip install"
                " 'gpuslice[cli]'") from None

        configuration = Configuration()
        if path is None:
            try:
                kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except kube_config.ConfigException:
                await kube_config.load_kube_config(client_configuration=configuration)
        else:
            await kube_config.load_kube_config(config_file=str(path), client_configuration=configuration)
        return cls(ApiClient(configuration))

    async def request(self, method: str, path: str, body: Any, query: Query, content_type: str, accept: str,
                      seconds: float) -> Any:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            return await self._api.call_api(
                path, method, query_params=AiohttpTransport._params(query),
                header_params={"Content-Type": content_type, "Accept": accept}, body=body,
                response_types_map={status: "object" for status in (200, 201, 202)},
                auth_settings=["BearerToken"], _return_http_data_only=True, _request_timeout=seconds,
            )
        except ApiException as error:
            raise ApiError(int(error.status or 0), str(error.reason), (error.body or b"") if isinstance(
                error.body, bytes) else str(error.body or "").encode(), dict(error.headers or {})) from None

    @asynccontextmanager
    async def stream(self, path: str, query: Query, connect_timeout: float,
                     read_timeout: float) -> AsyncIterator[AsyncIterator[bytes]]:
        response = await self._api.call_api(
            path, "GET", query_params=AiohttpTransport._params(query), header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(connect=connect_timeout, sock_connect=connect_timeout,
                                                   sock_read=read_timeout),
        )
        try:
            if response.status >= 400:
                raise ApiError(response.status, response.reason or "", await response.read())
            yield response.content.__aiter__()
        finally:
            response.release()

    async def close(self) -> None:
        await self._api.close()


def credentials_for(path: Path | str | None) -> Credentials | None:
    """What ``connect`` would use; None: kubernetes_asyncio has to (a plugin, several files)."""
    credentials: Credentials | None = None
    if path is not None:
        credentials = from_kubeconfig_file(Path(path))
    else:
        credentials = in_cluster()
        if credentials is None:
            paths = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
            if len(paths) <= 1:
                candidate = Path(os.path.expanduser(paths[0] if paths else "~/.kube/config"))
                credentials = from_kubeconfig_file(candidate) if candidate.is_file() else None
    return credentials


async def connect(path: Path | str | None = None) -> Transport:
    """A transport for ``path`` (a kubeconfig); without one, the pod's ServiceAccount, then
    $KUBECONFIG (its first file) or ~/.kube/config."""
    try:
        credentials = credentials_for(path)  # a few small local files, read once at start
    except KubeconfigError:
        raise
    except OSError as error:
        raise KubeconfigError(f"kubeconfig {path or '$KUBECONFIG'}: {error.strerror or error}"
                              f" ({error.filename or path})") from None
    except (ValueError, yaml.YAMLError) as error:  # not YAML, or no such context, user or cluster
        raise KubeconfigError(f"kubeconfig {path or '$KUBECONFIG'}: {error}") from None
    if credentials is None:
        return await LibraryTransport.load(path)
    return AiohttpTransport(credentials)
