"""Kopf's session is the same identity as gpuslice's own client: Kopf's real authenticator and
request machinery, with the controller's login handler, against a loopback HTTPS API server (and
an HTTP CONNECT proxy) that record what reached them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
import kopf
import pytest
from kopf._cogs.clients import api
from kopf._cogs.clients import auth as kopf_auth
from kopf._cogs.structs import credentials, ephemera
from kopf._core.engines import activities, indexing

from gpuslice.controller import login
from gpuslice.controller.handlers import build_registry
from gpuslice.controller.leader import LEASE_NAME, LeaderElector, WriteGuard
from gpuslice.controller.runtime import Runtime
from gpuslice.controller.settings import ControllerSettings
from gpuslice.devcluster.pki import CertificateAuthority
from gpuslice.kube import auth, tls
from gpuslice.kube.transport import ApiError, connect
from tests.unit.kube.loopback import ApiServer, Check, ConnectProxy, Seen, ca_data, kubeconfig, write_plugin

NAME = "apiserver.test"  # the proxy tunnels it to this machine
Get = Callable[[str], Awaitable[Any]]


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create()


@pytest.fixture
async def servers() -> AsyncIterator[list[ApiServer | ConnectProxy]]:
    started: list[ApiServer | ConnectProxy] = []
    yield started
    for server in started:
        await server.stop()


async def serve(started: list[ApiServer | ConnectProxy], ca: CertificateAuthority, directory: Path,
                hosts: tuple[str, ...] = ("127.0.0.1",), check: Check | None = None) -> ApiServer:
    server = await ApiServer(ca, list(hosts), check=check).start(directory)
    started.append(server)
    return server


def config(path: Path, ca: CertificateAuthority, server: str, user: dict[str, Any],
           **cluster: Any) -> Path:
    return kubeconfig(path, current="ctx", contexts={"ctx": {"cluster": "c", "user": "u", "namespace": "ops"}},
                      clusters={"c": {"server": server, "certificate-authority-data": ca_data(ca), **cluster}},
                      users={"u": user})


@contextlib.asynccontextmanager
async def kopf_with(path: Path) -> AsyncIterator[Get]:
    """Kopf's authenticator with the controller's registry (its login handler), and a GET as Kopf's
    watchers and patches send theirs: through the vault, logging in again on a 401 or an expiry."""

    async def no_client() -> Any:
        raise AssertionError("not used by the login handler")

    settings = ControllerSettings(kubeconfig=path)
    registry = build_registry(settings)
    runtime = Runtime(settings, no_client, login.KopfLogin(path))
    vault = credentials.Vault()
    kopf_settings = kopf.OperatorSettings()
    kopf_settings.networking.error_backoffs = [0.1]
    token = kopf_auth.vault_var.set(vault)
    task = asyncio.create_task(activities.authenticator(
        registry=registry, settings=kopf_settings, indices=indexing.OperatorIndexers().indices, vault=vault,
        memo=ephemera.AnyMemo(runtime)))

    async def get(url: str) -> Any:
        return await asyncio.wait_for(api.get(url, settings=kopf_settings, logger=logging.getLogger("test")), 20)

    try:
        yield get
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await vault.close()
        kopf_auth.vault_var.reset(token)


def authorizations(server: ApiServer) -> list[str | None]:
    return [s.one("Authorization") for s in server.seen]


async def test_kopfs_requests_carry_the_kubeconfigs_identity_and_road(
        ca: CertificateAuthority, servers: list[ApiServer | ConnectProxy], tmp_path: Path) -> None:
    """Token, impersonation, tls-server-name through a proxy-url: what Kopf's own kubeconfig login
    dropped (the requests then went out as the admin the token names, not as jane)."""
    server = await serve(servers, ca, tmp_path, hosts=("kubernetes.internal.example",))
    proxy = await ConnectProxy({NAME}).start()
    servers.append(proxy)
    path = config(tmp_path / "kubeconfig", ca, f"https://{NAME}:{server.port}",
                  {"token": "admin-token", "as": "jane", "as-groups": ["dev"], "as-user-extra": {"team": ["gpu"]}},
                  **{"tls-server-name": "kubernetes.internal.example", "proxy-url": proxy.url})
    async with kopf_with(path) as get:
        await get("/api/v1/namespaces")
    (seen,) = server.seen
    assert seen.one("Authorization") == "Bearer admin-token"
    assert (seen.one("Impersonate-User"), seen.all("Impersonate-Group"), seen.one("Impersonate-Extra-team")) == (
        "jane", ["dev"], "gpu")
    assert (seen.one("User-Agent") or "").startswith("gpuslice-controller/")
    assert "kopf/" in (seen.one("User-Agent") or "")
    (target, lines), = proxy.asked
    assert target == f"{NAME}:{server.port}"
    assert not [line for line in lines if line.lower().startswith(("authorization", "impersonate"))]


async def test_kopf_reads_the_token_file_as_gpuslice_does(
        ca: CertificateAuthority, servers: list[ApiServer | ConnectProxy], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    server = await serve(servers, ca, tmp_path)
    (tmp_path / "token").write_text("first\n")
    path = config(tmp_path / "kubeconfig", ca, f"https://127.0.0.1:{server.port}", {"tokenFile": "token"})
    async with kopf_with(path) as get:
        await get("/api/v1/namespaces")
        (tmp_path / "token").write_text("rotated\n")  # the kubelet rotates a bound token
        monkeypatch.setattr(auth, "TOKEN_REREAD", 0.0)  # a minute later
        await get("/api/v1/namespaces")
    assert authorizations(server) == ["Bearer first", "Bearer rotated"]


def counting_plugin(directory: Path, lifetime: float) -> Path:
    """An exec plugin whose n-th run returns token tn, valid for ``lifetime`` seconds."""
    calls = directory / "calls"
    calls.write_text("0")
    return write_plugin(directory / "plugin", f"import datetime\nn = int(open({str(calls)!r}).read()) + 1\n"
                        f"open({str(calls)!r}, 'w').write(str(n))\n"
                        f"end = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds={lifetime})\n"
                        "say({'token': f't{n}', 'expirationTimestamp': end.strftime('%Y-%m-%dT%H:%M:%SZ')})\n")


def exec_user(plugin: Path) -> dict[str, Any]:
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
                     "interactiveMode": "Never"}}


async def test_kopf_logs_in_again_when_the_exec_credential_expires(
        ca: CertificateAuthority, servers: list[ApiServer | ConnectProxy], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(login, "MIN_LIFETIME", 0.0)
    server = await serve(servers, ca, tmp_path)
    plugin = counting_plugin(tmp_path, auth.EXPIRY_MARGIN + 3)  # Kopf's session: 3 s, to the second
    path = config(tmp_path / "kubeconfig", ca, f"https://127.0.0.1:{server.port}", exec_user(plugin))
    async with kopf_with(path) as get:
        await get("/api/v1/namespaces")
        await get("/api/v1/namespaces")  # the same session: the plugin is not run again
        await asyncio.sleep(4.2)
        await get("/api/v1/namespaces")
    assert authorizations(server) == ["Bearer t1", "Bearer t1", "Bearer t2"]
    assert (tmp_path / "calls").read_text() == "2"


async def test_a_refused_exec_token_is_fetched_anew(
        ca: CertificateAuthority, servers: list[ApiServer | ConnectProxy], tmp_path: Path) -> None:
    def refuse_t1(seen: Seen) -> int | None:
        return 401 if seen.one("Authorization") == "Bearer t1" else None

    server = await serve(servers, ca, tmp_path, check=refuse_t1)
    plugin = counting_plugin(tmp_path, 3600)
    path = config(tmp_path / "kubeconfig", ca, f"https://127.0.0.1:{server.port}", exec_user(plugin))
    async with kopf_with(path) as get:
        await get("/api/v1/namespaces")
    assert authorizations(server) == ["Bearer t1", "Bearer t2"]


async def test_credentials_the_server_rejected_are_given_up_as_kopf_does(
        ca: CertificateAuthority, servers: list[ApiServer | ConnectProxy], tmp_path: Path) -> None:
    """Kopf tells a new login from the one that failed by comparing them; equal means give up,
    rather than every watcher logging in again at once, without pause."""
    server = await serve(servers, ca, tmp_path, check=lambda seen: 401)
    path = config(tmp_path / "kubeconfig", ca, f"https://127.0.0.1:{server.port}", {"token": "revoked"})
    started = time.monotonic()
    async with kopf_with(path) as get:
        with pytest.raises(credentials.LoginError):
            await get("/api/v1/namespaces")
    assert authorizations(server) == ["Bearer revoked"]
    assert time.monotonic() - started < 10


async def test_kopf_logs_in_again_when_the_client_certificate_files_are_renewed(
        ca: CertificateAuthority, servers: list[ApiServer | ConnectProxy], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    server = await ApiServer(ca, ["127.0.0.1"], require_client_cert=True).start(tmp_path)
    servers.append(server)
    first, second = ca.issue_client("first"), ca.issue_client("second")
    (tmp_path / "tls.crt").write_bytes(first.cert_pem)
    (tmp_path / "tls.key").write_bytes(first.key_pem)
    path = config(tmp_path / "kubeconfig", ca, f"https://127.0.0.1:{server.port}",
                  {"client-certificate": "tls.crt", "client-key": "tls.key"})
    async with kopf_with(path) as get:
        await get("/api/v1/namespaces")
        (tmp_path / "tls.crt").write_bytes(second.cert_pem)
        (tmp_path / "tls.key").write_bytes(second.key_pem)
        monkeypatch.setattr(tls, "TLS_RELOAD", 0.0)  # a minute later
        await get("/api/v1/namespaces")
        await get("/api/v1/namespaces")
    assert [s.client_cn for s in server.seen] == ["first", "second", "second"]


class Leading:
    """The elector as the write guard asks it: does this copy lead now, and where is its Lease?"""

    path = f"/apis/coordination.k8s.io/v1/namespaces/gpuslice-system/leases/{LEASE_NAME}"

    def __init__(self) -> None:
        self.now = False

    def leading(self) -> bool:
        return self.now


async def test_a_copy_that_does_not_lead_sends_no_write_on_kopfs_session_nor_its_clients(
        ca: CertificateAuthority, servers: list[ApiServer | ConnectProxy], tmp_path: Path) -> None:
    """The leader write guard is a middleware on every session the controller opens: Kopf's (its
    finalizers, annotations and Events) and its clients'. A write is refused before it is sent
    unless this copy leads; reads, and the Lease itself, always go."""
    server = await serve(servers, ca, tmp_path)
    base = f"https://127.0.0.1:{server.port}"
    path = config(tmp_path / "kubeconfig", ca, base, {"token": "t"})
    elector = Leading()
    guard = WriteGuard(cast(LeaderElector, elector))
    kopf_session = (await login.KopfLogin(path, middlewares=[guard]).session()).aiohttp_session
    transport = await connect(path, middlewares=[guard])
    lease = elector.path
    try:
        with pytest.raises(aiohttp.ClientConnectionError, match="does not hold the leader Lease"):
            async with kopf_session.patch(f"{base}/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/p", json={}):
                pass
        with pytest.raises(aiohttp.ClientConnectionError, match="does not hold the leader Lease"):
            await transport.request("POST", "/api/v1/namespaces/a/events", {}, {}, "application/json",
                                    "application/json", 5)
        assert server.seen == [], "a write was sent"
        async with kopf_session.get(f"{base}/api/v1/namespaces"):
            pass
        with pytest.raises(ApiError):  # the loopback server answers 404: it was sent
            await transport.request("PUT", lease, {}, {}, "application/json", "application/json", 5)
        assert [(s.method, s.path) for s in server.seen] == [("GET", "/api/v1/namespaces"), ("PUT", lease)]
        elector.now = True
        async with kopf_session.patch(f"{base}/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/p", json={}):
            pass
        assert server.seen[-1].method == "PATCH"
    finally:
        await kopf_session.close()
        await transport.close()
