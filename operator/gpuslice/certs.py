"""Certificates gpuslice makes for itself: a CA and the maxMemory webhook's serving certificate.

The API server calls the webhook over TLS and trusts it through the ``caBundle`` of its
ValidatingWebhookConfiguration; the controller keeps both (controller.webhook_tls). EC P-256
keys: quick to make, and what the API server's TLS accepts.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Backdated a little, so that a clock a few minutes behind the API server's still accepts it (a
# tenth of the validity at most, so that a short-lived certificate is not mostly backdating).
SKEW = datetime.timedelta(minutes=5)


def _skew(lifetime: datetime.timedelta) -> datetime.timedelta:
    return min(SKEW, lifetime / 10)


@dataclass(frozen=True)
class Pem:
    cert: bytes
    key: bytes = b""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def new_ca(common_name: str, lifetime: datetime.timedelta, now: datetime.datetime | None = None) -> Pem:
    now = now or _now()
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _skew(lifetime)).not_valid_after(now + lifetime)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def issue_server(ca: Pem, hosts: Sequence[str], lifetime: datetime.timedelta,
                 now: datetime.datetime | None = None) -> Pem:
    """A serving certificate for ``hosts`` (DNS names or IP addresses), signed by ``ca``."""
    now = now or _now()
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _skew(lifetime)).not_valid_after(min(now + lifetime, ca_cert.not_valid_after_utc))
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def certificates(bundle: bytes) -> list[x509.Certificate]:
    """The certificates of a PEM bundle; none when it does not parse."""
    try:
        return x509.load_pem_x509_certificates(bundle)
    except ValueError:
        return []


def expires(cert_pem: bytes) -> datetime.datetime | None:
    found = certificates(cert_pem)
    return found[0].not_valid_after_utc if found else None


def lifetime_left(cert_pem: bytes, now: datetime.datetime | None = None) -> float:
    """The part of its validity a certificate has left, 0 to 1 (0 when it does not parse)."""
    found = certificates(cert_pem)
    if not found:
        return 0.0
    cert, now = found[0], now or _now()
    total = (cert.not_valid_after_utc - cert.not_valid_before_utc).total_seconds()
    return max(0.0, (cert.not_valid_after_utc - now).total_seconds() / total) if total > 0 else 0.0


def hosts_of(cert_pem: bytes) -> set[str]:
    found = certificates(cert_pem)
    if not found:
        return set()
    try:
        names = found[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n.value) for n in names}


def signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    certs, cas = certificates(cert_pem), certificates(ca_pem)
    if not certs or not cas:
        return False
    try:
        certs[0].verify_directly_issued_by(cas[0])
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
