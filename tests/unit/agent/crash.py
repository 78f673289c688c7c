"""An agent killed at one of its kill points (agent.killpoints), in process: what a SIGKILL there
leaves on the node, without a process to kill."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gpuslice.agent.kubeletplugin import prepare as prepare_module
from gpuslice.agent.kubeletplugin.modes import mig as mig_module
from gpuslice.agent.kubeletplugin.prepare import Preparer


class Killed(BaseException):
    """SIGKILL at a kill point: nothing runs after it."""


@contextmanager
def killed_at(point: str, preparer: Preparer, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The agent dies at kill point ``point`` while ``preparer`` works in the block. Its clean-up
    (``undo`` on the way out of a failed prepare) never runs: a killed process runs nothing."""
    def kill_point(name: str) -> None:
        if name == point:
            raise Killed(name)

    async def dead(*args: object) -> None:
        raise Killed("nothing runs after the kill")

    with monkeypatch.context() as patch:
        patch.setattr(prepare_module, "kill_point", kill_point)
        patch.setattr(mig_module, "kill_point", kill_point)
        patch.setattr(preparer, "undo", dead)
        with pytest.raises(Killed):
            yield
