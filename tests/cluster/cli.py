"""The inspecting commands as a platform engineer runs them: the real CLI in its own process, as an
identity that holds only the read-only ClusterRole of manifests/viewer-rbac.yaml."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import wait_for
from tests.cluster.operator_fixtures import MANIFESTS, apply_manifests

VIEWER = ("default", "gpuslice-viewer-test")


@pytest.fixture(scope="session")
async def viewer_kubeconfig(cluster: DevCluster, kube: KubeClient, policy_crd: str,
                            tmp_path_factory: pytest.TempPathFactory) -> Path:
    await apply_manifests(kube, (MANIFESTS / "viewer-rbac.yaml").read_text())
    namespace, name = VIEWER
    await apply_manifests(kube, yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpuslice-viewer"},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": "gpuslice-system"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpuslice-viewer"},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ]))
    token = await kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}})
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    path = tmp_path_factory.mktemp("viewer") / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": admin["clusters"],
        "users": [{"name": name, "user": {"token": token["status"]["token"]}}],
        "contexts": [{"name": name, "context": {"cluster": admin["clusters"][0]["name"], "user": name}}],
        "current-context": name}))
    return path


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        assert self.rc == 0, self.stderr
        return json.loads(self.stdout)


Cli = Callable[..., Awaitable[Result]]


async def run_cli(program: list[str], *args: str) -> Result:
    process = await asyncio.create_subprocess_exec(*program, *args, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return Result(process.returncode or 0, out.decode(), err.decode())


@pytest.fixture
def gpuslice(viewer_kubeconfig: Path) -> Cli:
    """``gpuslice ARGS`` as the viewer; stdout and stderr kept apart."""

    async def run(*args: str) -> Result:
        return await run_cli([sys.executable, "-m", "gpuslice"], *args, "--kubeconfig", str(viewer_kubeconfig))

    return run


async def warning(kube: KubeClient, namespace: str, pod: str, reason: str) -> dict[str, Any]:
    async def found() -> dict[str, Any] | None:
        events = await kube.list(f"/api/v1/namespaces/{namespace}/events",
                                 fieldSelector=f"involvedObject.name={pod}")
        return next((e for e in events if e.get("reason") == reason), None)

    result: dict[str, Any] = await wait_for(found, within=60, what=f"a {reason} Event on {namespace}/{pod}")
    return result


def impersonating(cluster: DevCluster, path: Path, user: str, namespace: str) -> Path:
    """The admin's kubeconfig with a second context, ``as-user``: the admin's credentials acting as
    ``user`` (Impersonate-User), in ``namespace``."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    admin = config["contexts"][0]["context"]
    config["users"].append({"name": "as-user", "user": {
        **next(u["user"] for u in config["users"] if u["name"] == admin["user"]), "as": user}})
    config["contexts"].append({"name": "as-user", "context": {
        "cluster": admin["cluster"], "user": "as-user", "namespace": namespace}})
    path.write_text(yaml.safe_dump(config))
    return path


def findings(result: dict[str, Any]) -> dict[str, str]:
    """``gpuslice why -o json``'s findings: each code and its message."""
    return {f["code"]: f["message"] for f in result["findings"]}
