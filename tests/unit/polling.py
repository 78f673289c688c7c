"""Waits on what runs outside the event loop in the unit tier: a child process, a file it writes, a
count a client keeps. Polled in real time, since a process keeps real time; the timing of gpuslice's
own code is tested on fake loop time instead (``pytest.mark.looptime``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(check: Callable[[], object], within: float = 10.0, *, every: float = 0.05,
                     what: str = "the condition") -> None:
    """Return once ``check()`` is true; fail after ``within`` seconds of the loop's clock."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        assert loop.time() < deadline, f"timed out after {within} s waiting for {what}"
        await asyncio.sleep(every)
