"""Each kubeconfig case against loopback servers: what the API server (and the proxy) really saw.

The server is an HTTPS server on 127.0.0.1 with a certificate from a test CA; the proxy an HTTP
CONNECT proxy on 127.0.0.1 that tunnels names it knows (``apiserver.test``) to this machine.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from gpuslice import __version__
from gpuslice.devcluster.pki import CertificateAuthority
from gpuslice.kube import auth, tls, useragent
from gpuslice.kube.client import KubeClient, Unauthorized
from gpuslice.kube.credentials import KubeconfigError
from gpuslice.kube.kubeconfig import resolve
from gpuslice.kube.transport import AiohttpTransport, ApiError, connect
from tests.unit.kube.loopback import (
    ApiServer,
    Check,
    ConnectProxy,
    LoopbackResolver,
    Seen,
    ca_data,
    kubeconfig,
    write_plugin,
)
from tests.unit.polling import eventually

NAME = "apiserver.test"  # stands for this machine: to the proxy, and to LoopbackResolver
Serve = Callable[..., Awaitable[ApiServer]]


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create()


@pytest.fixture
async def serve(ca: CertificateAuthority, tmp_path: Path) -> AsyncIterator[Serve]:
    started: list[ApiServer] = []

    async def start(hosts: tuple[str, ...] = ("127.0.0.1", NAME), *, require_client_cert: bool = False,
                    check: Check | None = None) -> ApiServer:
        directory = tmp_path / f"server-{len(started)}"
        directory.mkdir()
        server = await ApiServer(ca, list(hosts), require_client_cert, check).start(directory)
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop()


@pytest.fixture
async def proxy() -> AsyncIterator[ConnectProxy]:
    server = await ConnectProxy({NAME}).start()
    yield server
    await server.stop()


def config(tmp_path: Path, ca: CertificateAuthority, server: str, *, cluster: Mapping[str, Any] | None = None,
           user: Mapping[str, Any] | None = None, namespace: str | None = None) -> Path:
    context = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    return kubeconfig(tmp_path / "kubeconfig", current="ctx", contexts={"ctx": context},
                      clusters={"c": {"server": server, "certificate-authority-data": ca_data(ca), **(cluster or {})}},
                      users={"u": dict({"token": "secret"} if user is None else user)})


async def get(path: Path, *, environ: Mapping[str, str] | None = None,
              resolver: aiohttp.abc.AbstractResolver | None = None, times: int = 1) -> None:
    """GET a list through a transport for ``path``, as the client does."""
    transport = AiohttpTransport(resolve(path, environ={}), environ=environ or {}, resolver=resolver)
    try:
        for _ in range(times):
            await transport.request("GET", "/api/v1/namespaces", None, {}, "application/json", "application/json", 10)
    finally:
        await transport.close()


# --- TLS: a server certificate for another name, reached through tls-server-name -------------------

async def test_tls_server_name_checks_the_certificate_against_that_name(
        ca: CertificateAuthority, serve: Serve, tmp_path: Path) -> None:
    api = await serve(("kubernetes.internal.example",))  # not 127.0.0.1: what an SNI-routed front sees
    url = f"https://127.0.0.1:{api.port}"
    with pytest.raises(aiohttp.ClientConnectorCertificateError, match=r"127\.0\.0\.1"):
        await get(config(tmp_path, ca, url))
    assert api.seen == []
    await get(config(tmp_path, ca, url, cluster={"tls-server-name": "kubernetes.internal.example"}))
    assert api.paths == ["/api/v1/namespaces"]
    with pytest.raises(aiohttp.ClientConnectorCertificateError):  # a wrong name still fails: the name is checked
        await get(config(tmp_path, ca, url, cluster={"tls-server-name": "other.example"}))


async def test_client_certificate_reaches_a_server_that_requires_one(
        ca: CertificateAuthority, serve: Serve, tmp_path: Path) -> None:
    api = await serve(require_client_cert=True)
    someone = ca.issue_client("someone", ("group",))
    await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}", user={
        "client-certificate-data": base64.b64encode(someone.cert_pem).decode(),
        "client-key-data": base64.b64encode(someone.key_pem).decode()}))
    assert [s.client_cn for s in api.seen] == ["someone"]


async def test_renewed_certificate_files_are_read_again(ca: CertificateAuthority, serve: Serve, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """As client-go: a client certificate and key given as files, and a CA file (a pod's
    ca.crt after the cluster CA rotated), are read again; a renewal needs no restart."""
    api = await serve(require_client_cert=True)
    (tmp_path / "ca.crt").write_bytes(CertificateAuthority.create().pair.cert_pem)  # not the server's yet
    for name, pair in (("tls", ca.issue_client("first")),):
        (tmp_path / f"{name}.crt").write_bytes(pair.cert_pem)
        (tmp_path / f"{name}.key").write_bytes(pair.key_pem)
    path = kubeconfig(tmp_path / "kubeconfig", current="ctx", contexts={"ctx": {"cluster": "c", "user": "u"}},
                      clusters={"c": {"server": f"https://127.0.0.1:{api.port}", "certificate-authority": "ca.crt"}},
                      users={"u": {"client-certificate": "tls.crt", "client-key": "tls.key"}})
    transport = AiohttpTransport(resolve(path, environ={}), environ={})
    try:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await transport.request("GET", "/api/v1/nodes", None, {}, "application/json", "application/json", 10)
        monkeypatch.setattr(tls, "TLS_RELOAD", 0.0)
        (tmp_path / "ca.crt").write_bytes(ca.pair.cert_pem)
        await transport.request("GET", "/api/v1/nodes", None, {}, "application/json", "application/json", 10)
        renewed = ca.issue_client("second")
        (tmp_path / "tls.crt").write_bytes(renewed.cert_pem)
        (tmp_path / "tls.key").write_bytes(renewed.key_pem)
        await transport.request("GET", "/api/v1/nodes", None, {}, "application/json", "application/json", 10)
        (tmp_path / "tls.key").write_text("half-written")  # unusable: the last good pair serves on
        await transport.request("GET", "/api/v1/nodes", None, {}, "application/json", "application/json", 10)
    finally:
        await transport.close()
    assert [s.client_cn for s in api.seen] == ["first", "second", "second"]


# --- proxies: proxy-url, HTTPS_PROXY and NO_PROXY, as client-go honours them ------------------------

async def test_proxy_url_tunnels_every_request(ca: CertificateAuthority, serve: Serve, proxy: ConnectProxy,
                                               tmp_path: Path) -> None:
    api = await serve()
    path = config(tmp_path, ca, f"https://{NAME}:{api.port}", cluster={"proxy-url": proxy.url})
    await get(path, environ={"NO_PROXY": "*"})  # the kubeconfig's proxy is not the environment's to waive
    assert [target for target, _ in proxy.asked] == [f"{NAME}:{api.port}"]
    assert api.paths == ["/api/v1/namespaces"]


async def test_through_a_proxy_the_tunnel_carries_no_credentials_and_tls_is_the_servers(
        ca: CertificateAuthority, serve: Serve, proxy: ConnectProxy, tmp_path: Path) -> None:
    """The CONNECT asks the proxy for the server, with nothing of the user's (the Authorization and
    Impersonate-* headers go inside the TLS tunnel only); tls-server-name is checked end to end."""
    api = await serve(("kubernetes.internal.example",))
    await get(config(tmp_path, ca, f"https://{NAME}:{api.port}", user={"token": "admin-token", "as": "jane"},
                     cluster={"proxy-url": proxy.url, "tls-server-name": "kubernetes.internal.example"}))
    (target, lines), = proxy.asked
    assert target == f"{NAME}:{api.port}"
    assert not [line for line in lines if line.lower().startswith(("authorization", "impersonate"))]
    (seen,) = api.seen
    assert (seen.one("Authorization"), seen.one("Impersonate-User")) == ("Bearer admin-token", "jane")


async def test_an_https_proxy(ca: CertificateAuthority, serve: Serve, tmp_path: Path) -> None:
    """An https:// proxy-url: TLS to the proxy (trusting the kubeconfig's CA, as Go's transport
    does), then the server's TLS inside the tunnel."""
    pair = ca.issue_server("proxy", ["127.0.0.1"])
    (tmp_path / "proxy.crt").write_bytes(pair.cert_pem)
    (tmp_path / "proxy.key").write_bytes(pair.key_pem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "proxy.crt", tmp_path / "proxy.key")
    secure = await ConnectProxy({NAME}, tls=context).start()
    try:
        api = await serve()
        await get(config(tmp_path, ca, f"https://{NAME}:{api.port}", cluster={"proxy-url": secure.url}))
    finally:
        await secure.stop()
    assert secure.url.startswith("https://")
    assert [target for target, _ in secure.asked] == [f"{NAME}:{api.port}"]
    assert api.paths == ["/api/v1/namespaces"]


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "https_proxy"])
async def test_https_proxy_from_the_environment(ca: CertificateAuthority, serve: Serve, proxy: ConnectProxy,
                                                tmp_path: Path, variable: str) -> None:
    api = await serve()
    path = config(tmp_path, ca, f"https://{NAME}:{api.port}")
    await get(path, environ={variable: f"127.0.0.1:{proxy.port}", "HTTP_PROXY": "http://127.0.0.1:9"})
    assert [target for target, _ in proxy.asked] == [f"{NAME}:{api.port}"]
    assert api.paths == ["/api/v1/namespaces"]


