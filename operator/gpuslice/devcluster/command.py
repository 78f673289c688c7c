"""``gpuslice dev-cluster``: the local real control plane as a command."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from gpuslice.devcluster import binaries
from gpuslice.devcluster.cluster import ClusterSpec
from gpuslice.devcluster.errors import DevClusterError
from gpuslice.devcluster.mocknvml import MOCK_MODELS
from gpuslice.devcluster.nodes import FAKE_GPU_MODELS
from gpuslice.devcluster.state import StateDir, default_state_dir
from gpuslice.devcluster.supervisor import run_foreground, start_detached, stop_detached

state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=default_state_dir,
    show_default="~/.local/state/gpuslice/dev-cluster",
    help="Where certificates, etcd data, logs and the kubeconfig live.",
)


kube_version_option = click.option(
    "--kube-version", envvar=binaries.KUBE_VERSION_ENV, default=None, metavar="MINOR",
    help="The Kubernetes minor to run, such as 1.36: its stock control plane, built from hack/kube"
         " (go.mod's minor by default; another needs its go.1.MINOR.mod). Env: GPUSLICE_KUBE_VERSION.",
)


def fail(error: DevClusterError) -> None:
    click.echo(f"dev-cluster: {error}", err=True)
    sys.exit(1)


@click.group("dev-cluster")
def dev_cluster() -> None:
    """A real local control plane (etcd, kube-apiserver, kube-scheduler,
    kube-controller-manager) with fake GPU nodes."""


@dev_cluster.command("up")
@click.option("--nodes", default=1, show_default=True, help="Fake GPU nodes to create.")
@click.option("--gpus-per-node", default=8, show_default=True, help="Fake GPUs on each node.")
@click.option(
    "--gpu-model", type=click.Choice(sorted({*FAKE_GPU_MODELS, *MOCK_MODELS})), default="h100-80gb",
    show_default=True,
    help="Model of the fake GPUs, or a whole system with its NUMA nodes, PCIe roots and NVLink (dgx-h100,"
         " pcie-l40s, h100-nvl: its own GPUs, whatever --gpus-per-node says; the fake backend only);"
         " b200-180gb: --gpu-backend nvml only.",
)
@click.option("--gpu-backend", type=click.Choice(["fake", "nvml"]), default="fake", show_default=True,
              help="fake: the agent's fake backend; nvml: its NVML backend on gpuslice's mock libnvidia-ml (go-nvml's"
                   " DGX mocks) under a fake driver root, the toolkit's spec written by nvidia-ctk (needs root; the"
                   " first run builds both from Go modules, about 2 minutes).")
@click.option("--apiserver-port", type=int, default=None, help="Fixed API server port (default: a free one).")
@click.option("--operator/--no-operator", default=True, show_default=True,
              help="Install gpuslice (CRD, RBAC) and run its controller and one node agent per fake node.")
@click.option("--pod-runner/--no-pod-runner", default=True, show_default=True,
              help="Run a pod runner (the kubelet's plugin and DRA managers) behind each fake node.")
@click.option("--detach", is_flag=True, help="Start in the background and return once it is up.")
@kube_version_option
@state_dir_option
def up(
    nodes: int, gpus_per_node: int, gpu_model: str, gpu_backend: str, apiserver_port: int | None,
    operator: bool, pod_runner: bool, detach: bool, kube_version: str | None, state_dir: Path,
) -> None:
    """Start the cluster; print the admin kubeconfig's path when it is up.

    In the foreground it runs until Ctrl-C; with --detach it returns and
    `gpuslice dev-cluster down` stops it.
    """
    spec = ClusterSpec(state_dir, nodes, gpus_per_node, gpu_model, apiserver_port, operator, pod_runner,
                       backend=gpu_backend, kube_version=kube_version)
    try:
        spec.validate()
    except DevClusterError as error:
        fail(error)
    if detach:
        argv = ["dev-cluster", "up", f"--nodes={nodes}", f"--gpus-per-node={gpus_per_node}",
                f"--gpu-model={gpu_model}", f"--gpu-backend={gpu_backend}", f"--state-dir={state_dir}",
                "--operator" if operator else "--no-operator",
                "--pod-runner" if pod_runner else "--no-pod-runner"]
        if apiserver_port is not None:
            argv.append(f"--apiserver-port={apiserver_port}")
        if kube_version is not None:
            argv.append(f"--kube-version={kube_version}")
        sys.exit(start_detached(spec, argv))
    sys.exit(asyncio.run(run_foreground(spec)))


@dev_cluster.command("down")
@state_dir_option
def down(state_dir: Path) -> None:
    """Stop the cluster running from the state directory."""
    try:
        click.echo(stop_detached(StateDir(state_dir)), err=True)
    except DevClusterError as error:
        fail(error)


@dev_cluster.command("kubeconfig")
@state_dir_option
def kubeconfig(state_dir: Path) -> None:
    """Print the path of the running cluster's admin kubeconfig."""
    state = StateDir(state_dir)
    try:
        record = state.running_record()
    except DevClusterError as error:
        fail(error)
    if record is None:
        fail(DevClusterError(
            f"No dev cluster is running from {state.root}. Start one with:"
            f" gpuslice dev-cluster up --detach --state-dir {state.root}"
        ))
    else:
        click.echo(record.kubeconfig)


@dev_cluster.command("exec-env")
@click.argument("pod")
@click.argument("container", required=False)
@state_dir_option
def exec_env(pod: str, container: str | None, state_dir: Path) -> None:
    """Print the environment a container of NAMESPACE/POD received on a fake node, as
    `kubectl exec POD -- env` would show it on a real one (nothing is executed here)."""
    from gpuslice.devcluster.recorded import RecordedContainer, find_recorded

    try:
        found: RecordedContainer = find_recorded(StateDir(state_dir), pod, container)
    except DevClusterError as error:
        fail(error)
    else:
        for line in found.env:
            click.echo(line)


@dev_cluster.command("build")
@kube_version_option
def build(kube_version: str | None) -> None:
    """Build the control-plane binaries from Go modules (cached by content hash)."""

    async def run() -> binaries.Binaries:
        return await binaries.build(await binaries.describe_build(minor=kube_version))

    given = binaries.user_binaries()
    if all(name in given.paths for name in (*binaries.COMPONENTS, binaries.POD_RUNNER)):
        click.echo(f"Nothing to build: every binary comes from your variables ({given.origin}).", err=True)
        click.echo(given["kube-apiserver"].parent)
        return
    try:
        built = asyncio.run(run())
    except DevClusterError as error:
        fail(error)
    else:
        click.echo(built["kube-apiserver"].parent)
