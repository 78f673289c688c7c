"""``gpuslice status``, ``gpuslice why`` and ``gpuslice plan --cluster``: what a platform
engineer looks at, from the API server alone. The same commands are the kubectl plugin
(``kubectl gpuslice ...``, see ``plugin``), so they take kubectl's ``--kubeconfig``, ``--context``,
``-n`` (default: the context's namespace) and ``-A``, read kubeconfigs in kubectl's order, and keep
the client's debug lines off the terminal. What they print for a person never carries a control
character read from the cluster (``render.printable``); ``-o json`` prints what was read."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import yaml

from gpuslice.inspect.render.printable import printable
from gpuslice.inspect.snapshot import (
    InspectError,
    device_classes,
    namespaces_facts,
    pending_pods,
    read_facts,
    read_snapshot,
)
from gpuslice.kube.client import KubeClient
from gpuslice.kube.credentials import KubeconfigError
from gpuslice.planning.reads.occupancy import as_json
from gpuslice.planning.reads.status_report import StatusReport, status_report
from gpuslice.settings import ClusterAccess, from_flags, options

cluster_options = options(ClusterAccess)


def _console() -> Any:
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=140)


def quiet_logging() -> None:
    """Warnings and errors only: the client's debug lines (a retry, say) are for the controller's log,
    not a person's terminal."""
    import logging

    import structlog

    processors = [p for p in structlog.get_config()["processors"] if p is not _printable_values]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr),  # stdout is for -o json
                        processors=[*processors[:-1], _printable_values, *processors[-1:]])  # before the renderer


def _printable_values(logger: Any, method: str, event: Any) -> Any:
    """A warning's words and values may quote the cluster (an API server's message, an object's field)."""
    return {key: printable(value) if isinstance(value, str) else value for key, value in event.items()}


async def _connect(access: ClusterAccess) -> KubeClient:
    try:
        return await KubeClient.from_kubeconfig(access.kubeconfig, context=access.context, pod_first=False)
    except KubeconfigError as error:  # no kubeconfig, a bad one, a field refused: its own words
        raise InspectError(str(error)) from None
    except Exception as error:  # anything else: say so, not a traceback
        raise InspectError(f"cannot connect to a cluster: {error}") from None


def _run(coroutine: Any) -> Any:
    quiet_logging()
    try:
        return asyncio.run(coroutine)
    except (InspectError, KubeconfigError) as error:
        click.echo(printable(f"gpuslice: {error}"), err=True)
        sys.exit(1)


async def report(access: ClusterAccess) -> StatusReport:
    async with await _connect(access) as kube:
        return status_report(await read_snapshot(kube, access.gpuslice_namespace))


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
@cluster_options
@click.option("-o", "--output", type=click.Choice(["text", "json", "svg", "html"]), default="text",
              show_default=True, help="text: the terminal view; svg/html: the same map as an image; json: for scripts.")
def status(kubeconfig: Path | None, context: str | None, gpuslice_namespace: str, output: str) -> None:
    """The GPU occupancy map (who holds which part of which GPU) and use against limit per policy and tenant,
    for the whole cluster (GPUs are the cluster's, as nodes are: no -n or -A)."""
    result = _run(report(from_flags(ClusterAccess, {"kubeconfig": kubeconfig, "context": context,
                                       "gpuslice_namespace": gpuslice_namespace})))
    text = render_report(result, output)
    if text is not None:
        click.echo(text, nl=False)
        return
    from gpuslice.inspect.render.terminal import status_view

    console = _console()
    console.print(status_view(result, console.width))


async def _diagnose(access: ClusterAccess, target: str | None, namespace: str | None,
                    all_namespaces: bool) -> list[Any]:
    """The diagnosis of ``target`` (``NAME`` or ``NAMESPACE/NAME``); without one, of every Pending pod
    that asks for a gpuslice device in ``namespace`` (default: the context's), or everywhere."""
    from gpuslice.planning.reads.pending import asks_for_devices, diagnose

    async with await _connect(access) as kube:
        home = access.gpuslice_namespace
        snapshot = await read_snapshot(kube, home)
        result = status_report(snapshot)
        if target is not None:
            ns, _, name = target.rpartition("/")
            facts = [await read_facts(kube, ns or namespace or kube.namespace, name, home)]
        else:
            pods = await pending_pods(kube, None if all_namespaces else namespace or kube.namespace)
            classes = await device_classes(kube)
            pods = [p for p in pods if asks_for_devices(p, classes, snapshot.policies)]  # else NoClaims: unlisted
            per_namespace = await namespaces_facts(kube, (p["metadata"]["namespace"] for p in pods), classes,
                                                   home=home)
            facts = [replace(per_namespace[p["metadata"]["namespace"]], pod=p) for p in pods]
        found = [diagnose(f, snapshot.policies, result.policies, result.map) for f in facts]
        if target is None:  # a listing: only the pods that wait for a gpuslice device
            found = [d for d in found if not {f.code for f in d.findings} & {"NotGpuslice", "NoClaims"}]
        if any(f.code == "NoFreeDevice" for d in found for f in d.findings):
            found = await _with_defrag(kube, found, home)
    return found


