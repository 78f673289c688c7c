"""The occupancy map, ``why`` and ``plan --cluster`` in a terminal (rich).

Each view renders a :func:`~gpuslice.inspect.render.printable.printable_model` copy of what was read
(no control character of a tenant's reaches the terminal), and hands rich ``Text`` only, never a
``str``, which rich would read as markup (``[link=...]`` is an escape sequence too)."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpuslice.inspect.render.labels import (
    STATE_COLOURS,
    STATE_WORDS,
    colour,
    fit,
    gpu_summary,
    rows,
    size,
    size_pair,
    widths,
)
from gpuslice.inspect.render.printable import printable_model
from gpuslice.planning.reads.occupancy import GpuMap, NodeMap
from gpuslice.planning.reads.pending import Diagnosis
from gpuslice.planning.reads.policy_change import ChangePlan
from gpuslice.planning.reads.status_report import StatusReport

FILL = {"draining": "░", "tainted": "x", "free": "·", "slack": " "}


def bar(gpu: GpuMap, width: int) -> Text:
    text = Text()
    for segment, cells in zip(gpu.segments, widths([s.span for s in gpu.segments], width), strict=True):
        fill = FILL.get(segment.state, " ")
        inner = fit(segment, cells - 2) if cells > 2 else ""
        body = (" " + inner if inner else "").ljust(cells, fill)[:cells]
        if cells > 1:
            body = body[:-1] + "▏"
        style = f"bold white on {colour(segment)}" if segment.state != "draining" else f"black on {colour(segment)}"
        text.append(body, style=style)
    return text


def _node(node: NodeMap, width: int) -> RenderableType:
    head = Text(node.name, style="bold")
    facts = [f"{len(node.gpus)} GPUs"]
    if node.generation:
        facts.append(f"pool generation {node.generation}")
    if not node.complete:
        facts.append("[being rewritten]")
    if node.gpus_without_devices:
        facts.append(f"{node.gpus_without_devices} GPUs publish no device")
    head.append("  " + " · ".join(facts), style="dim")
    lines: list[RenderableType] = [head]
    for title, gpu in rows(node.gpus):
        row = Text(f"  {title:<8} ", style="bold")
        row.append_text(bar(gpu, width))
        row.append(f" {gpu_summary(gpu)}", style="dim")
        lines.append(row)
        detail = [f"{gpu.product} {size(gpu.memory)}, {gpu.mode}, {', '.join(gpu.policies)}"]
        holders = [s.holder.who for s in gpu.segments if s.holder is not None]
        if holders:
            detail.append("held by " + ", ".join(dict.fromkeys(holders)))
        if gpu.tainted_reasons:
            detail.append("tainted: " + "; ".join(gpu.tainted_reasons))
        if gpu.overusing:
            detail.append("over their allocation: " + ", ".join(h.who for h in gpu.overusing))
        if gpu.admin:
            detail.append("admin access: " + ", ".join(h.ref for h in gpu.admin))
        if gpu.offers:
            detail.append("also free: " + ", ".join(gpu.offers))
        if gpu.freeing:
            detail.append(gpu.freeing)
        lines.append(Text("           " + " · ".join(detail), style="dim"))
    return Group(*lines)


def legend() -> Text:
    text = Text("  ")
    for state, words in STATE_WORDS.items():
        swatch = STATE_COLOURS.get(state, "#3b82f6")
        text.append("  ", style=f"on {swatch}")
        text.append(f" {words.split(':')[0]}   ")
    return text


def _cells(*cells: str) -> tuple[Text, ...]:
    """Table cells as plain text: a ``str`` cell would be read as rich markup, and a value a node or a
    tenant wrote (a device attribute, a name) would become a hyperlink or hidden text. Every table
    here takes its cells from this (tests/unit/inspect/test_render_text.py fails on a ``str`` cell)."""
    return tuple(Text(c) for c in cells)


def status_view(report: StatusReport, width: int = 120) -> RenderableType:
    report = printable_model(report)
    bar_width = max(40, min(100, width - 44))
    parts: list[RenderableType] = [Text("GPU occupancy", style="bold underline")]
    if not report.map.nodes:
        parts.append(Text("  No node publishes gpuslice devices (no policy selects a GPU, or no agent runs).",
                          style="yellow"))
    parts += [_node(node, bar_width) for node in report.map.nodes]
    parts.append(legend())
    parts += [_policies(report), _tenants(report)]
    if any(n.nvlink or n.numa for n in report.topology):
        parts.append(_topology(report))
    if report.aligned:
        parts.append(_aligned(report))
    parts += [Text(f"note: {n}", style="yellow") for n in report.notes]
    return Group(*parts)


def _used(used: int, limit: int | None) -> str:
    return f"{used} / {'-' if limit is None else limit}"


def _policies(report: StatusReport) -> Table:
    table = Table(title="Policies", title_justify="left")
    for column in ("policy", "mode", "ready", "degraded", "nodes", "GPUs", "published", "allocated", "held",
                   "draining", "tainted", "free"):
        table.add_column(column, justify="right" if column in ("nodes", "GPUs", "published", "allocated", "held",
                                                                "draining", "tainted", "free") else "left")
    for p in report.policies:
        ready, degraded = p.condition("Ready"), p.condition("Degraded")
        table.add_row(*_cells(
            p.name, p.mode,
            (ready.status if ready.status == "True" else f"{ready.status} ({ready.reason})") if ready else "?",
            degraded.reason if degraded and degraded.status == "True" else "-",
            str(p.nodes), str(p.gpus), str(p.published), str(p.allocated), str(p.held), str(p.draining),
            str(p.tainted) + (f" ({', '.join(f'{r} {n}' for r, n in p.taint_reasons)})" if p.taint_reasons else ""),
            str(p.free)))
    return table


def _tenants(report: StatusReport) -> Table:
    table = Table(title="Tenants: use against limit", title_justify="left")
    for column in ("namespace", "policy", "devices", "memory", "by kind"):
        table.add_column(column)
    for policy in report.policies:
        for t in policy.tenants:
            kinds = ", ".join(f"{k.kind} {k.allocated}/{'-' if k.limit is None else k.limit}" for k in t.kinds
                              if k.allocated or k.limit)
            style = "red" if t.over else ""
            memory = size_pair(t.allocated_bytes, t.limit_bytes)
            if t.max_memory is not None and t.limit_bytes == t.max_memory:
                memory += " maxMemory"
            table.add_row(*_cells(t.namespace, policy.name, _used(t.allocated, t.limit), memory, kinds), style=style)
    for total in report.tenants:
        if len(total.policies) > 1:
            table.add_row(*_cells(total.namespace, "all", _used(total.allocated, total.limit),
                                  size_pair(total.allocated_bytes, total.limit_bytes), ""), style="bold")
    return table


def _indexes(indexes: tuple[int, ...]) -> str:
    return "GPUs " + ",".join(map(str, indexes))


def _topology(report: StatusReport) -> Table:
    """Each node's GPUs by what they share (docs/topology.md)."""
    table = Table(title="Topology: GPUs by what they share", title_justify="left")
    for column in ("node", "NVLink domains", "NUMA nodes", "PCIe roots"):
        table.add_column(column)
    for node in report.topology:
        numa = [f"{value}: {_indexes(gpus)}" for value, gpus in node.numa]
        if node.unknown_numa:
            numa.append(f"unknown: {_indexes(node.unknown_numa)}")
        table.add_row(*_cells(node.node, "\n".join(f"{v}: {_indexes(g)}" for v, g in node.nvlink) or "none",
                              "\n".join(numa), "\n".join(f"{v}: {_indexes(g)}" for v, g in node.pcie)))
    return table


