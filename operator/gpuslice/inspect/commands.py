"""``gpuslice status``, ``gpuslice why`` and ``gpuslice plan --cluster``: what a platform
engineer looks at, from the API server alone. The same commands are the kubectl plugin
(``kubectl gpuslice ...``, see ``plugin``)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click
import yaml

from gpuslice.inspect.snapshot import InspectError, read_facts, read_snapshot
from gpuslice.kube.client import KubeClient
from gpuslice.planning.occupancy import as_json
from gpuslice.planning.status_report import StatusReport, status_report
from gpuslice.settings import KUBECONFIG_HELP


def _console() -> Any:
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=140)


async def _connect(kubeconfig: str | None) -> KubeClient:
    try:
        return await KubeClient.from_kubeconfig(kubeconfig)
    except Exception as error:  # no kubeconfig, a bad one: say so, not a traceback
        raise InspectError(f"cannot connect to a cluster: {error}") from None


def _run(coroutine: Any) -> Any:
    try:
        return asyncio.run(coroutine)
    except InspectError as error:
        click.echo(f"gpuslice: {error}", err=True)
        sys.exit(1)


async def report(kubeconfig: str | None) -> StatusReport:
    async with await _connect(kubeconfig) as kube:
        return status_report(await read_snapshot(kube))


def render_report(result: StatusReport, output: str) -> str | None:
    """The report as ``output``; None means print it to the terminal."""
    if output == "json":
        return json.dumps(as_json(result), indent=2) + "\n"
    if output == "svg":
        from gpuslice.inspect.render.image import svg

        return svg(result)
    if output == "html":
        from gpuslice.inspect.render.image import html

        return html(result)
    return None


async def print_map(kube: KubeClient, console: Any, svg_path: Path | None = None) -> StatusReport:
    """The map as ``gpuslice status`` prints it (the demo ends with it); with ``svg_path``, also as an image."""
    from gpuslice.inspect.render.image import svg
    from gpuslice.inspect.render.terminal import status_view

    result = status_report(await read_snapshot(kube))
    console.print(status_view(result, console.width))
    if svg_path is not None:
        await asyncio.to_thread(svg_path.write_text, svg(result))
    return result


@click.command("status")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None, envvar="GPUSLICE_KUBECONFIG",
              help=KUBECONFIG_HELP)
@click.option("-o", "--output", type=click.Choice(["text", "json", "svg", "html"]), default="text",
              show_default=True, help="text: the terminal view; svg/html: the same map as an image; json: for scripts.")
def status(kubeconfig: str | None, output: str) -> None:
    """The GPU occupancy map (who holds which part of which GPU) and use against limit per policy and tenant."""
    result = _run(report(kubeconfig))
    text = render_report(result, output)
    if text is not None:
        click.echo(text, nl=False)
        return
    from gpuslice.inspect.render.terminal import status_view

    console = _console()
    console.print(status_view(result, console.width))


def _subject(target: str, namespace: str | None) -> tuple[str, str]:
    if "/" in target:
        ns, _, name = target.partition("/")
        return ns, name
    return namespace or "default", target


async def _diagnose(kubeconfig: str | None, namespace: str, name: str) -> Any:
    from gpuslice.planning.pending import diagnose

    async with await _connect(kubeconfig) as kube:
        snapshot = await read_snapshot(kube)
        facts = await read_facts(kube, namespace, name)
        result = status_report(snapshot)
        diagnosis = diagnose(facts, snapshot.policies, result.policies, result.map)
        if any(f.code == "NoFreeDevice" for f in diagnosis.findings):
            diagnosis = await _with_defrag(kube, diagnosis)
    return diagnosis


async def _with_defrag(kube: KubeClient, diagnosis: Any) -> Any:
    """The diagnosis, with what moving pods would do for the pod (gpuslice defrag's plan for it)."""
    from dataclasses import replace

    from gpuslice.controller.defrag_read import read_cluster
    from gpuslice.kube.client import KubeError
    from gpuslice.planning.defrag_model import defrag_finding
    from gpuslice.planning.pending import Finding

    try:
        plans = (await read_cluster(kube)).plans()
    except KubeError as error:
        note = Finding("Defragmentation", f"whether moving pods would help was not worked out: {error.message}"
                                          " (it reads pods and PodDisruptionBudgets: gpuslice-viewer)", blocking=False)
        return replace(diagnosis, findings=(*diagnosis.findings, note))
    found = [f for p in plans if p.pod == diagnosis.subject and (f := defrag_finding(p)) is not None]
    return replace(diagnosis, findings=(*diagnosis.findings, *found[:1]))


@click.command("why")
@click.argument("target", metavar="NAMESPACE/POD | NAMESPACE/CLAIM")
@click.option("-n", "--namespace", default=None, help="Namespace, when TARGET has none (default: default).")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None, envvar="GPUSLICE_KUBECONFIG",
              help=KUBECONFIG_HELP)
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def why(target: str, namespace: str | None, kubeconfig: str | None, output: str) -> None:
    """Why a pod (or a ResourceClaim) waits for its GPU, in the platform's terms."""
    ns, name = _subject(target, namespace)
    diagnosis = _run(_diagnose(kubeconfig, ns, name))
    if output == "json":
        click.echo(json.dumps(as_json(diagnosis), indent=2))
    else:
        from gpuslice.inspect.render.terminal import why_view

        _console().print(why_view(diagnosis))
    if any(f.code == "NotFound" for f in diagnosis.findings):
        sys.exit(1)


async def plan_on_cluster(kubeconfig: str | None, paths: list[Path]) -> Any:
    from gpuslice.inspect.cluster_plan import plan_from_cluster

    async with await _connect(kubeconfig) as kube:
        return await plan_from_cluster(kube, paths)


def cluster_plan(kubeconfig: str | None, paths: list[Path], output: str) -> None:
    changes = _run(plan_on_cluster(kubeconfig, paths))
    if output == "json":
        click.echo(json.dumps(as_json(changes), indent=2))
        return
    if output == "yaml":
        click.echo(yaml.safe_dump(as_json(changes), sort_keys=False), nl=False)
        return
    from rich.console import Group

    from gpuslice.inspect.render.terminal import plan_view

    _console().print(Group(*(plan_view(c) for c in changes)))
