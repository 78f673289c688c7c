"""Only the API server may call the webhook: with --client-ca-file, over real TLS on loopback, a
caller without a certificate, with one of another CA (whatever its name), or with one of the CA
but another name (the admin's, a kubelet's: a cluster's own CA signs them all) never has its
review read; the API server's is. A CA taken out of the file is refused from then on."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gpuslice.devcluster.pki import CertificateAuthority, KeyPair
from gpuslice.webhook.callers import Callers, ClientCaError
from gpuslice.webhook.metrics import CALLERS_REFUSED
from gpuslice.webhook.review import ALLOW
from gpuslice.webhook.run import application

NAME = "gpuslice-webhook-client"
REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "r-1", "operation": "UPDATE", "namespace": "team-b", "object": {}}}


@dataclass
class Served:
    url: str
    server_ca: KeyPair
    cluster_ca: CertificateAuthority  # the client CA: it signs the admin's and kubelets' certificates too
    reviewed: list[dict[str, Any]]
    callers: Callers
    context: ssl.SSLContext

    async def call(self, client: KeyPair | None, tmp: Path) -> int | str:
        """The HTTP status the webhook answered with, or the error a refused handshake ended in."""
        context = ssl.create_default_context(cadata=self.server_ca.cert_pem.decode())
        if client is not None:
            cert, key = client.write(tmp, f"client-{id(client)}")
            context.load_cert_chain(cert, key)
        try:
            async with aiohttp.ClientSession() as session, session.post(self.url, json=REVIEW, ssl=context) as answer:
                await answer.read()
                return answer.status
        except (aiohttp.ClientError, ssl.SSLError, ConnectionError) as error:
            return type(error).__name__


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    cluster_ca, serving_ca = CertificateAuthority.create("cluster-ca"), CertificateAuthority.create("webhook-ca")
    bundle = tmp_path / "client-ca.crt"
    bundle.write_bytes(cluster_ca.pair.cert_pem)
    cert, key = serving_ca.issue_server("webhook", ["127.0.0.1"]).write(tmp_path, "serving")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    callers = Callers(bundle, frozenset({NAME}))
    callers.configure(context)
    reviewed: list[dict[str, Any]] = []

    async def review(body: dict[str, Any]) -> Any:
        reviewed.append(body)
        return ALLOW

    runner = web.AppRunner(application(SimpleNamespace(review=review), callers))  # type: ignore[arg-type]
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Served(f"https://127.0.0.1:{port}/validate/maxmemory", serving_ca.pair, cluster_ca, reviewed, callers,
                     context)
    finally:
        await runner.cleanup()


async def test_only_the_api_servers_certificate_gets_a_review_read(served: Served, tmp_path: Path) -> None:
    cluster_ca = served.cluster_ca
    elsewhere = CertificateAuthority.create("cluster-ca")  # the same name, another key
    before = CALLERS_REFUSED._value.get()
    tried = {
        "no certificate": await served.call(None, tmp_path),
        "the right name from another CA": await served.call(elsewhere.issue_client(NAME), tmp_path),
        "the cluster admin's": await served.call(cluster_ca.issue_client("admin", ("system:masters",)), tmp_path),
        "a kubelet's": await served.call(cluster_ca.issue_client("system:node:n1", ("system:nodes",)), tmp_path),
    }
    assert tried["no certificate"] != 200
    assert tried["the right name from another CA"] != 200
    assert tried["the cluster admin's"] == 403
    assert tried["a kubelet's"] == 403
    assert served.reviewed == [], tried
    assert CALLERS_REFUSED._value.get() - before == 2, "those past the handshake are counted"
    assert await served.call(cluster_ca.issue_client(NAME), tmp_path) == 200
    assert len(served.reviewed) == 1


async def test_a_ca_taken_out_of_the_file_is_refused_from_then_on(served: Served, tmp_path: Path) -> None:
    cluster_ca = served.cluster_ca
    rotated = CertificateAuthority.create("cluster-ca-2")
    assert served.callers.ca_file is not None
    served.callers.ca_file.write_bytes(cluster_ca.pair.cert_pem + rotated.pair.cert_pem)
    assert served.callers.reload(served.context)
    assert await served.call(rotated.issue_client(NAME), tmp_path) == 200, "a CA added is trusted at once"
    served.callers.ca_file.write_bytes(rotated.pair.cert_pem)
    assert served.callers.reload(served.context)
    assert await served.call(cluster_ca.issue_client(NAME), tmp_path) == 403, "OpenSSL still knows it; we do not"
    served.callers.ca_file.write_text("")
    assert not served.callers.reload(served.context), "an unreadable bundle keeps the one read before"
    assert await served.call(rotated.issue_client(NAME), tmp_path) == 200


def test_a_ca_file_that_is_not_there_or_holds_no_certificate_stops_the_webhook(tmp_path: Path) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with pytest.raises(ClientCaError, match="cannot be read"):
        Callers(tmp_path / "missing.crt").configure(context)
    (tmp_path / "empty.crt").write_text("not a certificate")
    with pytest.raises(ClientCaError, match="holds no PEM certificate"):
        Callers(tmp_path / "empty.crt").configure(context)


def test_without_a_ca_file_anyone_may_call() -> None:
    callers = Callers(None)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    callers.configure(context)
    assert context.verify_mode == ssl.CERT_NONE
    assert callers.refusal([]) is None
