"""TLS to the API server as client-go sets it up: the kubeconfig's CA replaces the system's, and
the client certificate (the kubeconfig's, or an exec plugin's) is offered.

Material that cannot be used is a :class:`KubeconfigError` that names the field and the file,
found while the kubeconfig is read (:func:`check`), not an ``ssl.SSLError`` traceback at the
first request. As kubectl: PEM only (a DER file is refused, with the command that converts it),
and a key encrypted with a pass-phrase is refused: OpenSSL would otherwise ask for the
pass-phrase on the terminal, or block a controller on it.
"""

from __future__ import annotations

import ssl
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import structlog

from gpuslice.kube.credentials import Credentials, KubeconfigError

log = structlog.get_logger(__name__)
TLS_RELOAD = 60.0  # seconds between reads of the CA and client certificate files

Pair = tuple[bytes, bytes]
ENCRYPTED = (b"ENCRYPTED PRIVATE KEY", b"Proc-Type: 4,ENCRYPTED")


class _PassPhrase(Exception):
    pass


def _no_pass_phrase() -> bytes:
    raise _PassPhrase  # OpenSSL asks for one: never the terminal


def _pem(data: bytes, origin: str, example: str) -> str:
    if b"-----BEGIN " not in data:
        raise KubeconfigError(f"{origin}: not PEM (a DER file?); kubectl reads PEM only. Convert it: {example}")
    return data.decode("latin-1")


def _load_pair(context: ssl.SSLContext, cert: bytes, key: bytes, origin: str) -> None:
    _pem(cert, origin, "openssl x509 -inform der -in CERT -out CERT.pem")
    _pem(key, origin, "openssl pkey -inform der -in KEY -out KEY.pem")
    encrypted = f"{origin}: the key is encrypted with a pass-phrase, which kubectl cannot use either; decrypt it:" \
                " openssl pkey -in KEY -out KEY.plain"
    if any(marker in key for marker in ENCRYPTED):
        raise KubeconfigError(encrypted)
    # The ssl module loads a key pair only from files: a private directory, gone at once.
    with tempfile.TemporaryDirectory(prefix="gpuslice-tls-") as directory:
        cert_path, key_path = Path(directory) / "tls.crt", Path(directory) / "tls.key"
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        try:
            context.load_cert_chain(cert_path, key_path, password=_no_pass_phrase)
        except _PassPhrase:
            raise KubeconfigError(encrypted) from None
        except ssl.SSLError as error:
            raise KubeconfigError(f"{origin}: the client certificate and key could not be loaded"
                                  f" ({error.reason or error}): each must be PEM, and the key the certificate's")\
                from None


def ssl_context(credentials: Credentials, pair: Pair | None = None, pair_origin: str = "") -> ssl.SSLContext:
    """The context for ``credentials``; ``pair`` (with where it came from, for messages) overrides
    the kubeconfig's client certificate and key (an exec plugin's)."""
    ca = credentials.ca_pem
    try:
        context = ssl.create_default_context(cadata=_pem(
            ca, credentials.ca_origin, "openssl x509 -inform der -in CA -out CA.pem") if ca else None)
    except ssl.SSLError as error:
        raise KubeconfigError(f"{credentials.ca_origin}: no certificate authority could be read from it"
                              f" ({error.reason or error})") from None
    if credentials.insecure:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    cert, key = pair or (credentials.cert_pem, credentials.key_pem)
    if cert and key:
        _load_pair(context, cert, key, pair_origin if pair else credentials.pair_origin)
    return context


def check(credentials: Credentials) -> None:
    """Refuse, by name, a CA or client pair that TLS could not use."""
    if credentials.ca_pem or credentials.cert_pem:
        ssl_context(credentials)


class TlsFiles:
    """The files TLS material was read from, read again at most every ``TLS_RELOAD`` seconds, as
    client-go does (a client certificate and key given as files at each new connection, a CA file
    every 5 minutes): a renewed certificate (cert-manager, a rotated cluster CA in a pod's
    ServiceAccount) is used without a restart. A file that cannot be read, or material that cannot
    be used, keeps the old one, as client-go keeps it (with a warning)."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials
        self.checked = time.monotonic()

    def reload(self) -> bool:
        """True when a file changed: ``credentials`` now holds its new content."""
        old = self.credentials
        if (old.ca_file is None and old.pair_files is None) or time.monotonic() - self.checked < TLS_RELOAD:
            return False
        self.checked = time.monotonic()
        try:
            ca = old.ca_file.read_bytes() if old.ca_file is not None else old.ca_pem
            cert, key = (old.pair_files[0].read_bytes(), old.pair_files[1].read_bytes()) if old.pair_files \
                else (old.cert_pem, old.key_pem)
        except OSError as error:
            log.warning("could not read TLS material again; the old one serves", file=error.filename,
                        error=error.strerror or str(error))
            return False
        if old.ca_file is not None and not ca:
            return False  # an empty CA file (being written): client-go skips it too
        if (ca, cert, key) == (old.ca_pem, old.cert_pem, old.key_pem):
            return False
        new = replace(old, ca_pem=ca, cert_pem=cert, key_pem=key)
        try:
            check(new)
        except KubeconfigError as error:
            log.warning("the TLS material changed but cannot be used; the old one serves", error=str(error))
            return False
        self.credentials = new
        return True