async def test_proxy_credentials_go_to_the_proxy(ca: CertificateAuthority, serve: Serve, proxy: ConnectProxy,
                                                 tmp_path: Path) -> None:
    api = await serve()
    await get(config(tmp_path, ca, f"https://{NAME}:{api.port}",
                     cluster={"proxy-url": f"http://jane:pw@127.0.0.1:{proxy.port}"}))
    (_, lines), = proxy.asked
    assert f"Proxy-Authorization: Basic {base64.b64encode(b'jane:pw').decode()}" in lines


@pytest.mark.parametrize("no_proxy", [NAME, ".test", "*", f"other.example, {NAME}", "test"])
async def test_no_proxy_sends_the_server_direct(ca: CertificateAuthority, serve: Serve, proxy: ConnectProxy,
                                                tmp_path: Path, no_proxy: str) -> None:
    api = await serve()
    path = config(tmp_path, ca, f"https://{NAME}:{api.port}")
    resolver = LoopbackResolver({NAME})
    await get(path, environ={"HTTPS_PROXY": proxy.url, "NO_PROXY": no_proxy}, resolver=resolver)
    assert proxy.asked == []
    assert api.paths == ["/api/v1/namespaces"]
    await get(path, environ={"HTTPS_PROXY": proxy.url, "NO_PROXY": "other.example,10.0.0.0/8"}, resolver=resolver)
    assert len(proxy.asked) == 1  # the same server, not exempted: through the proxy


