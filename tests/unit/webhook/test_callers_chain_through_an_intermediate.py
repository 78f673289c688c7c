"""Hostile review, December (third round), W's fix and a legitimate caller: an API server whose client
certificate is issued by an intermediate CA of the one in --client-ca-file.

webhook/callers.py: the handshake refuses a caller "without one that chains to those CAs"; each request
is then checked again, but by ``verify_directly_issued_by``: only a certificate a CA of the file signed
itself passes. A PKI with an intermediate (the file holds the root, the API server presents its
certificate and the intermediate, as TLS clients do) passes the handshake and is then refused with 403
on every review, so every maxMemory tenant's allocation is refused (failurePolicy Fail). Nothing in
docs/install.md says the CA must sign the certificate directly.

A promise test: it fails while such a caller is refused.
"""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuslice.devcluster.pki import CertificateAuthority
from gpuslice.webhook.callers import Callers
from gpuslice.webhook.review import ALLOW
from gpuslice.webhook.run import application

NAME = "gpuslice-webhook-client"
REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "r-1", "operation": "UPDATE", "namespace": "team-b", "object": {}}}


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _cert(subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, signer: ec.EllipticCurvePrivateKey,
          ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(signer, hashes.SHA256())


async def test_an_api_server_certificate_of_an_intermediate_of_the_ca_is_admitted(tmp_path: Path) -> None:
    root_key, middle_key, leaf_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    root = _cert("root-ca", _name("root-ca"), root_key, root_key, ca=True)
    middle = _cert("intermediate-ca", root.subject, middle_key, root_key, ca=True)
    leaf = _cert(NAME, middle.subject, leaf_key, middle_key, ca=False)
    pem = serialization.Encoding.PEM
    bundle = tmp_path / "client-ca.crt"
    bundle.write_bytes(root.public_bytes(pem))
    chain, key = tmp_path / "client.crt", tmp_path / "client.key"
    chain.write_bytes(leaf.public_bytes(pem) + middle.public_bytes(pem))  # as a TLS client presents it
    key.write_bytes(leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))

    serving_ca = CertificateAuthority.create("webhook-ca")
    cert, skey = serving_ca.issue_server("webhook", ["127.0.0.1"]).write(tmp_path, "serving")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, skey)
    callers = Callers(bundle, frozenset({NAME}))
    callers.configure(context)
    reviewed: list[dict[str, Any]] = []

    async def review(body: dict[str, Any]) -> Any:
        reviewed.append(body)
        return ALLOW

    from aiohttp import web

    runner = web.AppRunner(application(SimpleNamespace(review=review), callers))  # type: ignore[arg-type]
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    client = ssl.create_default_context(cadata=serving_ca.pair.cert_pem.decode())
    client.load_cert_chain(chain, key)

    async def call() -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, session.post(
                f"https://127.0.0.1:{port}/validate/maxmemory", json=REVIEW, ssl=client) as answer:
            return answer.status, await answer.text()

    try:
        status, text = await call()
        # The root taken out of the file: OpenSSL still knows it, the chain it verified ends there.
        bundle.write_bytes(CertificateAuthority.create("root-ca").pair.cert_pem)
        assert callers.reload(context)
        after, _ = await call()
    finally:
        await runner.cleanup()
    print("an API server certificate of an intermediate of the configured CA was answered:", status, text)
    assert status == 200, (f"the handshake admitted a certificate that chains to --client-ca-file, then every"
                           f" review was refused: {status} {text}")
    assert len(reviewed) == 1
    assert after == 403, "a chain that ends at a CA taken out of the file is refused"
