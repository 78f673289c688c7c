"""Kubeconfigs read as kubectl reads them (k8s.io/client-go/tools/clientcmd, v0.37).

Which files: ``--kubeconfig`` alone when given (it must exist); else every file ``$KUBECONFIG``
lists, merged (missing ones skipped); else ``~/.kube/config``. Merged as clientcmd merges: the
first file that names a cluster, user or context wins it, and the first that sets
``current-context`` wins that; a relative path is relative to the file that holds it. Only when
no file gives anything (none exists, or all are empty) does the CLI fall back to the pod's
ServiceAccount, as kubectl does. The controller and agent try their pod's ServiceAccount first
(see :func:`resolve`); the controller's Kopf session is built from the same credentials.

Every field of the chosen context, cluster and user is either honoured or refused with a
message that names it (``kubeconfig_fields``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuslice.kube.credentials import Credentials, KubeconfigError
from gpuslice.kube.kubeconfig_fields import (
    CONTEXT_FIELDS,
    cluster_fields,
    refuse_unknown,
    server_url,
    text,
    user_fields,
)
from gpuslice.kube.tls import check

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = "~/.kube/config"


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
    where = f"context {name!r} in {config.origin[('contexts', name)]}"
    refuse_unknown(ctx, CONTEXT_FIELDS, where)
    cluster_name, user_name = text(ctx, "cluster", where), text(ctx, "user", where)
    if cluster_name not in config.clusters:
        raise KubeconfigError(f"context {name!r} names cluster {cluster_name!r}, which kubeconfig"
                              f" {config.describe()} does not have")
    if user_name and user_name not in config.users:
        raise KubeconfigError(f"context {name!r} names user {user_name!r}, which kubeconfig {config.describe()}"
                              " does not have")
    cluster_where = f"cluster {cluster_name!r} in {config.origin[('clusters', cluster_name)]}"
    cluster = cluster_fields(config.clusters[cluster_name], cluster_where)
    user = user_fields(config.users[user_name], f"user {user_name!r} in {config.origin[('users', user_name)]}") \
        if user_name else {}
    tls = bool(cluster["ca_pem"] or cluster["insecure"] or user.get("cert_pem"))
    cluster["server"] = server_url(cluster["server"], tls, cluster_where)
    return Credentials(namespace=text(ctx, "namespace", where) or "default",
                       source=f"context {name!r} of {config.describe()}",
                       user_origin=(config.origin[("users", user_name)], user_name) if user_name else None,
                       **cluster, **user)


def in_cluster(environ: Mapping[str, str] | None = None, account: Path | None = None) -> Credentials | None:
    """The pod's ServiceAccount, as client-go's InClusterConfig reads it; None outside a pod."""
    environ = os.environ if environ is None else environ
    account = SERVICE_ACCOUNT if account is None else account
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not (account / "token").is_file():
        return None
    host = f"[{host}]" if ":" in host else host
    source = f"the pod's ServiceAccount ({account})"
    try:
        namespace = environ.get("POD_NAMESPACE") or ""
        if not namespace and (account / "namespace").is_file():
            namespace = (account / "namespace").read_text().strip()
        ca = (account / "ca.crt").read_bytes()
    except OSError as error:
        raise KubeconfigError(f"{source}: {Path(error.filename or '').name}: {error.strerror or error}") from None
    return Credentials(server=f"https://{host}:{port}", ca_pem=ca, ca_origin=f"{source}: ca.crt",
                       ca_file=account / "ca.crt", token_file=account / "token", namespace=namespace or "default",
                       source=source)


def resolve(explicit: Path | str | None = None, context: str | None = None, *, pod_first: bool = False,
            environ: Mapping[str, str] | None = None, account: Path | None = None) -> Credentials:
    """The credentials to use: ``--kubeconfig``, then $KUBECONFIG, then ~/.kube/config, then the
    pod's ServiceAccount (kubectl's order). ``pod_first``: the pod's ServiceAccount before any
    kubeconfig but ``explicit`` (the controller's and the agent's order). Their TLS material is
    checked here, so that a bad CA or key is named before any request."""
    found = _resolve(explicit, context, pod_first, os.environ if environ is None else environ, account)
    check(found)
    return found


def _resolve(explicit: Path | str | None, context: str | None, pod_first: bool, environ: Mapping[str, str],
             account: Path | None) -> Credentials:
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
