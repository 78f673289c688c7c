"""The ``gpuslice`` command."""

from __future__ import annotations

import asyncio
import importlib
import sys
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import click
from click.core import ParameterSource

from gpuslice import __version__
from gpuslice.agent.settings import AgentSettings
from gpuslice.controller.settings import ControllerSettings
from gpuslice.inspect.extra import need_cli_extra
from gpuslice.kube.useragent import set_component
from gpuslice.settings import ClusterAccess, Settings, from_flags, markdown, options
from gpuslice.webhook.settings import WebhookSettings

# Every process's settings, by the name docs/configuration.md gives it.
DOCUMENTED: dict[str, type[Settings]] = {"controller": ControllerSettings, "agent": AgentSettings,
                                         "webhook": WebhookSettings, "cli": ClusterAccess}


def _needs_extra(name: str, missing: click.ClickException) -> click.Command:
    """Listed in help like any command; running it says how to get the extra."""

    def fail(**_: Any) -> None:
        raise missing

    return click.Command(name, callback=fail, help=f"(needs the cli extra: pip install 'gpuslice[cli]') {name}",
                         context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                           "help_option_names": []})


class LazyGroup(click.Group):
    """Subcommands imported when they run: ``gpuslice controller`` and ``gpuslice agent`` never load
    the dev cluster (certificates, process supervision) or rich."""

    LAZY: ClassVar[dict[str, str]] = {"dev-cluster": "gpuslice.devcluster.command:dev_cluster",
                                      "fake-gpu": "gpuslice.fakegpu:fake_gpu",
                                      "status": "gpuslice.inspect.commands:status",
                                      "why": "gpuslice.inspect.commands:why",
                                      "delete-policies": "gpuslice.uninstall:delete_policies",
                                      "defrag": "gpuslice.inspect.defrag:defrag"}
    EXTRA: ClassVar[dict[str, tuple[str, ...]]] = {"dev-cluster": ("rich",), "status": ("rich",),
                                                   "why": ("rich",), "defrag": ("rich",)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.EXTRA:
            try:
                need_cli_extra(f"gpuslice {name}", self.EXTRA[name])
            except click.ClickException as missing:
                return _needs_extra(name, missing)
        if name in self.LAZY:
            module, _, attribute = self.LAZY[name].partition(":")
            command: click.Command = getattr(importlib.import_module(module), attribute)
            return command
        return super().get_command(ctx, name)


S = TypeVar("S", bound=Settings)


def _settings(model: type[S], values: dict[str, Any]) -> S:
    return from_flags(model, values)


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="gpuslice")
def main() -> None:
    """gpuslice: per-tenant GPU slicing policy as native Kubernetes DRA."""
    set_component("gpuslice-cli")  # the User-Agent; `controller` and `agent` name themselves


@main.command()
@options(ControllerSettings)
def controller(**values: Any) -> None:
    """Run the policy controller: GpuSlicePolicy -> DeviceClass, claim templates, quota, Events and status.
    Every flag is also an environment variable (GPUSLICE_<FLAG>); docs/configuration.md lists them."""
    from gpuslice.controller.run import ControllerStopped, run_controller
    from gpuslice.kube.credentials import KubeconfigError

    set_component("gpuslice-controller")
    settings = _settings(ControllerSettings, values)
    try:
        asyncio.run(run_controller(settings))
    except (ControllerStopped, KubeconfigError) as error:
        click.echo(f"controller: {error}", err=True)
        sys.exit(1)


@main.command()
@options(WebhookSettings)
def webhook(**values: Any) -> None:
    """Run the maxMemory webhook: charge each allocation of a tenant with maxMemory to its ledger,
    exactly under concurrent allocations, and release what is charged and not held. Every flag is
    also an environment variable (GPUSLICE_<FLAG>); docs/configuration.md lists them."""
    from gpuslice.kube.credentials import KubeconfigError
    from gpuslice.webhook.callers import ClientCaError
    from gpuslice.webhook.run import run_webhook

    set_component("gpuslice-webhook")
    settings = _settings(WebhookSettings, values)
    try:
        asyncio.run(run_webhook(settings))
    except (KubeconfigError, ClientCaError) as error:
        click.echo(f"webhook: {error}", err=True)
        sys.exit(1)


@main.command(name="settings-docs", hidden=True)
def settings_docs() -> None:
    """Print the settings lists of docs/configuration.md (generated from the models; `make reference` writes
    them into the page, between their markers)."""
    for name, model in DOCUMENTED.items():
        click.echo(f"<!-- settings: {name} -->\n{markdown(model)}<!-- end -->\n")


@main.command()
@options(AgentSettings)
@click.option("--check", is_flag=True, help=(
    "Read-only GPU check (--backend nvml): print the GPUs, the attributes of each kind of device, the MIG"
    " profiles and instances, NVML's memory against the catalog and the CDI edits each device would get, then"
    " exit (1 if something is wrong). Only NVML queries: no MIG mode or GPU setting is changed, nothing is"
    " written, no API server is needed."))
def agent(check: bool, **values: Any) -> None:
    """Run the node agent: discover GPUs, publish this node's pool of slices, and serve the kubelet
    plugin that prepares them for pods. Every flag is also an environment variable (GPUSLICE_<FLAG>);
    docs/configuration.md lists them."""
    from gpuslice.agent.gpus import GpuBackendError
    from gpuslice.agent.kubeletplugin.settings import PluginPathError
    from gpuslice.agent.run import AgentStopped, run_agent
    from gpuslice.kube.credentials import KubeconfigError

    set_component("gpuslice-agent")
    settings = _settings(AgentSettings, values)
    if check:
        if settings.backend != "nvml":
            raise click.UsageError("--check reads real GPUs: use it with --backend nvml")
        import pynvml

        from gpuslice.agent.check import run_check

        sys.exit(run_check(pynvml, settings.nvidia_cdi_dir or None, click.echo, settings.nvidia_driver_root,
                           proc=settings.host_proc))
    try:
        asyncio.run(run_agent(settings))
    except (GpuBackendError, PluginPathError, AgentStopped, KubeconfigError) as error:
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
@options(ClusterAccess)
@click.option("-o", "--output", type=click.Choice(["text", "json", "yaml"]), default="text", show_default=True,
              help="With --cluster: how to print the plan.")
def plan(files: tuple[str, ...], gpus: str, node: str, node_labels: tuple[str, ...], previous: tuple[str, ...],
         cluster: bool, kubeconfig: Path | None, context: str | None, gpuslice_namespace: str, output: str) -> None:
    """Print the ResourceSlices a node agent would publish for these policies, no cluster needed
    (with --cluster: what an edit would do to the live cluster; --kubeconfig and --context are for it)."""
    if cluster:
        need_cli_extra("gpuslice plan --cluster")
        if previous:
            raise click.UsageError("--from is for a plan without a cluster; with --cluster the policies as they are"
                                   " now come from the cluster.")
        from gpuslice.inspect.commands import cluster_plan

        cluster_plan(from_flags(ClusterAccess, {"kubeconfig": kubeconfig, "context": context,
                                       "gpuslice_namespace": gpuslice_namespace}),
                     [Path(f) for f in files], output)
        return
    # Given on the command line it would do nothing; exported (GPUSLICE_CONTEXT) it is for the other commands.
    if click.get_current_context().get_parameter_source("context") is ParameterSource.COMMANDLINE:
        raise click.UsageError("--context is for a plan against a cluster (--cluster).")
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
    need_cli_extra("gpuslice demo", ("rich",))
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
