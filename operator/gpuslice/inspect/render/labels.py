"""What every rendering of the map says the same way: labels, colours, sizes and bar widths."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from gpuslice.planning.reads.occupancy import GpuMap, Segment

GI = 1024**3
# Allocated segments are coloured by tenant, so one tenant's slices read as one colour.
TENANT_COLOURS = ("#3b82f6", "#a855f7", "#06b6d4", "#ec4899", "#6366f1", "#14b8a6", "#8b5cf6", "#0ea5e9")
STATE_COLOURS = {"held": "#f59e0b", "draining": "#facc15", "tainted": "#dc2626", "free": "#22c55e",
                 "slack": "#4b5563"}
STATE_WORDS = {
    "allocated": "allocated (coloured by tenant namespace; OVER in dark red: it uses more than it holds)",
    "held": "held: allocated, a policy change waits for its release",
    "draining": "draining: free, about to change or go",
    "tainted": "tainted: unhealthy, reconfiguring, mig-failed or a policy taint",
    "free": "free",
    "slack": "slack: memory no device can use",
}


def tenant_colour(namespace: str) -> str:
    digest = hashlib.sha256(namespace.encode()).digest()
    return TENANT_COLOURS[digest[0] % len(TENANT_COLOURS)]


OVERUSE_COLOUR = "#b91c1c"


def colour(segment: Segment) -> str:
    if segment.holder is not None and segment.holder.overuse:
        return OVERUSE_COLOUR
    if segment.state == "allocated" and segment.holder is not None:
        return tenant_colour(segment.holder.namespace)
    return STATE_COLOURS.get(segment.state, "#9ca3af")


def size(value: int | None) -> str:
    """Human GPU memory: ``10G`` and ``10Gi`` as the policy wrote them, else GiB with one decimal."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    for unit, suffix in ((10**9, "G"), (GI, "Gi")):
        if value % unit == 0:
            return f"{value // unit}{suffix}"
    if value >= GI:
        return f"{value / GI:.1f}Gi"
    return f"{value / 2**20:.0f}Mi"


def fit(segment: Segment, room: int) -> str:
    """The segment's label in at most ``room`` characters: whole, then the pod without its namespace,
    then cut with an ellipsis; nothing when not even three characters fit."""
    words = label(segment)
    if len(words) <= room:
        return words
    if segment.holder is not None and segment.holder.pods and len(segment.holder.pods[0]) <= room:
        return segment.holder.pods[0]
    short = segment.holder.pods[0] if segment.holder is not None and segment.holder.pods else words
    return short[:room - 1] + "…" if room >= 3 else ""


def size_pair(used: int, limit: int | None) -> str:
    """``30G / 165.5G``: both in one unit, the one the figures are whole in (G before Gi)."""
    if limit is None:
        return f"{size(used)} / no limit"
    for unit, suffix in ((10**9, "G"), (GI, "Gi")):
        if used % unit == 0 or limit % unit == 0:
            return f"{_in(used, unit)}{suffix if used else ''} / {_in(limit, unit)}{suffix}"
    return f"{size(used)} / {size(limit)}"


def _in(value: int, unit: int) -> str:
    return str(value // unit) if value % unit == 0 else f"{value / unit:.1f}"


def label(segment: Segment) -> str:
    """The words inside a segment: who holds it, or what state it is in."""
    what = segment.kind if segment.kind not in (None, "slice", "shared") else ""
    holder = segment.holder.who if segment.holder else ""
    if segment.holder is not None and segment.holder.overuse:
        holder = f"{holder} OVER"  # uses more than the segment it was allocated
    if segment.state == "allocated":
        return " ".join(p for p in (holder, what) if p)
    if segment.state == "held":
        return f"held {holder}".strip()
    if segment.state == "tainted":
        reason = segment.reasons[0] if segment.reasons else "tainted"
        return f"{reason} {holder}".strip()
    if segment.state == "draining":
        return "draining"
    if segment.state == "free":
        if segment.fits:
            return "free: " + ", ".join(segment.fits)
        return what
    return ""


def describe(segment: Segment) -> str:
    """One line for a segment, for legends and tooltips."""
    parts = [segment.state, size(segment.memory)]
    if segment.policy:
        parts.append(f"policy {segment.policy}")
    if segment.kind and segment.kind not in ("slice",):
        parts.append(segment.kind)
    if segment.placement is not None:
        parts.append(f"memory slices {segment.placement[0]}-{sum(segment.placement) - 1}")
    if segment.holder is not None:
        parts.append(f"claim {segment.holder.ref}" + (f" (pod {', '.join(segment.holder.pods)})"
                                                      if segment.holder.pods else ""))
    if segment.reasons:
        parts.append("; ".join(segment.reasons))
    if segment.holder is not None and segment.holder.overuse:
        parts.append(f"over its allocation: {segment.holder.overuse}")
    if segment.fits:
        parts.append("fits " + ", ".join(segment.fits))
    return " · ".join(parts)


def widths(spans: Sequence[int], total: int) -> list[int]:
    """``total`` cells shared in proportion to ``spans``, at least one each (largest remainder)."""
    if not spans:
        return []
    whole = sum(spans) or 1
    room = max(total, len(spans))
    exact = [room * s / whole for s in spans]
    cells = [max(1, int(e)) for e in exact]
    order = sorted(range(len(spans)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    for i in order:
        if sum(cells) >= room:
            break
        cells[i] += 1
    while sum(cells) > room:
        i = max(range(len(cells)), key=lambda k: cells[k])
        cells[i] -= 1
    return cells


def _shape(gpu: GpuMap) -> tuple[object, ...]:
    return (gpu.product, gpu.mode, gpu.policies, gpu.offers, tuple((s.state, s.span, s.policy, s.kind, s.fits)
                                                                    for s in gpu.segments))


def idle(gpu: GpuMap) -> bool:
    return all(s.state in ("free", "slack") for s in gpu.segments) and not gpu.admin and not gpu.freeing


def rows(gpus: Sequence[GpuMap]) -> list[tuple[str, GpuMap]]:
    """One row per GPU, except that idle GPUs alike and in a row share one: ``GPU 1-7``. A fleet's
    map stays as long as what is going on in it."""
    found: list[tuple[list[int], GpuMap]] = []
    for gpu in gpus:
        last = found[-1] if found else None
        if last is not None and idle(gpu) and idle(last[1]) and _shape(gpu) == _shape(last[1]):
            last[0].append(gpu.index)
        else:
            found.append(([gpu.index], gpu))
    return [(f"GPU {ix[0]}" if len(ix) == 1 else f"GPU {ix[0]}-{ix[-1]}", gpu) for ix, gpu in found]


def gpu_summary(gpu: GpuMap) -> str:
    used = gpu.bytes_in("allocated", "held") + sum(s.span for s in gpu.segments
                                                  if s.state == "tainted" and s.holder is not None)
    free = gpu.bytes_in("free")
    return f"held {size(used)} of {size(gpu.memory)}" + (f", {size(free)} free" if free else "")
