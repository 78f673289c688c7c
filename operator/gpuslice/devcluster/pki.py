"""Certificates and keys for the dev cluster, made fresh for each state directory.

One CA signs the apiserver's serving certificate and every client certificate,
so each component authenticates as the identity a real cluster gives it
(``system:kube-scheduler``, ``system:node:<name>``...) and RBAC and the Node
authorizer judge it the same way.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
        cert.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)
        key.chmod(0o600)
        return cert, key


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


class CertificateAuthority:
    """A throwaway CA; its key never leaves the state directory."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self._key = key
        self.cert = cert

    @classmethod
    def create(cls, common_name: str = "gpuslice-dev-cluster-ca") -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        name = _name(common_name)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + 10 * _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @classmethod
    def load(cls, directory: Path, stem: str = "ca") -> CertificateAuthority:
        key = serialization.load_pem_private_key((directory / f"{stem}.key").read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        cert = x509.load_pem_x509_certificate((directory / f"{stem}.crt").read_bytes())
        return cls(key, cert)

    @property
    def pair(self) -> KeyPair:
        return KeyPair(self.cert.public_bytes(serialization.Encoding.PEM), _key_pem(self._key))

    def _issue(
        self,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName] | None = None,
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def issue_server(self, common_name: str, hosts: list[str]) -> KeyPair:
        sans: list[x509.GeneralName] = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        return self._issue(_name(common_name), ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def issue_client(self, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client certificate the apiserver maps to ``user`` in ``groups``."""
        return self._issue(_name(user, groups), ExtendedKeyUsageOID.CLIENT_AUTH)


def service_account_key() -> KeyPair:
    """RSA key that signs service-account tokens; the 'cert' half is its public key."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(public, _key_pem(key))


def kubeconfig(server: str, ca: KeyPair, client: KeyPair, user: str, cluster: str) -> str:
    """A self-contained kubeconfig (certificates inlined, so it can be copied anywhere)."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": cluster,
            "cluster": {"server": server, "certificate-authority-data": b64(ca.cert_pem)},
        }],
        "users": [{
            "name": user,
            "user": {
                "client-certificate-data": b64(client.cert_pem),
                "client-key-data": b64(client.key_pem),
            },
        }],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
    }
    return yaml.safe_dump(config, sort_keys=False)


# The common name of the client certificate the API server presents to admission webhooks: the
# maxMemory webhook admits callers of this name only (its --client-allowed-names), since the dev
# cluster's one CA also signs every other component's and the admin's certificate.
WEBHOOK_CLIENT = "gpuslice-webhook-client"


def admission_webhooks_kubeconfig(client: KeyPair, host: str = "*") -> str:
    """The kubeconfig kube-apiserver's webhook admission plugins read (their kubeConfigFile): the
    credentials it presents to a webhook, by the webhook's host (``*``: any; the dev cluster's
    webhooks are called by URL on loopback, on ports chosen later)."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "users": [{"name": host, "user": {
        "client-certificate-data": b64(client.cert_pem), "client-key-data": b64(client.key_pem)}}]}, sort_keys=False)


def admission_configuration(webhooks_kubeconfig: Path) -> str:
    """kube-apiserver's --admission-control-config-file: both webhook admission plugins read
    ``webhooks_kubeconfig`` (an absolute path)."""
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": str(webhooks_kubeconfig)}
    return yaml.safe_dump({"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration", "plugins": [
        {"name": name, "configuration": plugin} for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
    ]}, sort_keys=False)

