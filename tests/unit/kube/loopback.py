"""Loopback servers for kubeconfig tests: an HTTPS API server that records what reached it, and an
HTTP CONNECT proxy that records what it was asked to tunnel. Both bind 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from gpuslice.devcluster.pki import CertificateAuthority, KeyPair


@dataclass
class Seen:
    method: str
    path: str  # with the query
    headers: list[tuple[str, str]]
    client_cn: str | None = None

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def one(self, name: str) -> str | None:
        found = self.all(name)
        return found[0] if found else None


Check = Callable[[Seen], int | None]  # an HTTP status to answer instead, or None to serve


@dataclass
class ApiServer:
    """Answers every GET of a list with its ``objects`` (none unless given), and anything else 404,
    as a Status; ``check`` may answer otherwise (401 for a token it does not like)."""

    ca: CertificateAuthority
    hosts: list[str]
    require_client_cert: bool = False
    check: Check | None = None
    seen: list[Seen] = field(default_factory=list)
    objects: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # a list's path: its items
    headers: dict[str, str] = field(default_factory=dict)  # sent with what ``check`` answers (a Location)
    port: int = 0
    _runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(item[0] for item in peer["subject"]) if peer else {}
        seen = Seen(request.method, request.path_qs, list(request.raw_headers and
                                                           [(k.decode(), v.decode()) for k, v in request.raw_headers]),
                    subject.get("commonName"))
        self.seen.append(seen)
        status = self.check(seen) if self.check is not None else None
        if status is not None:
            return web.json_response({"kind": "Status", "code": status, "reason": "Unauthorized",
                                      "message": "not you"}, status=status, headers=self.headers)
        if request.path.rstrip("/") == "/version":
            return web.json_response({"major": "1", "minor": "37", "gitVersion": "v1.37.2"})
        if request.path.endswith("s") and request.method == "GET":  # a list
            return web.json_response({"kind": "List", "apiVersion": "v1", "metadata": {},
                                      "items": self.objects.get(request.path, [])})
        return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound",
                                  "message": f"{request.path} not found"}, status=404)

    async def start(self, directory: Path) -> ApiServer:
        pair = self.ca.issue_server("apiserver", self.hosts)
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        (directory / "server.crt").write_bytes(pair.cert_pem)
        (directory / "server.key").write_bytes(pair.key_pem)
        tls.load_cert_chain(directory / "server.crt", directory / "server.key")
        if self.require_client_cert:
            tls.verify_mode = ssl.CERT_REQUIRED
            tls.load_verify_locations(cadata=self.ca.pair.cert_pem.decode())
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=tls)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def paths(self) -> list[str]:
        return [s.path for s in self.seen]


@dataclass
class ConnectProxy:
    """An HTTP proxy that only tunnels (CONNECT), to 127.0.0.1 whatever name it is given: a name
    in ``names`` stands for this machine, anything else is refused (502)."""

    names: set[str]
    asked: list[tuple[str, list[str]]] = field(default_factory=list)  # (host:port, the request's header lines)
    tls: ssl.SSLContext | None = None  # an https:// proxy
    port: int = 0
    _server: asyncio.Server | None = None
    _open: list[asyncio.StreamWriter] = field(default_factory=list)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
        method, target, _ = head[0].split(" ")
        self.asked.append((target, [line for line in head[1:] if line]))
        host, _, port = target.rpartition(":")
        if method != "CONNECT" or host not in self.names:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", int(port))
        self._open += [writer, upstream_writer]
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))

    async def start(self) -> ConnectProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        for writer in self._open:  # the tunnels end first, so that no handler is cancelled midway
            with contextlib.suppress(ConnectionError, OSError):
                writer.close()
        for writer in self._open:
            with contextlib.suppress(ConnectionError, OSError):
                await asyncio.wait_for(writer.wait_closed(), 2)
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"


class LoopbackResolver(aiohttp.abc.AbstractResolver):
    """Names that stand for this machine, for a client that connects without a proxy."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict[str, Any]]:
        if host not in self.names:
            raise OSError(f"{host}: not a loopback test name")
        return [{"hostname": host, "host": "127.0.0.1", "port": port, "family": socket.AF_INET, "proto": 0,
                 "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        return None


def kubeconfig(path: Path, *, contexts: dict[str, dict[str, Any]], clusters: dict[str, dict[str, Any]],
               users: dict[str, dict[str, Any]], current: str | None = None) -> Path:
    """A kubeconfig file with these entries (by name)."""
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": n, "cluster": c} for n, c in clusters.items()],
        "users": [{"name": n, "user": u} for n, u in users.items()],
        "contexts": [{"name": n, "context": c} for n, c in contexts.items()],
    }
    if current is not None:
        body["current-context"] = current
    path.write_text(yaml.safe_dump(body))
    return path


def ca_data(ca: CertificateAuthority) -> str:
    return base64.b64encode(ca.pair.cert_pem).decode()


def b64(pair: KeyPair) -> dict[str, str]:
    return {"client-certificate-data": base64.b64encode(pair.cert_pem).decode(),
            "client-key-data": base64.b64encode(pair.key_pem).decode()}


def write_plugin(path: Path, body: str) -> Path:
    """An exec credential plugin: a Python script with ``body`` after ``info`` (KUBERNETES_EXEC_INFO,
    parsed) and ``say(status)`` (print the ExecCredential) are defined."""
    import sys

    path.write_text(f"#!{sys.executable}\nimport json, os, sys\ninfo = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
                    "def say(status):\n    print(json.dumps({'apiVersion': info['apiVersion'],"
                    " 'kind': 'ExecCredential', 'status': status}))\n" + body)
    path.chmod(0o755)
    return path
