"""The dev cluster's certificates: each identity is what the apiserver will see."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuslice.devcluster.pki import CertificateAuthority, kubeconfig, service_account_key


def _verify(ca: CertificateAuthority, cert: x509.Certificate) -> None:
    public = ca.cert.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert cert.signature_hash_algorithm is not None
    public.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))


def test_client_certificate_names_user_and_groups() -> None:
    ca = CertificateAuthority.create()
    pair = ca.issue_client("system:node:gpu-node-1", ("system:nodes",))
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    _verify(ca, cert)
    subject = cert.subject
    assert subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:gpu-node-1"
    assert [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:nodes"]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_server_certificate_covers_loopback_ip_and_names() -> None:
    ca = CertificateAuthority.create()
    cert = x509.load_pem_x509_certificate(ca.issue_server("kube-apiserver", ["127.0.0.1", "localhost"]).cert_pem)
    _verify(ca, cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]


def test_ca_round_trips_through_files(tmp_path: Path) -> None:
    ca = CertificateAuthority.create()
    ca.pair.write(tmp_path, "ca")
    assert (tmp_path / "ca.key").stat().st_mode & 0o077 == 0
    loaded = CertificateAuthority.load(tmp_path)
    _verify(ca, x509.load_pem_x509_certificate(loaded.issue_client("x").cert_pem))


def test_kubeconfig_is_self_contained() -> None:
    ca = CertificateAuthority.create()
    client = ca.issue_client("admin", ("system:masters",))
    config = yaml.safe_load(kubeconfig("https://127.0.0.1:6443", ca.pair, client, "admin", "dev"))
    cluster = config["clusters"][0]["cluster"]
    assert cluster["server"] == "https://127.0.0.1:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == ca.pair.cert_pem
    assert base64.b64decode(config["users"][0]["user"]["client-key-data"]) == client.key_pem
    assert config["current-context"] == "dev"


def test_service_account_key_pair_matches() -> None:
    pair = service_account_key()
    assert b"PUBLIC KEY" in pair.cert_pem
    assert b"PRIVATE KEY" in pair.key_pem


def test_the_api_server_presents_its_webhook_client_certificate_to_every_webhook(tmp_path: Path) -> None:
    """Both webhook admission plugins read one kubeconfig whose default entry (``*``: the dev cluster's
    webhooks are called by URL, on ports chosen later) is the client certificate of WEBHOOK_CLIENT."""
    from gpuslice.devcluster.pki import WEBHOOK_CLIENT, admission_configuration, admission_webhooks_kubeconfig

    ca = CertificateAuthority.create()
    config = yaml.safe_load(admission_webhooks_kubeconfig(ca.issue_client(WEBHOOK_CLIENT)))
    [user] = config["users"]
    assert user["name"] == "*"
    cert = x509.load_pem_x509_certificate(base64.b64decode(user["user"]["client-certificate-data"]))
    _verify(ca, cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == WEBHOOK_CLIENT
    admission = yaml.safe_load(admission_configuration(tmp_path / "webhooks.kubeconfig"))
    assert admission["kind"] == "AdmissionConfiguration"
    assert {p["name"]: p["configuration"]["kubeConfigFile"] for p in admission["plugins"]} == {
        "ValidatingAdmissionWebhook": str(tmp_path / "webhooks.kubeconfig"),
        "MutatingAdmissionWebhook": str(tmp_path / "webhooks.kubeconfig")}
