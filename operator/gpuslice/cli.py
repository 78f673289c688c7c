"""The ``gpuslice`` command."""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path
from typing import Any, ClassVar

import click
import pydantic

from gpuslice import __version__
from gpuslice.agent.kubeletplugin.settings import PluginSettings
from gpuslice.agent.settings import HealthSettings
from gpuslice.controller.settings import ControllerSettings
from gpuslice.settings import KUBECONFIG_HELP, Settings, markdown, options

# Every process's settings, by the name docs/configuration.md gives it.
DOCUMENTED: dict[str, type[Settings]] = {"controller": ControllerSettings}


class LazyGroup(click.Group):
    """Subcommands imported when they run: ``gpuslice controller`` and ``gpuslice agent`` never load
    the dev cluster (certificates, process supervision) or rich."""

    LAZY: ClassVar[dict[str, str]] = {"dev-cluster": "gpuslice.devcluster.command:dev_cluster",
                                      "fake-gpu": "gpuslice.fakegpu:fake_gpu",
                                      "status": "gpuslice.inspect.commands:status",
                                      "why": "gpuslice.inspect.commands:why"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.LAZY:
            module, _, attribute = self.LAZY[name].partition(":")
            command: click.Command = getattr(importlib.import_module(module), attribute)
            return command
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="gpuslice")
def main() -> None:
    """gpuslice: per-tenant GPU slicing policy as native Kubernetes DRA."""


@main.command()
@options(ControllerSettings)
def controller(**values: Any) -> None:
    """Run the policy controller: GpuSlicePolicy -> DeviceClass, claim templates, quota, Events and status.
    Every flag is also an environment variable (GPUSLICE_<FLAG>); docs/configuration.md lists them."""
    from gpuslice.controller.run import ControllerStopped, run_controller

    try:
        settings = ControllerSettings(**values)
    except pydantic.ValidationError as error:
        raise click.UsageError("; ".join(e["msg"] for e in error.errors())) from None
    try:
        asyncio.run(run_controller(settings))
    except ControllerStopped as error:
        click.echo(f"controller: {error}", err=True)
        sys.exit(1)


@main.command(name="settings-docs", hidden=True)
def settings_docs() -> None:
    """Print the settings tables of docs/configuration.md (generated from the models)."""
    for name, model in DOCUMENTED.items():
        click.echo(f"<!-- settings: {name} -->\n{markdown(model)}<!-- end -->\n")


