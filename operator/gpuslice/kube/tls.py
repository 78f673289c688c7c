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
from pathlib import Path

from gpuslice.kube.credentials import Credentials, KubeconfigError

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
