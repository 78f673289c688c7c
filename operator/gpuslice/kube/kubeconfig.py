"""Kubeconfigs read as kubectl reads them (k8s.io/client-go/tools/clientcmd, v0.37).

Which files: ``--kubeconfig`` alone when given (it must exist); else every file ``$KUBECONFIG``
lists, merged (missing ones skipped); else ``~/.kube/config``. Merged as clientcmd merges: the
first file that names a cluster, user or context wins it, and the first that sets
``current-context`` wins that; a relative path is relative to the file that holds it. Only when
no file gives anything (none exists, or all are empty) does the CLI fall back to the pod's
ServiceAccount, as kubectl does. The controller and agent try their pod's ServiceAccount first
(see :func:`resolve`), as Kopf's login does in the same process.

Every field of the chosen context, cluster and user is either honoured or refused with a
message that names it: a field gpuslice's client does not know is never dropped, since a
dropped ``as`` or ``proxy-url`` would send requests as someone else, or by another road, than
the kubeconfig says.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = "~/.kube/config"
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


class KubeconfigError(ValueError):
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
    env: tuple[tuple[str, str], ...] = ()
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
    token: str | None = None
    token_file: Path | None = None
    basic: tuple[str, str] | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    impersonate: Impersonation | None = None
    exec_plugin: ExecPlugin | None = None
    auth_provider: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)  # oidc
    cluster_extension: Any = field(default=None, hash=False, compare=False)  # for provideClusterInfo
    namespace: str = "default"
    source: str = ""  # "context C of FILE" or "the pod's ServiceAccount", for messages


@dataclass
class Kubeconfig:
    """One or more kubeconfig files merged; relative paths already made absolute."""

    files: list[Path]
    clusters: dict[str, dict[str, Any]]
    users: dict[str, dict[str, Any]]
    contexts: dict[str, dict[str, Any]]
    current_context: str
    origin: dict[tuple[str, str], Path]  # ("users", name) -> the file that gave it

    @property
    def empty(self) -> bool:
        return not (self.clusters or self.users or self.contexts or self.current_context)

    def describe(self) -> str:
        return ", ".join(str(f) for f in self.files) or "no kubeconfig"


def _absolute(entry: dict[str, Any], keys: Sequence[str], base: Path) -> None:
    for key in keys:
        value = entry.get(key)
        if isinstance(value, str) and value:
            entry[key] = str(base / os.path.expanduser(value))


def read_file(path: Path) -> dict[str, Any]:
    """One kubeconfig file, its file references made absolute as clientcmd's LoadFromFile does."""
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except OSError as error:
        raise KubeconfigError(f"kubeconfig {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise KubeconfigError(f"kubeconfig {path} is not YAML: {error}") from None
    if not isinstance(loaded, dict):
        raise KubeconfigError(f"kubeconfig {path} is not a kubeconfig (a YAML mapping with clusters, users and"
                              " contexts)")
    base = path.parent
    for kind, inner, keys in (("clusters", "cluster", ("certificate-authority",)),
                              ("users", "user", ("client-certificate", "client-key", "tokenFile"))):
        for item in loaded.get(kind) or []:
            entry = item.get(inner) if isinstance(item, dict) else None
            if isinstance(entry, dict):
                _absolute(entry, keys, base)
                plugin = entry.get("exec")
                if isinstance(plugin, dict) and "/" in str(plugin.get("command") or ""):
                    _absolute(plugin, ("command",), base)  # a path, not a name on $PATH
    return loaded


def merge(paths: Sequence[Path]) -> Kubeconfig:
    """clientcmd's rules: the first file to name a cluster, user or context keeps it; the first
    ``current-context`` set wins. Missing files are skipped; an unreadable one is an error."""
    merged = Kubeconfig([], {}, {}, {}, "", {})
    for path in paths:
        if not path.exists():
            continue
        config = read_file(path)
        merged.files.append(path)
        for kind, inner in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            known: dict[str, dict[str, Any]] = getattr(merged, kind)
            for item in config.get(kind) or []:
                if not isinstance(item, dict) or not item.get("name"):
                    raise KubeconfigError(f"kubeconfig {path}: every entry of {kind} needs a name")
                name = str(item["name"])
                if name not in known:
                    known[name] = dict(item.get(inner) or {})
                    merged.origin[(kind, name)] = path
        if not merged.current_context and config.get("current-context"):
            merged.current_context = str(config["current-context"])
    return merged


def kubeconfig_paths(explicit: Path | str | None, environ: Mapping[str, str]) -> tuple[list[Path], str]:
    """The files to read, and how they were chosen (for messages)."""
    if explicit is not None:
        path = Path(os.path.expanduser(str(explicit)))
        if not path.exists():
            raise KubeconfigError(f"kubeconfig {explicit} (given with --kubeconfig) does not exist")
        return [path], f"--kubeconfig {explicit}"
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        unique = list(dict.fromkeys(Path(os.path.expanduser(p)) for p in listed))
        return unique, f"$KUBECONFIG ({os.pathsep.join(listed)})"
    return [Path(os.path.expanduser(DEFAULT_KUBECONFIG))], DEFAULT_KUBECONFIG


def _refuse_unknown(entry: Mapping[str, Any], known: frozenset[str], where: str) -> None:
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
    _refuse_unknown(config, EXEC_FIELDS, f"{where}.exec")
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


def _user(user: Mapping[str, Any], where: str) -> dict[str, Any]:
    _refuse_unknown(user, USER_FIELDS, where)
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


def select(config: Kubeconfig, context: str | None) -> Credentials:
    """The credentials of ``context`` (or the current context) of a merged kubeconfig."""
    name = context or config.current_context
    if not name:
        raise KubeconfigError(f"kubeconfig {config.describe()} sets no current-context: choose one with --context"
                              f" ({', '.join(sorted(config.contexts)) or 'it has no contexts'})")
    if name not in config.contexts:
        raise KubeconfigError(f"kubeconfig {config.describe()} has no context {name!r} (it has:"
                              f" {', '.join(sorted(config.contexts)) or 'none'})")
    ctx = config.contexts[name]
    _refuse_unknown(ctx, CONTEXT_FIELDS, f"context {name!r} in {config.origin[('contexts', name)]}")
    cluster_name, user_name = str(ctx.get("cluster") or ""), str(ctx.get("user") or "")
    if cluster_name not in config.clusters:
        raise KubeconfigError(f"context {name!r} names cluster {cluster_name!r}, which kubeconfig"
                              f" {config.describe()} does not have")
    if user_name and user_name not in config.users:
        raise KubeconfigError(f"context {name!r} names user {user_name!r}, which kubeconfig {config.describe()}"
                              " does not have")
    cluster = config.clusters[cluster_name]
    where = f"cluster {cluster_name!r} in {config.origin[('clusters', cluster_name)]}"
    _refuse_unknown(cluster, CLUSTER_FIELDS, where)
    if not cluster.get("server"):
        raise KubeconfigError(f"{where} has no server")
    ca = _data_or_file(cluster, "certificate-authority", where)
    insecure = bool(cluster.get("insecure-skip-tls-verify"))
    if insecure and ca:
        raise KubeconfigError(f"{where}: insecure-skip-tls-verify with a certificate authority; keep one (kubectl"
                              " refuses both)")
    user = _user(config.users[user_name], f"user {user_name!r} in {config.origin[('users', user_name)]}") \
        if user_name else {}
    return Credentials(
        server=str(cluster["server"]).rstrip("/"), ca_pem=ca, insecure=insecure,
        tls_server_name=str(cluster["tls-server-name"]) if cluster.get("tls-server-name") else None,
        proxy_url=_proxy(cluster, where), disable_compression=bool(cluster.get("disable-compression")),
        cluster_extension=next((e.get("extension") for e in cluster.get("extensions") or []
                                if isinstance(e, dict) and e.get("name") == "client.authentication.k8s.io/exec"),
                               None),
        namespace=str(ctx.get("namespace") or "default"),
        source=f"context {name!r} of {config.describe()}", **user,
    )


def in_cluster(environ: Mapping[str, str] | None = None, account: Path | None = None) -> Credentials | None:
    """The pod's ServiceAccount, as client-go's InClusterConfig reads it; None outside a pod."""
    environ = os.environ if environ is None else environ
    account = SERVICE_ACCOUNT if account is None else account
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not (account / "token").is_file():
        return None
    host = f"[{host}]" if ":" in host else host
    namespace = environ.get("POD_NAMESPACE") or ""
    if not namespace and (account / "namespace").is_file():
        namespace = (account / "namespace").read_text().strip()
    return Credentials(server=f"https://{host}:{port}", ca_pem=(account / "ca.crt").read_bytes(),
                       token_file=account / "token", namespace=namespace or "default",
                       source=f"the pod's ServiceAccount ({account})")


def resolve(explicit: Path | str | None = None, context: str | None = None, *, pod_first: bool = False,
            environ: Mapping[str, str] | None = None, account: Path | None = None) -> Credentials:
    """The credentials to use: ``--kubeconfig``, then $KUBECONFIG, then ~/.kube/config, then the
    pod's ServiceAccount (kubectl's order). ``pod_first``: the pod's ServiceAccount before any
    kubeconfig but ``explicit`` (the controller's and the agent's order, Kopf's too)."""
    environ = os.environ if environ is None else environ
    if pod_first and explicit is None and context is None:
        found = in_cluster(environ, account)
        if found is not None:
            return found
    paths, how = kubeconfig_paths(explicit, environ)
    config = merge(paths)
    if not config.empty or explicit is not None or context is not None:
        if config.empty and context is not None and explicit is None:
            raise KubeconfigError(f"no context {context!r}: no kubeconfig found ({how})")
        return select(config, context)
    found = in_cluster(environ, account)
    if found is None:
        raise KubeconfigError(
            f"no kubeconfig found ({how}: {'no such file' if not config.files else 'empty'}) and not in a pod (no"
            f" ServiceAccount token in {account or SERVICE_ACCOUNT}): give --kubeconfig, set $KUBECONFIG, or write"
            " ~/.kube/config (kind, your cloud's CLI or kubectl config write it)")
    return found