def _aligned(report: StatusReport) -> Table:
    """Claims on several GPUs, and what their GPUs share; an aligned template's claim also says the
    alignment the scheduler granted (the subrequest it took)."""
    table = Table(title="Claims on several GPUs", title_justify="left")
    for column in ("claim", "node", "GPUs", "they share", "granted"):
        table.add_column(column)
    for claim in report.aligned:
        table.add_row(*_cells(f"{claim.namespace}/{claim.claim}", claim.node, ",".join(map(str, claim.gpus)),
                              claim.achieved, claim.granted or "-"), style="yellow" if claim.achieved == "any" else "")
    return table


def why_view(diagnosis: Diagnosis) -> RenderableType:
    diagnosis = printable_model(diagnosis)
    parts: list[RenderableType] = [Text(f"{diagnosis.subject}" + (f" ({diagnosis.phase})" if diagnosis.phase
                                                                  else ""), style="bold")]
    for request in diagnosis.requests:
        what = f"{'all' if request.all_devices else request.count} x {request.device_class or '?'}"
        if request.memory:
            what += f", {size(request.memory)} of capacity"
        parts.append(Text(f"  {request.claim}: request {request.name}, {what}", style="dim"))
    for finding in diagnosis.findings:
        mark, style = ("✗", "red") if finding.blocking else ("·", "")
        line = Text(f"  {mark} ", style=style)
        line.append(f"{finding.code}: ", style=f"bold {style}".strip())
        line.append(finding.message.replace("\n", "\n      "))  # a quoted Event's lines stay under its finding
        parts.append(line)
    if not diagnosis.blocking:
        parts.append(Text("  Nothing gpuslice knows of blocks it.", style="green"))
    return Group(*parts)


