"""MIG placement arithmetic shared by the planner and the controller's validation (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from gpuslice.inventory.catalog import MigProfile


def mig_device_name(gpu_tag: str, profile: str, start: int) -> str:
    """``gpu-2d3e5f1a-mig-1g10gb-me-at-3``: GPU, profile and placement, readable back from the name.
    ``+me`` is spelt ``-me`` (as always: published names do not change); go-nvlib's ``-me`` (no media
    engine, ``1_SLICE_NO_ME``) is spelt ``-nome``, so ``1g.10gb+me`` and ``1g.10gb-me`` never share one."""
    spelt = profile.replace("-me", "-nome").replace(".", "").replace("+", "-")
    return f"{gpu_tag}-mig-{spelt}-at-{start}"


def parse_mig_device_name(name: str) -> tuple[str, str, int] | None:
    """The inverse of :func:`mig_device_name`: (GPU tag, profile without dots such as ``1g10gb-me``, start)."""
    head, sep, tail = name.partition("-mig-")
    profile, at, start = tail.rpartition("-at-")
    if not (sep and at and head.startswith("gpu-") and start.isdigit()):
        return None
    return head, profile, int(start)


class HasMigProfiles(Protocol):
    def mig_profile(self, name: str) -> MigProfile | None: ...


def static_layout(gpu: HasMigProfiles, layout: Mapping[str, int]) -> list[tuple[MigProfile, int]] | None:
    """Placements for a static layout (large instances first, backtracking over NVML's
    placement table); None if the GPU cannot hold it."""
    wanted: list[MigProfile] = []
    for name, count in layout.items():
        profile = gpu.mig_profile(name)
        if profile is None:
            return None
        wanted += [profile] * count
    wanted.sort(key=lambda p: (-p.size, p.name))

    def place(i: int, used: frozenset[int], media: bool) -> list[tuple[MigProfile, int]] | None:
        if i == len(wanted):
            return []
        profile = wanted[i]
        if profile.media and media:
            return None
        for start in profile.starts:
            cells = frozenset(range(start, start + profile.size))
            if used & cells:
                continue
            rest = place(i + 1, used | cells, media or profile.media)
            if rest is not None:
                return [(profile, start), *rest]
        return None

    return place(0, frozenset(), False)
