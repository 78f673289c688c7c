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
PROXY_SCHEMES = ("http", "https")
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


def _data_or_file(entry: Mapping[str, Any], key: str, where: str) -> bytes | None:
    data, file = entry.get(f"{key}-data"), entry.get(key)
    if data and file:
        raise KubeconfigError(f"{where}: {key}-data and {key} are both set; keep one (kubectl refuses both)")
    if data:
        try:
            return base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError):
            raise KubeconfigError(f"{where}: {key}-data is not base64") from None
    if file:
        try:
            return Path(str(file)).read_bytes()
        except OSError as error:
            raise KubeconfigError(f"{where}: {key} {file}: {error.strerror or error}") from None
    return None


def _proxy(cluster: Mapping[str, Any], where: str) -> str | None:
    url = cluster.get("proxy-url")
    if not url:
        return None
    parts = urlsplit(str(url))
    if parts.scheme not in PROXY_SCHEMES or not parts.hostname:
        raise KubeconfigError(f"{where}: proxy-url {url!r}: gpuslice's client goes through http:// and https://"
                              " proxies only (kubectl also speaks socks5); use an HTTP proxy or kubectl")
    return str(url)


def _impersonation(user: Mapping[str, Any], where: str) -> Impersonation | None:
    name = user.get("as")
    if not name:
        if user.get("as-uid") or user.get("as-groups") or user.get("as-user-extra"):
            raise KubeconfigError(f"{where}: as-uid, as-groups or as-user-extra without as: impersonating a group"
                                  " or uid needs a user to impersonate (kubectl refuses it too)")
        return None
    extra = user.get("as-user-extra") or {}
    if not isinstance(extra, dict):
        raise KubeconfigError(f"{where}: as-user-extra must map each key to a list of values")
    return Impersonation(str(name), str(user.get("as-uid") or ""), tuple(str(g) for g in user.get("as-groups") or ()),
                         tuple((str(k), tuple(str(v) for v in (vs if isinstance(vs, list) else [vs])))
                               for k, vs in sorted(extra.items())))


def _exec_plugin(config: Any, where: str) -> ExecPlugin:
    if not isinstance(config, dict):
        raise KubeconfigError(f"{where}.exec must be a mapping")
    refuse_unknown(config, EXEC_FIELDS, f"{where}.exec")
    version = str(config.get("apiVersion") or "")
    if version not in EXEC_VERSIONS:
        raise KubeconfigError(f"{where}.exec.apiVersion {version!r}: use one of {', '.join(EXEC_VERSIONS)}"
                              " (v1alpha1 was removed in Kubernetes 1.24)")
    if not config.get("command"):
        raise KubeconfigError(f"{where}.exec.command is not set")
    mode = str(config.get("interactiveMode") or ("" if version.endswith("/v1") else "IfAvailable"))
    if mode not in ("Never", "IfAvailable", "Always"):
        raise KubeconfigError(f"{where}.exec.interactiveMode {mode!r}: use Never, IfAvailable or Always (required"
                              " with client.authentication.k8s.io/v1)")
    env = []
    for item in config.get("env") or []:
        if not isinstance(item, dict) or not item.get("name"):
            raise KubeconfigError(f"{where}.exec.env: every entry needs a name and a value")
        env.append((str(item["name"]), str(item.get("value") or "")))
    return ExecPlugin(str(config["command"]), version, where, tuple(str(a) for a in config.get("args") or ()),
                      tuple(env), str(config.get("installHint") or ""), bool(config.get("provideClusterInfo")), mode)


def _auth_provider(config: Any, where: str) -> Mapping[str, Any]:
    name = str((config or {}).get("name") or "") if isinstance(config, dict) else ""
    if name in REMOVED_PROVIDERS:
        raise KubeconfigError(f"{where}: the {name} auth-provider was removed from kubectl and client-go;"
                              f" {REMOVED_PROVIDERS[name]}")
    if name != "oidc":
        raise KubeconfigError(f"{where}: auth-provider {name!r} is not one kubectl knows (only oidc is left;"
                              " use an exec credential plugin)")
    return dict(config)


def user_fields(user: Mapping[str, Any], where: str) -> dict[str, Any]:
    refuse_unknown(user, USER_FIELDS, where)
    methods = [m for m, present in (("token", user.get("token") or user.get("tokenFile")),
                                    ("basic", user.get("username") or user.get("password")),
                                    ("exec", user.get("exec")), ("auth-provider", user.get("auth-provider")))
               if present]
    if len(methods) > 1:
        raise KubeconfigError(f"{where}: more than one way to authenticate ({', '.join(methods)}); keep one"
                              " (kubectl refuses this too)")
    cert, key = _data_or_file(user, "client-certificate", where), _data_or_file(user, "client-key", where)
    if bool(cert) != bool(key):
        raise KubeconfigError(f"{where}: a client certificate needs its key, and a key its certificate")
    token_file = user.get("tokenFile")
    basic = None
    if "basic" in methods:
        basic = (str(user.get("username") or ""), str(user.get("password") or ""))
    return {
        "token": str(user["token"]) if user.get("token") else None,
        "token_file": Path(str(token_file)) if token_file else None,
        "basic": basic, "cert_pem": cert, "key_pem": key,
        "impersonate": _impersonation(user, where),
        "exec_plugin": _exec_plugin(user["exec"], where) if user.get("exec") else None,
        "auth_provider": _auth_provider(user["auth-provider"], where) if user.get("auth-provider") else None,
    }


def cluster_fields(cluster: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The Credentials fields a cluster entry gives."""
    refuse_unknown(cluster, CLUSTER_FIELDS, where)
    if not cluster.get("server"):
        raise KubeconfigError(f"{where} has no server")
    ca = _data_or_file(cluster, "certificate-authority", where)
    insecure = bool(cluster.get("insecure-skip-tls-verify"))
    if insecure and ca:
        raise KubeconfigError(f"{where}: insecure-skip-tls-verify with a certificate authority; keep one (kubectl"
                              " refuses both)")
    return {
        "server": str(cluster["server"]).rstrip("/"), "ca_pem": ca, "insecure": insecure,
        "tls_server_name": str(cluster["tls-server-name"]) if cluster.get("tls-server-name") else None,
        "proxy_url": _proxy(cluster, where), "disable_compression": bool(cluster.get("disable-compression")),
        "cluster_extension": next((e.get("extension") for e in cluster.get("extensions") or []
                                   if isinstance(e, dict) and e.get("name") == "client.authentication.k8s.io/exec"),
                                  None),
    }
