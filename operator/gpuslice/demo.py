"""``gpuslice demo``: the local control plane with fake GPU nodes, and what it serves.

It doubles as a smoke test: it exits non-zero when the cluster does not come
up or does not serve the DRA API gpuslice builds on.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpuslice.devcluster.cluster import ClusterSpec, DevCluster
from gpuslice.inventory.nodes import FAKE_COUNT as LABEL_COUNT
from gpuslice.inventory.nodes import FAKE_MODEL as LABEL_MODEL
from gpuslice.kube.client import KubeClient
from gpuslice.kube.discovery import served_resources

DRA_GROUP = "resource.k8s.io"
NEEDED = ("deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices")


async def run_demo(spec: ClusterSpec, console: Console) -> bool:
    """Bring the cluster up, show it, stop it; True when everything needed is served."""
    async with DevCluster(spec, report=lambda m: console.print(f"[dim]{m}[/dim]")) as cluster:
        async with await KubeClient.from_kubeconfig(cluster.kubeconfig) as kube:
            nodes = await kube.list("/api/v1/nodes")
            served = await served_resources(kube, DRA_GROUP)

        table = Table(title=f"Fake GPU nodes (Kubernetes {cluster.kubernetes_version})")
        for column in ("node", "ready", "fake GPUs", "cpu", "memory", "pods"):
            table.add_column(column)
        for node in nodes:
            labels, status = node["metadata"].get("labels", {}), node["status"]
            ready = next((c["status"] for c in status.get("conditions", []) if c["type"] == "Ready"), "?")
            alloc = status.get("allocatable", {})
            table.add_row(
                node["metadata"]["name"], ready,
                f"{labels.get(LABEL_COUNT, '?')} x {labels.get(LABEL_MODEL, '?')}",
                alloc.get("cpu", ""), alloc.get("memory", ""), alloc.get("pods", ""),
            )
        console.print(table)

        api = Table(title=f"Served {DRA_GROUP} API")
        api.add_column("version")
        api.add_column("resources")
        for version, resources in served.items():
            api.add_row(version, ", ".join(resources))
        console.print(api)

        missing = [r for r in NEEDED if r not in served.get("v1", [])]
        assert cluster.features is not None
        taint_version = cluster.features.taint_rule_version
        if "devicetaintrules" not in served.get(taint_version, []):
            missing.append(f"devicetaintrules ({taint_version})")
        if missing:
            console.print(f"[red]Missing from {DRA_GROUP}: {', '.join(missing)}[/red]")
        else:
            console.print(
                f"[green]Ready:[/green] {len(nodes)} fake GPU node(s); the DRA API gpuslice"
                " builds on is served. Stopping the demo cluster; for one that stays up run"
                " `gpuslice dev-cluster up`."
            )
        return not missing and len(nodes) == spec.nodes


def demo_state_dir() -> Path:
    from gpuslice.devcluster.state import default_state_dir

    return default_state_dir().with_name("demo")
