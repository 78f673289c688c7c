"""What a kubeconfig (or a pod's ServiceAccount) resolves to: where the API server is, how to
trust and reach it, and who we are to it. ``kubeconfig`` reads it; ``transport`` and ``auth``
send requests with it; the controller's Kopf session is built from the same (``controller.login``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuslice.errors import GpusliceError


class KubeconfigError(GpusliceError, ValueError):
    """No credentials could be loaded; the message says why and what to do."""


@dataclass(frozen=True)
class Impersonation:
    """``as``, ``as-uid``, ``as-groups``, ``as-user-extra``: sent as client-go sends them."""

    user: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def headers(self) -> list[tuple[str, str]]:
        found = [("Impersonate-User", self.user)]
        if self.uid:
            found.append(("Impersonate-Uid", self.uid))
        found += [("Impersonate-Group", group) for group in self.groups]
        found += [(f"Impersonate-Extra-{_header_key(key)}", value) for key, values in self.extra for value in values]
        return found


_TOKEN = frozenset(b"!#$&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def _header_key(key: str) -> str:
    """client-go's headerKeyEscape: every byte that may not stand in a header name, and %, as %XX."""
    return "".join(chr(b) if b in _TOKEN else f"%{b:02X}" for b in key.encode())


@dataclass(frozen=True)
class ExecPlugin:
    """A ``users[].user.exec`` credential plugin (client.authentication.k8s.io)."""

    command: str
    api_version: str
    where: str  # "user NAME of FILE", for messages
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # may hold a cloud's keys
    install_hint: str = ""
    provide_cluster_info: bool = False
    interactive_mode: str = "IfAvailable"


@dataclass(frozen=True)
class Credentials:
    """Where the API server is, how to trust it, how to reach it and who we are to it."""

    server: str
    ca_pem: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    proxy_url: str | None = None
    disable_compression: bool = False
    token: str | None = field(default=None, repr=False)  # secrets: never in a repr or a traceback
    token_file: Path | None = None
    basic: tuple[str, str] | None = field(default=None, repr=False)
    cert_pem: bytes | None = None
    key_pem: bytes | None = field(default=None, repr=False)
    impersonate: Impersonation | None = None
    exec_plugin: ExecPlugin | None = None
    auth_provider: Mapping[str, Any] | None = field(default=None, hash=False, compare=False, repr=False)  # oidc
    cluster_extension: Any = field(default=None, hash=False, compare=False)  # for provideClusterInfo
    namespace: str = "default"
    source: str = ""  # "context C of FILE" or "the pod's ServiceAccount", for messages
    user_origin: tuple[Path, str] | None = None  # the file that defines the user, and its name
    ca_origin: str = ""  # "certificate-authority FILE of cluster C in KUBECONFIG", for messages
    pair_origin: str = ""  # the same for the client certificate and key
    # The files TLS material was read from, read again when they change (tls.TlsFiles): a CA file,
    # and a client certificate and key only when both are files, as client-go.
    ca_file: Path | None = None
    pair_files: tuple[Path, Path] | None = None
