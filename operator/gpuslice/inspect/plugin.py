"""``kubectl gpuslice status|why|plan|defrag``: the inspecting commands as a kubectl plugin.

kubectl runs any ``kubectl-<name>`` on the PATH as ``kubectl <name>``; installing
gpuslice with its cli extra (``pipx install 'gpuslice[cli]'``) puts ``kubectl-gpuslice`` there. Here ``plan``
always means the live cluster (``gpuslice plan --cluster``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gpuslice import __version__
from gpuslice.inspect.commands import cluster_options, cluster_plan, status, why
from gpuslice.inspect.defrag import defrag
from gpuslice.inspect.extra import need_cli_extra
from gpuslice.kube.useragent import set_component
from gpuslice.settings import ClusterAccess, from_flags


@click.group(name="kubectl gpuslice")
@click.version_option(__version__, prog_name="kubectl-gpuslice")
def main() -> None:
    """gpuslice for kubectl: the GPU occupancy map, why a pod waits for its GPU, what a policy edit would do,
    which pods to move to free a GPU."""


main.add_command(status)
main.add_command(why)
main.add_command(defrag)


@main.command("plan")
@click.option("-f", "--filename", "files", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="The edited (or new) GpuSlicePolicy YAML (repeat for several).")
@cluster_options
@click.option("-o", "--output", type=click.Choice(["text", "json", "yaml"]), default="text", show_default=True)
def plan(files: tuple[str, ...], kubeconfig: Path | None, context: str | None, gpuslice_namespace: str,
         output: str) -> None:
    """What applying these policies would add, drain and hold on the live cluster; nothing is written."""
    cluster_plan(from_flags(ClusterAccess, {"kubeconfig": kubeconfig, "context": context,
                                       "gpuslice_namespace": gpuslice_namespace}),
                 [Path(f) for f in files], output)


def run() -> None:
    """The ``kubectl-gpuslice`` entry point: help and errors name the command as kubectl users type it."""
    set_component("gpuslice-cli")
    if sys.argv[1:] != ["--version"]:  # which version is installed needs no extra (`pipx install` of the wheel)
        try:
            need_cli_extra("kubectl gpuslice")
        except click.ClickException as error:
            error.show()
            raise SystemExit(error.exit_code) from None
    main(prog_name="kubectl gpuslice")
