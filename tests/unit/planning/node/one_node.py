"""Node n1 as the planner sees it: its labels and its fake GPUs."""

from __future__ import annotations

from typing import Any

from gpuslice.agent.gpus.fake import FakeBackend

LABELS = {"kubernetes.io/hostname": "n1"}


def gpus(model: str, count: int = 1) -> list[Any]:
    return FakeBackend("n1", [(model, count)]).discover()