async def test_loopback_is_never_proxied_from_the_environment(ca: CertificateAuthority, serve: Serve,
                                                              proxy: ConnectProxy, tmp_path: Path) -> None:
    api = await serve()
    await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}"), environ={"HTTPS_PROXY": proxy.url})
    assert proxy.asked == []
    assert api.paths == ["/api/v1/namespaces"]


# --- who the requests are from ------------------------------------------------------------------------

async def test_impersonation_headers_reach_the_server(ca: CertificateAuthority, serve: Serve,
                                                      tmp_path: Path) -> None:
    api = await serve()
    await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}", user={
        "token": "admin-token", "as": "jane", "as-uid": "u-42", "as-groups": ["dev", "system:authenticated"],
        "as-user-extra": {"scopes": ["view", "edit"], "acme.com/project id": ["p1"]}}))
    (seen,) = api.seen
    assert seen.one("Authorization") == "Bearer admin-token"
    assert seen.one("Impersonate-User") == "jane"
    assert seen.one("Impersonate-Uid") == "u-42"
    assert seen.all("Impersonate-Group") == ["dev", "system:authenticated"]
    assert seen.all("Impersonate-Extra-scopes") == ["view", "edit"]
    assert seen.all("Impersonate-Extra-acme.com%2Fproject%20id") == ["p1"]  # client-go's escaping


async def test_a_redirect_elsewhere_gets_no_credentials(ca: CertificateAuthority, serve: Serve,
                                                        tmp_path: Path) -> None:
    """The token and the Impersonate-* headers are for the kubeconfig's server only: a redirect to
    another origin (a front that moved, a hostile one) gets neither."""
    elsewhere = await serve()
    api = await serve(check=lambda seen: 307 if seen.path.startswith("/api/v1/namespaces") else None)
    api.headers = {"Location": f"https://127.0.0.1:{elsewhere.port}/api/v1/nodes"}
    await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}", user={"token": "admin-token", "as": "jane",
                                                                        "as-groups": ["dev"]}))
    (first,) = api.seen
    assert (first.one("Authorization"), first.one("Impersonate-User")) == ("Bearer admin-token", "jane")
    (moved,) = elsewhere.seen
    assert moved.path == "/api/v1/nodes"
    assert [k for k, _ in moved.headers if k.lower() == "authorization" or k.lower().startswith("impersonate-")] == []