@main.command()
@click.option("--node", required=True, envvar="NODE_NAME", help="This node's name (env NODE_NAME in a DaemonSet).")
@click.option("--backend", type=click.Choice(["nvml", "fake"]), default="nvml", show_default=True)
@click.option("--fake-gpus", default=None, help="Fake backend: MODEL:COUNT[,MODEL:COUNT]; default: the node's labels.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None)
@click.option("--resync", default=60.0, show_default=True, help="Seconds between full checks of the pool.")
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus metrics on this port.")
@click.option("--kubelet-registrar-dir", type=click.Path(file_okay=False, path_type=Path),
              default=PluginSettings.registrar_dir, show_default=True,
              help="The kubelet's plugin registry: the plugin's registration socket goes here.")
@click.option("--kubelet-plugins-dir", type=click.Path(file_okay=False, path_type=Path),
              default=PluginSettings.plugins_dir, show_default=True,
              help="The kubelet's plugins directory: the service socket goes in its gpu.gpuslice.dev/.")
@click.option("--cdi-dir", type=click.Path(file_okay=False, path_type=Path), default=PluginSettings.cdi_dir,
              show_default=True, help="Where the container runtime reads CDI specs: one per prepared claim.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Claim checkpoints, what was published, fake GPU state"
                   " [default: KUBELET_PLUGINS_DIR/gpu.gpuslice.dev].")
@click.option("--health-interval", default=HealthSettings.interval, show_default=True,
              help="Seconds between checks of the GPUs' health.")
@click.option("--health-recovery", default=HealthSettings.recovery, show_default=True,
              help="Seconds an unhealthy GPU must go without a fault before its taint is lifted.")
@click.option("--nvidia-cdi-dir", "nvidia_cdi_dirs", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="NVML backend: where the NVIDIA Container Toolkit's CDI spec is [default: /etc/cdi, /var/run/cdi].")
def agent(node: str, backend: str, fake_gpus: str | None, kubeconfig: str | None, resync: float,
          metrics_port: int | None, kubelet_registrar_dir: Path, kubelet_plugins_dir: Path, cdi_dir: Path,
          state_dir: Path | None, health_interval: float, health_recovery: float,
          nvidia_cdi_dirs: tuple[Path, ...]) -> None:
    """Run the node agent: discover GPUs, publish this node's pool of slices, and serve the kubelet
    plugin that prepares them for pods."""
    from gpuslice.agent.gpus import GpuBackend, GpuBackendError
    from gpuslice.agent.gpus.fake import FakeBackend, parse_fake_gpus
    from gpuslice.agent.gpus.nvml import NvmlBackend
    from gpuslice.agent.kubeletplugin.settings import PluginPathError
    from gpuslice.agent.run import discover_fake_from_node, run_agent
    from gpuslice.kube.client import KubeClient

    settings = PluginSettings(kubelet_registrar_dir, kubelet_plugins_dir, cdi_dir, state_dir)

    async def main_() -> None:
        chosen: GpuBackend
        if backend == "fake":
            spec = fake_gpus
            if spec is None:
                async with await KubeClient.from_kubeconfig(kubeconfig) as kube:
                    spec = await discover_fake_from_node(kube, node)
            chosen = FakeBackend(node, parse_fake_gpus(spec), settings.resolved_state_dir)
        else:
            chosen = NvmlBackend(cdi_dirs=nvidia_cdi_dirs) if nvidia_cdi_dirs else NvmlBackend()
        await run_agent(node, chosen, kubeconfig, resync, metrics_port, settings,
                        HealthSettings(health_interval, health_recovery))

    try:
        asyncio.run(main_())
    except (GpuBackendError, PluginPathError) as error:
        click.echo(f"agent: {error}", err=True)
        sys.exit(1)


@main.command()
@click.option("-f", "--filename", "files", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="A GpuSlicePolicy YAML file (repeat for several).")
@click.option("--gpus", default="h100-80gb:1", show_default=True, help="The node's GPUs, MODEL:COUNT[,MODEL:COUNT].")
@click.option("--node", default="node-1", show_default=True, help="Node name for the slices.")
@click.option("--node-label", "node_labels", multiple=True, help="A node label KEY=VALUE the policies may select on.")
@click.option("--from", "previous", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="The policies as they are now (repeat for several): show the MIG reconfiguration steps from them."
                   " Not with --cluster, which reads them from the cluster.")
@click.option("--cluster", is_flag=True, help=(
    "Against the live cluster: what applying these (edited or new) policies would add, drain and hold on every"
    " node, from its published devices and claims. Nothing is written."))
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None, envvar="GPUSLICE_KUBECONFIG",
              help=f"With --cluster: {KUBECONFIG_HELP}")
@click.option("-o", "--output", type=click.Choice(["text", "json", "yaml"]), default="text", show_default=True,
              help="With --cluster: how to print the plan.")
def plan(files: tuple[str, ...], gpus: str, node: str, node_labels: tuple[str, ...], previous: tuple[str, ...],
         cluster: bool, kubeconfig: str | None, output: str) -> None:
    """Print the ResourceSlices a node agent would publish for these policies, no cluster needed
    (with --cluster: what an edit would do to the live cluster)."""
    if cluster:
        if previous:
            raise click.UsageError("--from is for a plan without a cluster; with --cluster the policies as they are"
                                   " now come from the cluster.")
        from gpuslice.inspect.commands import cluster_plan

        cluster_plan(kubeconfig, [Path(f) for f in files], output)
        return
    from gpuslice.preview import PlanError, preview

    try:
        text = preview([Path(f) for f in files], gpus, node, dict(label.split("=", 1) for label in node_labels),
                       [Path(f) for f in previous])
    except PlanError as error:
        click.echo(f"plan: {error}", err=True)
        sys.exit(1)
    click.echo(text, nl=False)


@main.command()
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="State directory (default: ~/.local/state/gpuslice/demo).")
def demo(state_dir: Path | None) -> None:
    """A real control plane with two fake GPU nodes, their pod runners and gpuslice: apply example policies,
    run tenant pods on their slices, show what each received."""
    from rich.console import Console

    from gpuslice.demo import SHAPES, demo_state_dir, run_demo
    from gpuslice.devcluster.cluster import ClusterSpec
    from gpuslice.devcluster.command import fail
    from gpuslice.devcluster.errors import DevClusterError

    spec = ClusterSpec(state_dir or demo_state_dir(), operator=True, pod_runner=True, shapes=SHAPES)
    try:
        console = Console()
        if not console.is_terminal:
            console = Console(width=120)  # logs and CI: wide enough for the tables
        ok = asyncio.run(run_demo(spec, console))
    except DevClusterError as error:
        fail(error)
    sys.exit(0 if ok else 1)
