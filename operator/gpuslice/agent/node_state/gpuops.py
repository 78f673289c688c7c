"""The node's GPUs as prepare and the MIG manager see them: found by UUID, changed one call at a time per GPU.

Backend calls block (NVML is synchronous), so they run in a thread. Everything that
changes a GPU (MIG mode, instances) holds that GPU's lock, so two prepares, an
unprepare and the MIG manager never interleave on one GPU: two concurrent claims
can never race for one placement, and a layout change never sees half an instance.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from gpuslice.agent.gpus import GpuBackend
from gpuslice.inventory.gpus import Gpu

P = ParamSpec("P")
T = TypeVar("T")


class GpuOps:
    def __init__(self, backend: GpuBackend, gpus: list[Gpu]) -> None:
        self.backend = backend
        self.gpus = {g.uuid: g for g in gpus}
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, uuid: str) -> asyncio.Lock:
        return self._locks.setdefault(uuid, asyncio.Lock())

    async def call(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.to_thread(function, *args, **kwargs)
