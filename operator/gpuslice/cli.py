"""The ``gpuslice`` command."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click
from rich.console import Console

from gpuslice import __version__
from gpuslice.devcluster.cluster import ClusterSpec
from gpuslice.devcluster.command import dev_cluster, fail
from gpuslice.devcluster.errors import DevClusterError


@click.group()
@click.version_option(__version__, prog_name="gpuslice")
def main() -> None:
    """gpuslice: per-tenant GPU slicing policy as native Kubernetes DRA."""


main.add_command(dev_cluster)


@main.command()
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
              help="Kubeconfig to use (default: in-cluster service account, then $KUBECONFIG).")
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus metrics on this port.")
@click.option("--liveness-port", type=int, default=None, help="Serve Kopf's /healthz on this port.")
def controller(kubeconfig: str | None, metrics_port: int | None, liveness_port: int | None) -> None:
    """Run the policy controller: GpuSlicePolicy -> DeviceClass, claim templates, quota, admission."""
    from gpuslice.controller.run import run_controller

    asyncio.run(run_controller(kubeconfig, metrics_port, liveness_port))


@main.command()
@click.option("--nodes", default=2, show_default=True, help="Fake GPU nodes to create.")
@click.option("--gpus-per-node", default=8, show_default=True)
@click.option("--gpu-model", default="h100-80gb", show_default=True)
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="State directory (default: ~/.local/state/gpuslice/demo).")
def demo(nodes: int, gpus_per_node: int, gpu_model: str, state_dir: Path | None) -> None:
    """A real control plane with fake GPU nodes and gpuslice: apply an example policy, show what it made."""
    from gpuslice.demo import demo_state_dir, run_demo

    spec = ClusterSpec(state_dir or demo_state_dir(), nodes, gpus_per_node, gpu_model, operator=True)
    try:
        console = Console()
        if not console.is_terminal:
            console = Console(width=120)  # logs and CI: wide enough for the tables
        ok = asyncio.run(run_demo(spec, console))
    except DevClusterError as error:
        fail(error)
    sys.exit(0 if ok else 1)
