"""``gpuslice defrag``'s plans in a terminal (rich): per waiting pod, the GPU it frees, the pods it
moves and why those, and what blocks the other GPUs. Rendered from a printable copy of the plans
(``printable``: no control character read from the cluster reaches the terminal)."""

from __future__ import annotations

import datetime

from rich.console import Group, RenderableType
from rich.text import Text

from gpuslice.inspect.render.labels import size
from gpuslice.inspect.render.printable import printable_model
from gpuslice.planning.defrag.model import GpuOption, Plan
from gpuslice.planning.defrag.node_taints import parse_time
from gpuslice.planning.reads.pending import KIND_WORDS

STYLES = {"Ready": "green", "NotNeeded": "dim", "InFlight": "cyan", "NoRoom": "yellow", "Blocked": "red",
          "Unsupported": "yellow"}
WORDS = {"Ready": "can be freed", "NotNeeded": "no move needed", "InFlight": "being freed", "NoRoom": "no room",
         "Blocked": "blocked", "Unsupported": "not planned"}


def waited(since: str, now: datetime.datetime | None = None) -> str:
    moment = parse_time(since)
    if moment is None:
        return ""
    seconds = int(((now or datetime.datetime.now(datetime.UTC)) - moment).total_seconds())
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"waits {seconds // length}{unit}"
    return f"waits {max(0, seconds)}s"


def _kind(plan: Plan) -> str:
    return KIND_WORDS.get(plan.kind, f"MIG {plan.kind} instance")


def _option(option: GpuOption) -> Text:
    if option.blockers:
        return Text(f"    {option.label}: " + "; ".join(b.message for b in option.blockers), style="dim")
    moves = len(option.moves)
    return Text(f"    {option.label}: {moves} move{'s' if moves != 1 else ''} ({size(option.memory_moved)})",
                style="dim")


def plan_lines(plan: Plan, now: datetime.datetime | None = None) -> list[RenderableType]:
    plan = printable_model(plan)
    head = Text(plan.pod, style="bold")
    facts = ", ".join(f for f in (waited(plan.since, now), f"a {_kind(plan)} of {plan.policy}") if f)
    head.append(f"  ({facts})", style="dim")
    lines: list[RenderableType] = [head]
    line = Text(f"  {WORDS.get(plan.verdict, plan.verdict)}: ", style=f"bold {STYLES.get(plan.verdict, '')}".strip())
    line.append(plan.message)
    lines.append(line)
    if plan.target is not None:
        for move in plan.target.moves:
            text = Text(f"    move {move.pod}", style="bold")
            why = [move.owner or "its controller", f"{size(move.memory)} on this GPU"]
            if move.to:
                why.append(f"its replacement fits on {move.to}")
            text.append(f"  ({'; '.join(why)})")
            lines.append(text)
        lines.append(Text(f"    then {plan.pod} gets {plan.target.device}", style="dim"))
        if not plan.target.exact:
            lines.append(Text("    (too many pods on the GPU for an exact search: the largest first)", style="yellow"))
    if plan.alternatives:
        lines.append(Text("  the other GPUs:" if plan.target is not None else "  GPUs:", style="dim"))
        lines += [_option(o) for o in plan.alternatives]
    return lines


def defrag_view(plans: list[Plan], now: datetime.datetime | None = None) -> RenderableType:
    if not plans:
        return Text("No pod waits for a gpuslice device.", style="green")
    parts: list[RenderableType] = []
    for plan in plans:
        parts += plan_lines(plan, now)
    ready = sum(p.ready for p in plans)
    parts.append(Text(f"{ready} of {len(plans)} waiting pods can get a GPU by moving pods"
                      + ("; gpuslice defrag --apply moves them, one GPU at a time." if ready else "."), style="bold"))
    return Group(*parts)
