"""Who may call the webhook: the API server, proved by the client certificate it presents.

The webhook writes ledgers, so whoever can send it a review can charge them. kube-apiserver
presents a client certificate to an admission webhook when its ``--admission-control-config-file``
gives the webhook admission plugins a kubeconfig (``WebhookAdmissionConfiguration.kubeConfigFile``)
with credentials for the webhook's host (docs/install.md). With ``--client-ca-file`` the webhook
asks every caller for a certificate during the TLS handshake and refuses the handshake without
one that chains to those CAs (through any intermediates the caller presents); each request is then
checked again here, on the chain the handshake verified, against the bundle as it is now (a chain
that ends at a CA taken out of the file is refused at once, though OpenSSL cannot forget it) and against
``--client-allowed-names`` (the common names allowed, as kube-apiserver's
``--requestheader-allowed-names``: a cluster's own CA also signs every kubelet's and admin's).

A bearer token checked with a TokenReview (the field's other way) was not chosen: it costs an API
call per review, or a cache that outlives a revoked token, and the API server would need a
long-lived token in a file on every control-plane node; a client certificate costs neither, and
the control plane already keeps certificates there.
"""

from __future__ import annotations

import _ssl
import itertools
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID

from gpuslice.errors import GpusliceError

log = structlog.get_logger(__name__)
QUIET = 10.0  # seconds between log lines about refused callers (a flood is counted, not logged line by line)


class ClientCaError(GpusliceError):
    """The client CA file cannot be read, or holds no certificate."""


def _read(path: Path) -> tuple[bytes, list[x509.Certificate]]:
    try:
        pem = path.read_bytes()
    except OSError as error:
        raise ClientCaError(f"--client-ca-file {path} cannot be read ({error.strerror}): the webhook would not"
                            " know its caller; fix the path (the install mounts it) or unset the setting") from None
    try:
        cas = x509.load_pem_x509_certificates(pem)
    except ValueError:
        cas = []
    if not cas:
        raise ClientCaError(f"--client-ca-file {path} holds no PEM certificate: give it the CA bundle that signs"
                            " the API server's client certificate")
    return pem, cas


def common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


@dataclass
class Callers:
    """The CAs and names a caller's certificate is judged by; without a CA file, anyone may call."""

    ca_file: Path | None
    allowed_names: frozenset[str] = frozenset()
    _pem: bytes = b""
    _cas: list[x509.Certificate] = field(default_factory=list)
    _said: float | None = None

    @property
    def required(self) -> bool:
        return self.ca_file is not None

    def configure(self, context: ssl.SSLContext) -> None:
        """Make ``context`` ask every caller for a certificate of the CAs (raises ClientCaError)."""
        if self.ca_file is None:
            log.warning("serving without client authentication: anyone who reaches the webhook's port may send it"
                        " reviews (each is still checked against the claim it names); set --client-ca-file"
                        " (docs/install.md)")
            return
        context.verify_mode = ssl.CERT_REQUIRED
        self.reload(context)

    def reload(self, context: ssl.SSLContext) -> bool:
        """Read the CA file again; a CA new to it is trusted from the next handshake. Whether it
        changed. A file that cannot be read keeps the bundle as it was (logged)."""
        if self.ca_file is None:
            return False
        try:
            pem, cas = _read(self.ca_file)
        except ClientCaError as error:
            if not self._cas:
                raise
            log.warning("client CA file unreadable; keeping the CAs read before", error=str(error))
            return False
        if pem == self._pem:
            return False
        context.load_verify_locations(cadata=pem.decode("ascii", errors="replace"))
        self._pem, self._cas = pem, cas
        log.info("client CAs loaded", file=str(self.ca_file), cas=[common_name(c) for c in cas],
                 allowed_names=sorted(self.allowed_names) or "any")
        return True

    def refusal(self, chain: Sequence[bytes]) -> str | None:
        """Why the caller may not call, ``chain`` being the certificates (DER, the caller's first, the
        trust anchor last) the TLS handshake verified; None when it may."""
        if self.ca_file is None:
            return None
        if not chain:
            return "no client certificate"
        try:
            certs = [x509.load_der_x509_certificate(der) for der in chain]
        except ValueError:
            return "a client certificate that does not parse"
        cert = certs[0]
        if not self._anchored(certs):
            return f"a client certificate ({common_name(cert)!r}) of no CA in --client-ca-file now"
        if self.allowed_names and common_name(cert) not in self.allowed_names:
            return f"a client certificate for {common_name(cert)!r}, not one of --client-allowed-names"
        return None

    def _anchored(self, certs: list[x509.Certificate]) -> bool:
        """Whether each certificate of the chain is issued by the next and the last is a CA of the
        bundle now, or issued by one (a chain of the leaf alone, where no verified chain is known)."""
        if not all(_issued_by(cert, issuer) for cert, issuer in itertools.pairwise(certs)):
            return False
        anchor = certs[-1]
        return anchor in self._cas or any(_issued_by(anchor, ca) for ca in self._cas)

    def tell(self, peer: str, why: str) -> None:
        """Log a refused caller, at most once every ``QUIET`` seconds (the metric counts each)."""
        now = time.monotonic()
        if self._said is None or now - self._said >= QUIET:
            self._said = now
            log.warning("refused a caller that is not the API server", peer=peer, why=why)


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def verified_chain(ssl_object: ssl.SSLObject | None) -> list[bytes]:
    """The caller's certificate chain as the handshake verified it (DER, the caller's first, the
    trust anchor last); empty when it gave none. Python 3.13 names this ``get_verified_chain``; 3.11
    and 3.12 have it on the private ``_sslobj`` only. Where neither is, the caller's certificate
    alone (then one of an intermediate is refused: fails closed)."""
    if ssl_object is None:
        return []
    public = getattr(ssl_object, "get_verified_chain", None)
    if public is not None:
        return [bytes(der) for der in public() or []]
    private = getattr(getattr(ssl_object, "_sslobj", None), "get_verified_chain", None)
    if private is not None:
        return [cert.public_bytes(_ssl.ENCODING_DER) for cert in private() or []]
    der = ssl_object.getpeercert(binary_form=True)
    return [der] if der else []
