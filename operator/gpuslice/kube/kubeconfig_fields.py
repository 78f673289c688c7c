"""One cluster, user or context entry of a kubeconfig, read as clientcmd reads it: every field
honoured or refused with a message that names it. A field gpuslice's client does not know is
never dropped, since a dropped ``as`` or ``proxy-url`` would send requests as someone else, or by
another road, than the kubeconfig says.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpuslice.kube.credentials import ExecPlugin, Impersonation, KubeconfigError
from gpuslice.kube.proxy import supported

# clientcmd's fields (api/v1/types.go). Extensions carry data for tools and plugins; clientcmd
# itself does nothing with them either.
CLUSTER_FIELDS = frozenset({"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
                            "tls-server-name", "proxy-url", "disable-compression", "extensions"})
USER_FIELDS = frozenset({"client-certificate", "client-certificate-data", "client-key", "client-key-data", "token",
                         "tokenFile", "as", "as-uid", "as-groups", "as-user-extra", "username", "password",
                         "auth-provider", "exec", "extensions"})
CONTEXT_FIELDS = frozenset({"cluster", "user", "namespace", "extensions"})
EXEC_FIELDS = frozenset({"command", "args", "env", "apiVersion", "installHint", "provideClusterInfo",
                         "interactiveMode"})
EXEC_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
# client-go v0.26 removed these two auth providers; its words, so that kubectl and gpuslice agree.
REMOVED_PROVIDERS = {
    "gcp": 'use the "gke-gcloud-auth-plugin" kubectl/client-go credential plugin instead (see'
           " https://cloud.google.com/blog/products/containers-kubernetes/kubectl-auth-changes-in-gke)",
    "azure": "use the https://github.com/Azure/kubelogin kubectl/client-go credential plugin instead",
}


def refuse_unknown(entry: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    unknown = sorted(set(entry) - known)
    if unknown:
        raise KubeconfigError(
            f"{where}: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not supported by gpuslice's"
            " client, and it will not ignore a field that could change where requests go or whom they act as;"
            " remove it, or use a context without it (--context)")


def _wrong(where: str, label: str, want: str, value: Any, fix: str = "") -> KubeconfigError:
    return KubeconfigError(f"{where}: {label} must be {want}, not {value!r} ({type(value).__name__}{fix}); kubectl"
                           " refuses it too")


def flag(entry: Mapping[str, Any], key: str, where: str, label: str | None = None) -> bool:
    """A bool field: only a YAML true or false. A quoted "false" is a string, and read as a truth
    value it would turn ``insecure-skip-tls-verify`` on."""
    value = entry.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _wrong(where, label or key, "true or false", value, ": write true or false without quotes")
    return value


def text(entry: Mapping[str, Any], key: str, where: str, label: str | None = None) -> str:
    """A string field ("" when absent): a number or a bool where a string belongs is refused, as Go's
    decoder of kubeconfigs refuses it."""
    value = entry.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _wrong(where, label or key, "a string", value)
    return value


def texts(entry: Mapping[str, Any], key: str, where: str, label: str | None = None) -> tuple[str, ...]:
    """A list of strings: a lone string is not split into its characters."""
    value = entry.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _wrong(where, label or key, "a list of strings", value)
    return tuple(value)


def _data_or_file(entry: Mapping[str, Any], key: str, where: str) -> tuple[bytes | None, str]:
    """The bytes of ``KEY-data`` or of the file ``KEY`` names, and which it was (for messages)."""
    data, file = text(entry, f"{key}-data", where), text(entry, key, where)
    if data and file:
        raise KubeconfigError(f"{where}: {key}-data and {key} are both set; keep one (kubectl refuses both)")
    if data:
        try:
            # Go's decoder skips line breaks, and nothing else outside the alphabet.
            return base64.b64decode(data.replace("\r", "").replace("\n", ""), validate=True), f"{key}-data"
        except (binascii.Error, ValueError):
            raise KubeconfigError(f"{where}: {key}-data is not base64") from None
    if file:
        try:
            return Path(file).read_bytes(), f"{key} {file}"
        except OSError as error:
            raise KubeconfigError(f"{where}: {key} {file}: {error.strerror or error}") from None
    return None, ""


def _proxy(cluster: Mapping[str, Any], where: str) -> str | None:
    url = text(cluster, "proxy-url", where)
    return supported(url, f"{where}: proxy-url", "use an HTTP proxy, or kubectl") if url else None


def _impersonation(user: Mapping[str, Any], where: str) -> Impersonation | None:
    name, uid, groups = text(user, "as", where), text(user, "as-uid", where), texts(user, "as-groups", where)
    extra = user.get("as-user-extra") or {}
    if not isinstance(extra, dict) or not all(isinstance(k, str) and isinstance(vs, list)
                                              and all(isinstance(v, str) for v in vs) for k, vs in extra.items()):
        raise _wrong(where, "as-user-extra", "a mapping of each key to a list of strings", extra)
    if not name:
        if uid or groups or extra:
            raise KubeconfigError(f"{where}: as-uid, as-groups or as-user-extra without as: impersonating a group"
                                  " or uid needs a user to impersonate (kubectl refuses it too)")
        return None
    return Impersonation(name, uid, groups, tuple((k, tuple(vs)) for k, vs in sorted(extra.items())))


def _exec_plugin(config: Any, where: str) -> ExecPlugin:
    if not isinstance(config, dict):
        raise KubeconfigError(f"{where}.exec must be a mapping")
    refuse_unknown(config, EXEC_FIELDS, f"{where}.exec")
    version = text(config, "apiVersion", where, "exec.apiVersion")
    if version not in EXEC_VERSIONS:
        raise KubeconfigError(f"{where}.exec.apiVersion {version!r}: use one of {', '.join(EXEC_VERSIONS)}"
                              " (v1alpha1 was removed in Kubernetes 1.24)")
    command = text(config, "command", where, "exec.command")
    if not command:
        raise KubeconfigError(f"{where}.exec.command is not set")
    mode = text(config, "interactiveMode", where, "exec.interactiveMode") or (
        "" if version.endswith("/v1") else "IfAvailable")
    if mode not in ("Never", "IfAvailable", "Always"):
        raise KubeconfigError(f"{where}.exec.interactiveMode {mode!r}: use Never, IfAvailable or Always (required"
                              " with client.authentication.k8s.io/v1)")
    listed = config.get("env") or []
    if not isinstance(listed, list):
        raise _wrong(where, "exec.env", "a list of name and value entries", listed)
    env = []
    for index, item in enumerate(listed):
        label = f"exec.env[{index}]"
        if not isinstance(item, dict) or not text(item, "name", where, f"{label}.name"):
            raise KubeconfigError(f"{where}.{label}: every entry needs a name and a value")
        env.append((text(item, "name", where, f"{label}.name"), text(item, "value", where, f"{label}.value")))
    return ExecPlugin(command, version, where, texts(config, "args", where, "exec.args"), tuple(env),
                      text(config, "installHint", where, "exec.installHint"),
                      flag(config, "provideClusterInfo", where, "exec.provideClusterInfo"), mode)


def _auth_provider(config: Any, where: str) -> Mapping[str, Any]:
    name = text(config, "name", where, "auth-provider.name") if isinstance(config, dict) else ""
    if name in REMOVED_PROVIDERS:
        raise KubeconfigError(f"{where}: the {name} auth-provider was removed from kubectl and client-go;"
                              f" {REMOVED_PROVIDERS[name]}")
    if name != "oidc":
        raise KubeconfigError(f"{where}: auth-provider {name!r} is not one kubectl knows (only oidc is left;"
                              " use an exec credential plugin)")
    settings = config.get("config") or {}
    if not isinstance(settings, dict) or not all(isinstance(v, str) for v in settings.values()):
        raise _wrong(where, "auth-provider.config", "a mapping of names to strings", settings)
    return dict(config)


def user_fields(user: Mapping[str, Any], where: str) -> dict[str, Any]:
    refuse_unknown(user, USER_FIELDS, where)
    token, token_file = text(user, "token", where), text(user, "tokenFile", where)
    username, password = text(user, "username", where), text(user, "password", where)
    # The pairs client-go refuses (clientcmd's validateAuthInfo, transport's HTTPWrappersForConfig,
    # rest's TransportConfig); for the rest its precedence holds (auth.auth_for).
    if (token or token_file) and (username or password):
        raise KubeconfigError(f"{where}: a token and a username or password are both set; keep one (kubectl refuses"
                              " both)")
    if user.get("exec") and user.get("auth-provider"):
        raise KubeconfigError(f"{where}: exec and auth-provider are both set; keep one (kubectl refuses both)")
    (cert, cert_field), (key, key_field) = (_data_or_file(user, "client-certificate", where),
                                            _data_or_file(user, "client-key", where))
    if bool(cert) != bool(key):
        raise KubeconfigError(f"{where}: a client certificate needs its key, and a key its certificate")
    return {
        "token": token or None,
        "token_file": Path(token_file) if token_file else None,
        "basic": (username, password) if username or password else None, "cert_pem": cert, "key_pem": key,
        "pair_origin": f"{where}: {cert_field} and {key_field}" if cert else "",
        "pair_files": (Path(text(user, "client-certificate", where)), Path(text(user, "client-key", where)))
        if text(user, "client-certificate", where) and text(user, "client-key", where) else None,
        "impersonate": _impersonation(user, where),
        "exec_plugin": _exec_plugin(user["exec"], where) if user.get("exec") else None,
        "auth_provider": _auth_provider(user["auth-provider"], where) if user.get("auth-provider") else None,
    }


def server_url(server: str, tls: bool, where: str) -> str:
    """client-go's DefaultServerURL: a ``host:port`` gets https:// when there is TLS to do (a CA, a
    client certificate, insecure-skip-tls-verify), else http://."""
    parts = urlsplit(server)
    if not parts.scheme or not parts.netloc:
        server = ("https://" if tls else "http://") + server
        parts = urlsplit(server)
        if parts.path not in ("", "/"):
            raise KubeconfigError(f"{where}: server {server.split('://', 1)[1]!r} must be a URL or a host:port pair")
    if parts.scheme not in ("https", "http"):
        raise KubeconfigError(f"{where}: server {server!r} must be https:// or http://")
    return server.rstrip("/")


def cluster_fields(cluster: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The Credentials fields a cluster entry gives."""
    refuse_unknown(cluster, CLUSTER_FIELDS, where)
    server = text(cluster, "server", where)
    if not server:
        raise KubeconfigError(f"{where} has no server")
    ca, ca_field = _data_or_file(cluster, "certificate-authority", where)
    insecure = flag(cluster, "insecure-skip-tls-verify", where)
    if insecure and ca:
        raise KubeconfigError(f"{where}: insecure-skip-tls-verify with a certificate authority; keep one (kubectl"
                              " refuses both)")
    return {
        "server": server, "ca_pem": ca, "ca_origin": f"{where}: {ca_field}", "insecure": insecure,
        "ca_file": Path(text(cluster, "certificate-authority", where)) if ca_field.startswith("certificate-authority ")
        else None,
        "tls_server_name": text(cluster, "tls-server-name", where) or None,
        "proxy_url": _proxy(cluster, where), "disable_compression": flag(cluster, "disable-compression", where),
        "cluster_extension": next((e.get("extension") for e in cluster.get("extensions") or []
                                   if isinstance(e, dict) and e.get("name") == "client.authentication.k8s.io/exec"),
                                  None),
    }
