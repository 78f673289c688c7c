"""A watch stream asks the API server to run for as long as its caller wants (an agent's for an
hour: its only steady cost is reopening its watches), but is taken for dead after STALL seconds
without a line, so a long stream never hides a dead connection."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

from gpuslice.kube.client import KubeClient
from gpuslice.kube.watch import STALL, _stream


class Transport:
    def __init__(self) -> None:
        self.asked: list[tuple[dict[str, Any], float]] = []

    @contextlib.asynccontextmanager
    async def stream(self, path: str, query: dict[str, Any], connect: float, read: float) -> AsyncIterator[Any]:
        self.asked.append((dict(query), read))

        async def lines() -> AsyncIterator[bytes]:
            yield b'{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}}'

        yield lines()


class Kube:
    def __init__(self) -> None:
        self.transport = Transport()


async def test_a_long_watch_is_still_given_up_when_it_goes_quiet() -> None:
    kube = Kube()
    assert await _stream(cast(KubeClient, kube), "/x", {}, "5", 3600, lambda kind, body: None) == "7"
    assert await _stream(cast(KubeClient, kube), "/x", {}, "7", 60, lambda kind, body: None) == "7"
    (long, long_read), (_, short_read) = kube.transport.asked
    assert long["timeoutSeconds"] == 3600
    assert long_read == STALL  # not the hour and a half the stream may run
    assert short_read == 90  # a short stream's own end comes first
