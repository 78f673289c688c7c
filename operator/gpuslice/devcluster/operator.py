"""gpuslice itself on the dev cluster: the CRD, the controller's and agents' RBAC and
identities, and the controller and one agent per fake node as supervised processes.

The controller runs as its ServiceAccount with the RBAC of
``manifests/controller-rbac.yaml``, exactly as it would in a real cluster, so
the dev cluster exercises least privilege rather than an admin shortcut.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuslice.api.crd import agent_view_crd, crd, ledger_crd
from gpuslice.coordinates import node_path, object_path, token_path
from gpuslice.devcluster.errors import DevClusterError
from gpuslice.devcluster.process import Component, http_health
from gpuslice.dra.names import MEMORY_WEBHOOK_PATH
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.planning.cluster.memory_rule import memory_webhook

FIELD_MANAGER = "gpuslice-dev-cluster"
CONTROLLER_SA = ("gpuslice-system", "gpuslice-controller")
AGENT_SA = ("gpuslice-system", "gpuslice-agent")
WEBHOOK_SA = ("gpuslice-system", "gpuslice-webhook")
TOKEN_SECONDS = 7 * 24 * 3600


def manifests_dir() -> Path:
    for parent in Path(__file__).resolve().parents:
        if (parent / "manifests" / "controller-rbac.yaml").is_file():
            return parent / "manifests"
    raise DevClusterError(
        "manifests/controller-rbac.yaml was not found: the dev cluster starts the operator from a gpuslice"
        " checkout. Run from the checkout, or use --no-operator."
    )


async def apply_all(kube: KubeClient, documents: list[dict[str, Any]]) -> None:
    for document in documents:
        await kube.apply(object_path(document), document, field_manager=FIELD_MANAGER)


async def token_kubeconfig(
    kube: KubeClient, account: tuple[str, str], server: str, ca_pem: bytes, path: Path,
    bound_node: dict[str, Any] | None = None,
) -> Path:
    """A kubeconfig with a fresh token of ``account``; bound to a Node, the token carries
    the node's name, which the agent's admission policy checks."""
    namespace, name = account
    spec: dict[str, Any] = {"expirationSeconds": TOKEN_SECONDS}
    if bound_node is not None:
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Node", "name": bound_node["metadata"]["name"],
                                  "uid": bound_node["metadata"]["uid"]}
    token = await kube.create(
        token_path(namespace, name),
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    cluster = {"name": "gpuslice-dev", "cluster": {"server": server,
                                                   "certificate-authority-data": base64.b64encode(ca_pem).decode()}}
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": name, "user": {"token": token["status"]["token"]}}],
        "contexts": [{"name": name, "context": {"cluster": cluster["name"], "user": name}}],
        "current-context": name,
    }
    return _write_private(path, yaml.safe_dump(config))


def _write_private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def manifest_documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((manifests_dir() / name).read_text()) if d]


def webhook_url(port: int) -> str:
    """Where the dev cluster's API server calls the maxMemory webhook: on loopback, by URL (a real
    cluster's goes through the Service gpuslice-webhook)."""
    return f"https://127.0.0.1:{port}{MEMORY_WEBHOOK_PATH}"


async def install(kube: KubeClient, state_dir: Path, server: str, ca_pem: bytes,
                  webhook_port: int | None = None) -> tuple[Path, Path]:
    """Install the CRDs, every component's RBAC, gpuslice's admission policies and the maxMemory
    webhook's configuration (by URL on ``webhook_port``); return the controller's and the webhook's
    kubeconfigs."""
    webhook = [memory_webhook(url=webhook_url(webhook_port))] if webhook_port else []
    try:
        await apply_all(kube, [crd(), ledger_crd(), agent_view_crd(), *manifest_documents("controller-rbac.yaml"),
                               *manifest_documents("agent-rbac.yaml"), *manifest_documents("webhook-rbac.yaml"),
                               *manifest_documents("admission.yaml"), *webhook])
        return (await token_kubeconfig(kube, CONTROLLER_SA, server, ca_pem, state_dir / "controller.kubeconfig"),
                await token_kubeconfig(kube, WEBHOOK_SA, server, ca_pem, state_dir / "webhook.kubeconfig"))
    except KubeError as error:
        raise DevClusterError(f"Installing gpuslice into the dev cluster failed: {error}") from error


