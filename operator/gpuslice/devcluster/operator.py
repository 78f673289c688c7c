"""gpuslice itself on the dev cluster: the CRD, the controller's RBAC and identity,
and the controller as one more supervised process.

The controller runs as its ServiceAccount with the RBAC of
``manifests/controller-rbac.yaml``, exactly as it would in a real cluster, so
the dev cluster exercises least privilege rather than an admin shortcut.
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Any

import yaml

from gpuslice.api.crd import crd
from gpuslice.devcluster.errors import DevClusterError
from gpuslice.devcluster.process import Component, http_health
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.kube.paths import object_path

FIELD_MANAGER = "gpuslice-dev-cluster"
CONTROLLER_SA = ("gpuslice-system", "gpuslice-controller")
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


async def install(kube: KubeClient, state_dir: Path, server: str, ca_pem: bytes) -> Path:
    """Install the CRD and RBAC; return a kubeconfig for the controller's ServiceAccount."""
    rbac = [d for d in yaml.safe_load_all((manifests_dir() / "controller-rbac.yaml").read_text()) if d]
    try:
        await apply_all(kube, [crd(), *rbac])
        namespace, name = CONTROLLER_SA
        token = await kube.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": TOKEN_SECONDS}},
        )
    except KubeError as error:
        raise DevClusterError(f"Installing gpuslice into the dev cluster failed: {error}") from error
    cluster = {"name": "gpuslice-dev", "cluster": {"server": server,
                                                   "certificate-authority-data": base64.b64encode(ca_pem).decode()}}
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": name, "user": {"token": token["status"]["token"]}}],
        "contexts": [{"name": name, "context": {"cluster": cluster["name"], "user": name}}],
        "current-context": name,
    }
    path = state_dir / "controller.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def controller_component(kubeconfig: Path, log: Path, liveness_port: int) -> Component:
    return Component(
        "gpuslice-controller",
        [sys.executable, "-m", "gpuslice", "controller", f"--kubeconfig={kubeconfig}",
         f"--liveness-port={liveness_port}"],
        log, http_health(f"http://127.0.0.1:{liveness_port}/healthz"), startup_timeout=60,
    )
