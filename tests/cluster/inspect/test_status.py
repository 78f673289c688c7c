"""``gpuslice status``: the map shows what the real scheduler allocated, to whom, as the policy counts it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient
from tests.cluster.cli import Cli, run_cli
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import POLICIES, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import create_pods, published, settle

G = 10**9


def node_map(status: dict[str, Any], node: str) -> dict[str, Any]:
    return next(n for n in status["map"]["nodes"] if n["name"] == node)


async def test_the_map_shows_each_pods_slice_and_the_totals_the_policy_counts(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, gpuslice: Cli,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    policy = await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                                "slicing": {"mode": "memory", "sliceSize": "10G"},
                                "tenants": [{"namespace": namespace, "maxSlices": 3}]})
    name = policy["metadata"]["name"]
    await published(kube, node.name, 8)
    pods = ["web-0", "web-1", "web-2"]
    await create_pods(kube, namespace, "gpu-slice", pods)
    results = await settle(cluster, kube, namespace, pods, 3)

    async def counted() -> dict[str, Any] | None:
        body = await kube.get(f"{POLICIES}/{name}")
        tenants = (body.get("status") or {}).get("tenants") or []
        return body if tenants and tenants[0]["allocated"] == 3 else None

    body = await wait_for(counted, within=45, what="the policy to count the 3 allocations")
    status = (await gpuslice("status", "-o", "json")).json()

    [gpu] = node_map(status, node.name)["gpus"]
    held = [s for s in gpu["segments"] if s["state"] == "allocated"]
    assert sorted(s["holder"]["who"] for s in held) == sorted(f"{namespace}/{p}" for p in pods)
    assert sorted(d for s in held for d in s["devices"]) == sorted(r["device"] for r in results)
    assert [s["state"] for s in gpu["segments"]] == ["allocated"] * 3 + ["free"] * 5 + ["slack"]
    assert sum(s["span"] for s in gpu["segments"]) == gpu["memory"]

    [totals] = [p for p in status["policies"] if p["name"] == name]
    assert (totals["published"], totals["allocated"], totals["free"]) == (8, 3, 5)
    [tenant] = totals["tenants"]
    mine = {k: tenant[k] for k in ("namespace", "allocated", "limit", "allocatedBytes", "limitBytes")}
    assert mine == {"namespace": namespace, "allocated": 3, "limit": 3, "allocatedBytes": 30 * G, "limitBytes": 30 * G}
    # The controller's own count, from its watches, says the same.
    [recorded] = body["status"]["tenants"]
    assert {k: recorded.get(k) for k in mine} == mine


async def test_the_same_map_as_text_svg_html_and_through_the_kubectl_plugin(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, gpuslice: Cli, viewer_kubeconfig: Any,
) -> None:
    node = await gpu_node("a100-40gb", 1)
    await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                       "slicing": {"mode": "mig", "mig": {"profiles": ["3g.20gb"]}},
                       "tenants": [{"namespace": namespace}]})
    await published(kube, node.name, 2)
    await create_pods(kube, namespace, "gpu-slice", ["trainer"])
    await settle(cluster, kube, namespace, ["trainer"], 1)

    text = await gpuslice("status")
    assert text.rc == 0, text.stderr
    assert node.name in text.stdout
    assert f"{namespace}/trainer" in text.stdout
    image = await gpuslice("status", "-o", "svg")
    assert image.stdout.startswith("<svg")
    assert image.stdout.rstrip().endswith("</svg>")
    assert f"{namespace}/trainer" in image.stdout
    page = await gpuslice("status", "-o", "html")
    assert "<svg" in page.stdout
    assert namespace in page.stdout
    # kubectl runs kubectl-gpuslice from the PATH with the user's arguments: the same command.
    plugin = await run_cli([str(_bin("kubectl-gpuslice"))], "status", "-o", "json", "--kubeconfig",
                           str(viewer_kubeconfig))
    [gpu] = node_map(plugin.json(), node.name)["gpus"]
    assert [[s["state"], s["placement"]] for s in gpu["segments"]] in (
        [["free", [0, 4]], ["allocated", [4, 4]]], [["allocated", [0, 4]], ["free", [4, 4]]])


def _bin(name: str) -> Path:
    path = Path(sys.executable).parent / name
    assert path.exists(), f"{name} is not installed next to {sys.executable}: pip install -e . installs it"
    return path


async def test_an_identity_that_may_not_read_is_told_which_role_to_bind(
    kube: KubeClient, controller: ControllerProcess, viewer_kubeconfig: Any, tmp_path: Any, unique: str,
) -> None:
    name = f"nobody-{unique}"
    await kube.create("/api/v1/namespaces/default/serviceaccounts", {"metadata": {"name": name}})
    token = await kube.create(f"/api/v1/namespaces/default/serviceaccounts/{name}/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}})
    config = yaml.safe_load(viewer_kubeconfig.read_text())
    config["users"][0]["user"]["token"] = token["status"]["token"]
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    try:
        result = await run_cli([sys.executable, "-m", "gpuslice"], "status", "--kubeconfig", str(path))
    finally:
        await kube.delete(f"/api/v1/namespaces/default/serviceaccounts/{name}")
    assert result.rc == 1
    assert "Traceback" not in result.stderr
    assert "is forbidden for this identity" in result.stderr
    assert "bind the ClusterRole gpuslice-viewer (manifests/viewer-rbac.yaml)" in result.stderr