async def test_no_impersonation_no_headers(ca: CertificateAuthority, serve: Serve, tmp_path: Path) -> None:
    api = await serve()
    await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}"))
    assert not [k for k, _ in api.seen[0].headers if k.lower().startswith("impersonate-")]


@pytest.mark.parametrize(("user", "header"), [
    ({"username": "jane", "password": "pw"}, f"Basic {base64.b64encode(b'jane:pw').decode()}"),
    ({"token": "old", "tokenFile": "TOKEN_FILE"}, "Bearer from-file"),
    ({}, None),
])
async def test_the_authorization_header(ca: CertificateAuthority, serve: Serve, tmp_path: Path,
                                        user: dict[str, str], header: str | None) -> None:
    api = await serve()
    (tmp_path / "token").write_text("from-file\n")
    user = {k: str(tmp_path / "token") if v == "TOKEN_FILE" else v for k, v in user.items()}
    await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}", user=user))
    assert api.seen[0].one("Authorization") == header


async def test_a_token_file_is_read_again_a_minute_later(ca: CertificateAuthority, serve: Serve, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubelet rotates a bound ServiceAccount token in place; client-go reads the file every
    minute, not only after a 401."""
    api = await serve()
    (tmp_path / "token").write_text("first\n")
    clock = [1000.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: clock[0])
    transport = AiohttpTransport(resolve(config(tmp_path, ca, f"https://127.0.0.1:{api.port}",
                                                user={"tokenFile": str(tmp_path / "token")}), environ={}), environ={})
    try:
        for seconds, token in ((0, None), (30, "rotated"), (31, None), (1, None)):
            clock[0] += seconds
            if token:
                (tmp_path / "token").write_text(token + "\n")
            await transport.request("GET", "/api/v1/nodes", None, {}, "application/json", "application/json", 10)
    finally:
        await transport.close()
    assert [s.one("Authorization") for s in api.seen] == ["Bearer first", "Bearer first", "Bearer rotated",
                                                          "Bearer rotated"]


async def test_user_agent_names_the_component(ca: CertificateAuthority, serve: Serve, tmp_path: Path) -> None:
    api = await serve()
    path = config(tmp_path, ca, f"https://127.0.0.1:{api.port}")
    try:
        for component in ("gpuslice-controller", "gpuslice-agent", "gpuslice-cli"):
            useragent.set_component(component)
            await get(path)
    finally:
        useragent.set_component("gpuslice")
    agents = [s.one("User-Agent") or "" for s in api.seen]
    for agent, component in zip(agents, ("gpuslice-controller", "gpuslice-agent", "gpuslice-cli"), strict=True):
        assert re.fullmatch(rf"{component}/{re.escape(__version__)} \((linux|darwin|windows)/[a-z0-9_]+\)", agent)


async def test_disable_compression(ca: CertificateAuthority, serve: Serve, tmp_path: Path) -> None:
    api = await serve()
    await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}"))
    await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}", cluster={"disable-compression": True}))
    assert "gzip" in (api.seen[0].one("Accept-Encoding") or "")
    assert api.seen[1].one("Accept-Encoding") == "identity"


# --- exec credential plugins, run as client-go runs them -----------------------------------------------

def exec_user(plugin: Path, **extra: Any) -> dict[str, Any]:
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
                     "interactiveMode": "IfAvailable", **extra}}


async def test_exec_plugin_token_with_the_cluster_it_asked_for(
        ca: CertificateAuthority, serve: Serve, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    api = await serve()
    record = tmp_path / "info.json"
    plugin = write_plugin(tmp_path / "plugin", f"open({str(record)!r}, 'w').write(json.dumps(info))\n"
                          "print('Open https://login.example/device and enter ABCD', file=sys.stderr)\n"
                          "say({'token': 'from-plugin', 'expirationTimestamp': '2999-01-01T00:00:00Z'})\n")
    path = config(tmp_path, ca, f"https://127.0.0.1:{api.port}", cluster={"tls-server-name": "127.0.0.1"},
                  user=exec_user(plugin, provideClusterInfo=True, env=[{"name": "AWS_PROFILE", "value": "dev"}]))
    await get(path, times=2)
    assert [s.one("Authorization") for s in api.seen] == ["Bearer from-plugin"] * 2
    info = json.loads(record.read_text())
    assert info["apiVersion"] == "client.authentication.k8s.io/v1"
    assert info["spec"]["interactive"] is False  # pytest's stdin is no terminal
    assert info["spec"]["cluster"] == {"server": f"https://127.0.0.1:{api.port}", "tls-server-name": "127.0.0.1",
                                       "certificate-authority-data": ca_data(ca)}
    assert "Open https://login.example/device and enter ABCD" in capfd.readouterr().err  # a prompt is seen


async def test_exec_plugin_runs_again_when_its_token_expires_or_is_refused(
        ca: CertificateAuthority, serve: Serve, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    calls.write_text("0")
    plugin = write_plugin(tmp_path / "plugin", f"n = int(open({str(calls)!r}).read()) + 1\n"
                          f"open({str(calls)!r}, 'w').write(str(n))\n"
                          "say({'token': f't{n}', 'expirationTimestamp': sys.argv[1]})\n")

    def refuse_first(seen: Seen) -> int | None:
        return 401 if seen.one("Authorization") == "Bearer t1" else None

    api = await serve(check=refuse_first)
    soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 5))  # inside the refresh margin
    await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}",
                     user=exec_user(plugin, args=["2999-01-01T00:00:00Z"])))
    assert [s.one("Authorization") for s in api.seen] == ["Bearer t1", "Bearer t2"]  # 401, then again
    api.seen.clear()
    await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}", user=exec_user(plugin, args=[soon])), times=2)
    assert [s.one("Authorization") for s in api.seen] == ["Bearer t3", "Bearer t4"]  # expiring: fetched anew


def counting_plugin(directory: Path, token: str = "t{n}") -> Path:
    """An exec plugin that counts its runs in ``calls``; its token is ``token`` with n the run."""
    calls = directory / "calls"
    calls.write_text("0")
    return write_plugin(directory / "plugin", f"n = int(open({str(calls)!r}).read()) + 1\n"
                        f"open({str(calls)!r}, 'w').write(str(n))\n"
                        f"say({{'token': f{token!r}}})\n")


async def test_concurrent_401s_run_the_plugin_once(ca: CertificateAuthority, serve: Serve, tmp_path: Path) -> None:
    """client-go's maybeRefreshCreds: a refused credential is fetched anew only if it is still the
    current one; the requests refused with it at the same time retry with the one already fetched."""
    plugin = counting_plugin(tmp_path)
    api = await serve(check=lambda seen: 401 if seen.one("Authorization") == "Bearer t1" else None)
    transport = AiohttpTransport(resolve(config(tmp_path, ca, f"https://127.0.0.1:{api.port}",
                                                user=exec_user(plugin)), environ={}), environ={})
    try:
        await asyncio.gather(*(transport.request("GET", "/api/v1/namespaces", None, {}, "application/json",
                                                 "application/json", 10) for _ in range(4)))
    finally:
        await transport.close()
    assert (tmp_path / "calls").read_text() == "2"  # once, then once after the 401s (not four times)
    assert sorted(s.one("Authorization") or "" for s in api.seen) == ["Bearer t1"] * 4 + ["Bearer t2"] * 4


async def test_a_watch_refused_with_an_expired_token_opens_again_with_a_new_one(
        ca: CertificateAuthority, serve: Serve, tmp_path: Path) -> None:
    plugin = counting_plugin(tmp_path)
    api = await serve(check=lambda seen: 401 if seen.one("Authorization") == "Bearer t1" else None)
    transport = AiohttpTransport(resolve(config(tmp_path, ca, f"https://127.0.0.1:{api.port}",
                                                user=exec_user(plugin)), environ={}), environ={})
    try:
        async with transport.stream("/api/v1/namespaces", {"watch": True}, 10, 10) as lines:
            assert b"List" in b"".join([line async for line in lines])
    finally:
        await transport.close()
    assert [s.one("Authorization") for s in api.seen] == ["Bearer t1", "Bearer t2"]


async def test_a_plugin_that_gives_the_refused_token_again_is_not_retried(
        ca: CertificateAuthority, serve: Serve, tmp_path: Path) -> None:
    plugin = counting_plugin(tmp_path, token="same")
    api = await serve(check=lambda seen: 401)
    with pytest.raises(ApiError, match="401"):
        await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}", user=exec_user(plugin)))
    assert len(api.seen) == 1  # the same token would be refused again
    assert (tmp_path / "calls").read_text() == "2"


async def test_exec_plugin_client_certificate(ca: CertificateAuthority, serve: Serve, tmp_path: Path) -> None:
    api = await serve(require_client_cert=True)
    pair = ca.issue_client("from-plugin")
    plugin = write_plugin(tmp_path / "plugin", "say({'clientCertificateData': os.environ['CERT'],"
                                               " 'clientKeyData': os.environ['KEY']})\n")
    await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}", user=exec_user(plugin, env=[
        {"name": "CERT", "value": pair.cert_pem.decode()}, {"name": "KEY", "value": pair.key_pem.decode()}])))
    assert [s.client_cn for s in api.seen] == ["from-plugin"]


async def test_a_renewed_plugin_certificate_closes_the_old_session_once_its_requests_end(
        ca: CertificateAuthority, serve: Serve, tmp_path: Path) -> None:
    """client-go closes the connections of a rotated certificate; the old session is closed as soon
    as nothing runs on it, not kept until the transport closes."""
    api = await serve(require_client_cert=True)
    pairs = [ca.issue_client(f"cert-{n}") for n in (1, 2, 3)]
    calls = tmp_path / "calls"
    calls.write_text("0")
    plugin = write_plugin(tmp_path / "plugin", f"n = int(open({str(calls)!r}).read()) + 1\n"
                          f"open({str(calls)!r}, 'w').write(str(n))\n"
                          "say({'clientCertificateData': os.environ[f'CERT{n}'], 'clientKeyData': os.environ[f'KEY{n}'],"
                          " 'expirationTimestamp': '2000-01-01T00:00:00Z'})\n")  # expired: fetched for each request
    env = [item for n, pair in enumerate(pairs, 1) for item in (
        {"name": f"CERT{n}", "value": pair.cert_pem.decode()}, {"name": f"KEY{n}", "value": pair.key_pem.decode()})]
    transport = AiohttpTransport(resolve(config(tmp_path, ca, f"https://127.0.0.1:{api.port}",
                                                user=exec_user(plugin, env=env)), environ={}), environ={})
    try:
        async with transport.stream("/api/v1/namespaces", {}, 10, 10):
            first = transport._session
            await transport.request("GET", "/api/v1/nodes", None, {}, "application/json", "application/json", 10)
            second = transport._session
            assert second is not first
            assert not first.closed  # a stream (a watch) still runs on it
        assert first.closed
        await transport.request("GET", "/api/v1/nodes", None, {}, "application/json", "application/json", 10)
        assert second.closed  # nothing ran on it any more: closed at once
    finally:
        await transport.close()
    assert [s.client_cn for s in api.seen] == ["cert-1", "cert-2", "cert-3"]


@pytest.mark.parametrize(("body", "words"), [
    ("sys.exit(3)", r"failed \(exit status 3\)"),
    ("print('not json')", "printed no JSON ExecCredential"),
    ("print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1', 'status': {'token': 't'}}))",
     "answered in 'client.authentication.k8s.io/v1beta1'"),
    ("say({})", "returned no token and no certificate"),
    ("print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'Config', 'status': {'token': 't'}}))",
     "answered with kind 'Config', not ExecCredential"),
    # no offset: local time or UTC? Go's RFC 3339 parser refuses it, and so does gpuslice
    ("say({'token': 't', 'expirationTimestamp': '2999-01-01T00:00:00'})",
     "expirationTimestamp '2999-01-01T00:00:00' is not RFC 3339 with a time zone"),
])
async def test_exec_plugin_failures_are_named(ca: CertificateAuthority, tmp_path: Path, body: str,
                                              words: str) -> None:
    plugin = write_plugin(tmp_path / "plugin", body + "\n")
    with pytest.raises(KubeconfigError, match=f"exec plugin {re.escape(str(plugin))} of user 'u' in .* {words}"):
        await connect(config(tmp_path, ca, "https://127.0.0.1:1", user=exec_user(plugin)), pod_first=False)


def hanging_plugin(directory: Path) -> tuple[Path, Path]:
    """A plugin that writes its pid and then waits for ever (a login nobody answers)."""
    pid = directory / "pid"
    return write_plugin(directory / "plugin", f"open({str(pid)!r}, 'w').write(str(os.getpid()))\n"
                        "import time\ntime.sleep(3600)\n"), pid


def gone(pid_file: Path) -> bool:
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    os.kill(pid, signal.SIGKILL)  # a failing run of this test leaves nothing behind
    return False


async def test_a_plugin_that_never_answers_is_stopped_and_named(ca: CertificateAuthority, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "EXEC_TIMEOUT", 0.5)
    plugin, pid = hanging_plugin(tmp_path)
    with pytest.raises(KubeconfigError, match=rf"exec plugin {re.escape(str(plugin))} of user 'u' in .* gave no"
                                              r" credential within 0\.5 s and was stopped"):
        await asyncio.wait_for(connect(config(tmp_path, ca, "https://127.0.0.1:1", user=exec_user(plugin)),
                                       pod_first=False), 10)
    assert gone(pid)


async def test_a_cancelled_request_stops_its_plugin(ca: CertificateAuthority, tmp_path: Path) -> None:
    plugin, pid = hanging_plugin(tmp_path)
    task = asyncio.create_task(connect(config(tmp_path, ca, "https://127.0.0.1:1", user=exec_user(plugin)),
                                       pod_first=False))
    await eventually(lambda: pid.exists() and pid.read_text(), what="the plugin to start")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gone(pid)


@pytest.mark.parametrize("user", [
    {"token": "static"},
    {"tokenFile": "TOKEN_FILE"},
    {"username": "jane", "password": "pw"},
    {"client-certificate-data": "CERT", "client-key-data": "KEY"},
])
async def test_a_kubeconfig_credential_wins_over_an_exec_plugin_which_is_not_run(
        ca: CertificateAuthority, serve: Serve, tmp_path: Path, user: dict[str, str]) -> None:
    """client-go's exec authenticator steps aside when the user has a token, a token file, basic
    credentials or a client certificate (exec.go UpdateTransportConfig); kubectl does not refuse it."""
    api = await serve(require_client_cert="CERT" in user.values())
    (tmp_path / "token").write_text("static\n")
    pair = ca.issue_client("from-kubeconfig")
    values = {"TOKEN_FILE": str(tmp_path / "token"), "CERT": base64.b64encode(pair.cert_pem).decode(),
              "KEY": base64.b64encode(pair.key_pem).decode()}
    plugin = counting_plugin(tmp_path)
    await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}",
                     user={**{k: values.get(v, v) for k, v in user.items()}, **exec_user(plugin)}))
    assert (tmp_path / "calls").read_text() == "0"  # never run
    (seen,) = api.seen
    assert seen.one("Authorization") != "Bearer t1"
    if "username" in user:
        assert seen.one("Authorization") == f"Basic {base64.b64encode(b'jane:pw').decode()}"
    elif "CERT" in user.values():
        assert (seen.client_cn, seen.one("Authorization")) == ("from-kubeconfig", None)
    else:
        assert seen.one("Authorization") == "Bearer static"


async def test_a_token_wins_over_the_oidc_auth_provider(ca: CertificateAuthority, serve: Serve,
                                                        tmp_path: Path) -> None:
    api = await serve()
    await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}", user={"token": "static", "auth-provider": {
        "name": "oidc", "config": {"id-token": "not-a-jwt", "client-id": "k8s", "idp-issuer-url": "https://idp"}}}))
    assert api.seen[0].one("Authorization") == "Bearer static"


async def test_exec_plugin_not_installed_shows_its_install_hint(ca: CertificateAuthority, tmp_path: Path) -> None:
    path = config(tmp_path, ca, "https://127.0.0.1:1", user={"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "gpuslice-test-no-such-plugin",
        "installHint": "Install it with: brew install no-such-plugin"}})
    with pytest.raises(KubeconfigError, match=r"could not be run .*\n\nInstall it with: brew install no-such-plugin"):
        await connect(path, pod_first=False)


# --- the oidc auth-provider, through kubernetes_asyncio ----------------------------------------------------

def _jwt(claims: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}.sig"


async def test_oidc_auth_provider_token(ca: CertificateAuthority, serve: Serve, tmp_path: Path) -> None:
    api = await serve()
    token = _jwt({"sub": "jane", "exp": int(time.time()) + 3600})
    await get(config(tmp_path, ca, f"https://127.0.0.1:{api.port}", user={"auth-provider": {
        "name": "oidc", "config": {"id-token": token, "client-id": "k8s", "idp-issuer-url": "https://idp.example"}}}))
    assert api.seen[0].one("Authorization") == f"Bearer {token}"


async def test_a_refreshed_oidc_token_is_written_back_to_the_file_that_holds_the_user(
        ca: CertificateAuthority, serve: Serve, tmp_path: Path) -> None:
    """As client-go's persister: the user entry of the file that defines it, and nothing else of
    that file or the other files, changes; the refresh token the provider rotated is kept."""
    fresh = _jwt({"sub": "jane", "exp": int(time.time()) + 3600})
    asked: list[str] = []

    async def discovery(request: web.Request) -> web.Response:
        return web.json_response({"token_endpoint": f"http://127.0.0.1:{request.url.port}/token"})

    async def token(request: web.Request) -> web.Response:
        asked.append((await request.post())["refresh_token"])  # type: ignore[arg-type]
        return web.json_response({"id_token": fresh, "refresh_token": "r2"})

    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", discovery)
    app.router.add_post("/token", token)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    issuer = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        api = await serve()
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        (tmp_path / "b" / "ca.crt").write_bytes(ca.pair.cert_pem)
        first = kubeconfig(tmp_path / "a" / "config", current="ctx", contexts={"ctx": {"cluster": "c", "user": "jane"}},
                           clusters={}, users={})
        provider = {"name": "oidc", "config": {
            "id-token": _jwt({"sub": "jane", "exp": int(time.time()) - 60}), "refresh-token": "r1",
            "client-id": "k8s", "client-secret": "s", "idp-issuer-url": issuer}}
        second = kubeconfig(tmp_path / "b" / "config", contexts={},
                            clusters={"c": {"server": f"https://127.0.0.1:{api.port}", "certificate-authority": "ca.crt"}},
                            users={"jane": {"auth-provider": provider}, "other": {"token": "t"}})
        second.chmod(0o600)
        before_first = first.read_text()
        transport = AiohttpTransport(resolve(environ={"KUBECONFIG": f"{first}:{second}"}), environ={})
        try:
            await transport.request("GET", "/api/v1/namespaces", None, {}, "application/json", "application/json", 10)
        finally:
            await transport.close()
    finally:
        await runner.cleanup()
    assert asked == ["r1"]
    assert api.seen[0].one("Authorization") == f"Bearer {fresh}"
    written = yaml.safe_load(second.read_text())
    users = {u["name"]: u["user"] for u in written["users"]}
    assert users["jane"]["auth-provider"]["config"] == {**provider["config"], "id-token": fresh, "refresh-token": "r2"}
    assert users["other"] == {"token": "t"}
    assert written["clusters"][0]["cluster"]["certificate-authority"] == "ca.crt"  # still relative
    assert first.read_text() == before_first
    assert second.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["ca.crt", "config"]  # no lock left behind


# --- through KubeClient: the namespace, and a 401 as a typed error --------------------------------------------

async def test_the_client_carries_the_contexts_namespace(ca: CertificateAuthority, serve: Serve,
                                                         tmp_path: Path) -> None:
    api = await serve(check=lambda seen: 401)
    path = config(tmp_path, ca, f"https://127.0.0.1:{api.port}", namespace="team-a")
    async with await KubeClient.from_kubeconfig(path, pod_first=False) as kube:
        assert kube.namespace == "team-a"
        with pytest.raises(Unauthorized):
            await kube.get("/api/v1/namespaces/team-a/pods/x")
    assert len(api.seen) == 1  # a fixed token is not sent twice after a 401


def test_the_default_tls_is_verified() -> None:
    from gpuslice.kube.credentials import Credentials
    from gpuslice.kube.tls import ssl_context

    context = ssl_context(Credentials(server="https://x"))
    assert (context.verify_mode, context.check_hostname) == (ssl.CERT_REQUIRED, True)
