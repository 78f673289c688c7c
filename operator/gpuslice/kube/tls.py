"""TLS to the API server as client-go sets it up: the kubeconfig's CA replaces the system's, and
the client certificate (the kubeconfig's, or an exec plugin's) is offered."""

from __future__ import annotations

import ssl
import tempfile
from pathlib import Path

from gpuslice.kube.credentials import Credentials


def ssl_context(credentials: Credentials, cert_pem: bytes | None = None,
                key_pem: bytes | None = None) -> ssl.SSLContext:
    """The context for ``credentials``; ``cert_pem``/``key_pem`` override the kubeconfig's pair (an
    exec plugin's)."""
    context = ssl.create_default_context(cadata=credentials.ca_pem.decode() if credentials.ca_pem else None)
    if credentials.insecure:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    cert, key = cert_pem or credentials.cert_pem, key_pem or credentials.key_pem
    if cert and key:
        # The ssl module loads a key pair only from files: a private directory, gone at once.
        with tempfile.TemporaryDirectory(prefix="gpuslice-tls-") as directory:
            cert_path, key_path = Path(directory) / "tls.crt", Path(directory) / "tls.key"
            cert_path.write_bytes(cert)
            key_path.touch(mode=0o600)
            key_path.write_bytes(key)
            context.load_cert_chain(cert_path, key_path)
    return context