async def _with_defrag(kube: KubeClient, diagnoses: list[Any], home: str) -> list[Any]:
    """The diagnoses, each pod that finds no free device with what moving pods would do for it
    (gpuslice defrag's plan for it; the cluster read once for all)."""
    from gpuslice.controller.defrag.read import read_cluster
    from gpuslice.kube.client import KubeError
    from gpuslice.planning.defrag.model import defrag_finding
    from gpuslice.planning.reads.pending import Finding

    try:
        plans = (await read_cluster(kube, home=home)).plans()
    except KubeError as error:
        note = Finding("Defragmentation", f"whether moving pods would help was not worked out: {error.message}"
                                          " (it reads pods and PodDisruptionBudgets: gpuslice-viewer)", blocking=False)
        return [replace(d, findings=(*d.findings, note)) if any(f.code == "NoFreeDevice" for f in d.findings)
                else d for d in diagnoses]
    out = []
    for diagnosis in diagnoses:
        found = [f for p in plans if p.pod == diagnosis.subject and (f := defrag_finding(p)) is not None]
        out.append(replace(diagnosis, findings=(*diagnosis.findings, *found[:1])) if found else diagnosis)
    return out


@click.command("why")
@click.argument("target", metavar="[NAMESPACE/]POD | [NAMESPACE/]CLAIM", required=False)
@click.option("-n", "--namespace", default=None,
              help="Namespace of TARGET, or of the pods to explain without one (default: the context's namespace).")
@click.option("-A", "--all-namespaces", is_flag=True,
              help="Without TARGET: explain every Pending pod that asks for a gpuslice device, in every namespace.")
@cluster_options
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def why(target: str | None, namespace: str | None, all_namespaces: bool, kubeconfig: Path | None,
        context: str | None, gpuslice_namespace: str, output: str) -> None:
    """Why a pod (or a ResourceClaim) waits for its GPU, in the platform's terms. Without TARGET: every
    Pending pod of the namespace (-n, or every namespace with -A) that asks for a gpuslice device."""
    if target is not None and all_namespaces:
        raise click.UsageError("a pod cannot be looked up by name across all namespaces (-A): give"
                               " NAMESPACE/POD, or -n NAMESPACE")
    if namespace is not None and all_namespaces:
        raise click.UsageError("-n and -A: give one")
    found = _run(_diagnose(from_flags(ClusterAccess, {"kubeconfig": kubeconfig, "context": context,
                                       "gpuslice_namespace": gpuslice_namespace}), target, namespace, all_namespaces))
    if output == "json":
        click.echo(json.dumps(as_json(found[0] if target is not None else found), indent=2))
    else:
        from rich.text import Text

        from gpuslice.inspect.render.terminal import why_view

        console = _console()
        for diagnosis in found:
            console.print(why_view(diagnosis))
        if target is None and not found:
            where = "any namespace" if all_namespaces else f"namespace {namespace or 'of the context'}"
            console.print(Text(printable(f"No Pending pod in {where} asks for a gpuslice device.")))
    if target is not None and any(f.code == "NotFound" for f in found[0].findings):
        sys.exit(1)


async def plan_on_cluster(access: ClusterAccess, paths: list[Path]) -> Any:
    from gpuslice.inspect.cluster_plan import plan_from_cluster

    async with await _connect(access) as kube:
        return await plan_from_cluster(kube, paths, access.gpuslice_namespace)


def cluster_plan(access: ClusterAccess, paths: list[Path], output: str) -> None:
    changes = _run(plan_on_cluster(access, paths))
    if output == "json":
        click.echo(json.dumps(as_json(changes), indent=2))
        return
    if output == "yaml":
        click.echo(yaml.safe_dump(as_json(changes), sort_keys=False), nl=False)
        return
    from rich.console import Group

    from gpuslice.inspect.render.terminal import plan_view

    _console().print(Group(*(plan_view(c) for c in changes)))