async def agent_kubeconfig(kube: KubeClient, node: str, state_dir: Path, server: str, ca_pem: bytes) -> Path:
    try:
        body = await kube.get(node_path(node))
        return await token_kubeconfig(kube, AGENT_SA, server, ca_pem, state_dir / f"agent-{node}.kubeconfig", body)
    except KubeError as error:
        raise DevClusterError(f"Creating the node agent's identity for {node} failed: {error}") from error


# A short Lease: a controller the dev cluster restarts after a kill acts again within seconds.
SHORT_LEASE = ("--lease-duration=6", "--renew-deadline=4", "--retry-period=1")


def controller_component(kubeconfig: Path, log: Path, liveness_port: int,
                         lease: Sequence[str] = SHORT_LEASE, extra_args: Sequence[str] = ()) -> Component:
    """``lease``: the Lease's flags; none for the defaults a real install runs with (the bench,
    whose loaded apiserver answers a renewal slower than the short Lease allows). The webhook's
    certificate also names 127.0.0.1, where this API server calls it."""
    return Component(
        "gpuslice-controller",
        [sys.executable, "-m", "gpuslice", "controller", f"--kubeconfig={kubeconfig}",
         f"--liveness-port={liveness_port}", "--webhook-hosts=127.0.0.1", *lease, *extra_args],
        log, http_health(f"http://127.0.0.1:{liveness_port}/healthz"), startup_timeout=60,
    )


def webhook_component(kubeconfig: Path, log: Path, port: int, metrics_port: int,
                      env: dict[str, str] | None = None, extra_args: Sequence[str] = ()) -> Component:
    """The maxMemory webhook on loopback; healthy once it serves (it waits for the controller to
    make its certificate). ``extra_args``: the dev cluster's ``webhook_client_flags()``, which admit
    its API server only."""
    return Component(
        "gpuslice-webhook",
        [sys.executable, "-m", "gpuslice", "webhook", f"--kubeconfig={kubeconfig}", "--address=127.0.0.1",
         f"--port={port}", f"--metrics-port={metrics_port}", *extra_args],
        log, http_health(f"http://127.0.0.1:{metrics_port}/readyz"), env=env, startup_timeout=90,
    )


def agent_dirs(node_dir: Path) -> list[str]:
    """The agent's flags for a fake node's own directories: where its pod runner (the kubelet's code)
    looks for plugins and CDI specs, and where the agent keeps its state."""
    return [f"--kubelet-registrar-dir={node_dir / 'plugins_registry'}",
            f"--kubelet-plugins-dir={node_dir / 'plugins'}", f"--cdi-dir={node_dir / 'cdi'}",
            f"--state-dir={node_dir / 'agent'}", f"--mps-shm-dir={node_dir / 'mps-shm'}",
            f"--pod-resources-socket={node_dir / 'pod-resources' / 'kubelet.sock'}", f"--host-proc={node_dir / 'proc'}"]


def agent_component(node: str, kubeconfig: Path, log: Path, metrics_port: int, node_dir: Path,
                    extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
                    backend: Sequence[str] = ("--backend=fake",)) -> Component:
    """The node agent, by default with the fake backend (it reads the GPUs from its Node's labels);
    ``backend``: its flags for another (``mocknvml.NvmlNode.agent_args``). It serves its kubelet plugin
    in the node's directories."""
    return Component(
        f"gpuslice-agent-{node}",
        [sys.executable, "-m", "gpuslice", "agent", f"--node={node}", *backend,
         f"--kubeconfig={kubeconfig}", f"--metrics-port={metrics_port}", *agent_dirs(node_dir), *extra_args],
        log, http_health(f"http://127.0.0.1:{metrics_port}/metrics"), env=env, startup_timeout=30,
    )