def plan_view(change: ChangePlan) -> RenderableType:
    change = printable_model(change)
    verb = "Creating" if change.new else "Applying this edit of"
    parts: list[RenderableType] = [Text(f"{verb} GpuSlicePolicy {change.policy} would:", style="bold")]
    for problem in change.problems:
        parts.append(Text(f"  ✗ {problem.reason}: {problem.message} (the controller would mark it Valid=False and"
                          " change nothing)", style="red"))
    counts = Table(title="Devices per policy", title_justify="left")
    for column in ("policy", "now", "after"):
        counts.add_column(column, justify="left" if column == "policy" else "right")
    for count in change.counts:
        counts.add_row(*_cells(count.policy, str(count.before), str(count.after)),
                       style="bold" if count.before != count.after else "")
    parts.append(counts)
    if not change.nodes:
        parts.append(Text("  change nothing that is published.", style="green"))
    for node in change.nodes:
        parts.append(Text(node.node, style="bold"))
        rows = [("add now", node.added, "green"), ("add once held devices are released", node.waiting, "yellow"),
                ("drain, then change", node.drain_change, "yellow"), ("drain, then remove", node.drain_remove,
                                                                       "yellow")]
        for words, names, style in rows:
            if names:
                parts.append(Text(f"  {words}: {len(names)}  ({_names(names)})", style=style))
        for held in node.held:
            holders = ", ".join(h.who for h in held.holders)
            parts.append(Text(f"  hold {held.name} as it is until {holders} releases it (then"
                              f" {'removed' if held.removed else 'changed'})", style="dark_orange"))
        if node.unchanged:
            parts.append(Text(f"  unchanged: {node.unchanged}", style="dim"))
        for note in node.notes:
            parts.append(Text(f"  note: {note}", style="yellow"))
        if node.unknown_gpus:
            parts.append(Text(f"  {node.unknown_gpus} GPUs publish nothing today and are not in the API: their"
                              " devices are not previewed", style="yellow"))
    return Group(*parts)


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(names[:4]) + (f", ... {len(names) - 4} more" if len(names) > 4 else "")


def print_to(console: Console, renderable: RenderableType) -> None:
    console.print(renderable)
