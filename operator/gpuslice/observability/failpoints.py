"""Failpoints: named places where a fault test makes the process die, as etcd's gofail does.

``GPUSLICE_FAILPOINTS="agent.slice-written=kill@2,controller.object-applied=kill"`` makes the
process SIGKILL itself the second time it passes ``agent.slice-written`` and the first time it
passes ``controller.object-applied``. Unset (always, outside fault tests), a failpoint is one
dictionary lookup. SIGKILL, not an exception: nothing runs after it (no finally, no clean-up),
exactly as when the kernel kills a process.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

ENV = "GPUSLICE_FAILPOINTS"
_hits: Counter[str] = Counter()


def armed(text: str) -> dict[str, int]:
    """``name=kill[@N],...`` -> {name: N}."""
    found = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, action = part.partition("=")
        verb, _, nth = action.partition("@")
        if verb != "kill" or not name or (nth and not nth.isdigit()):
            raise ValueError(f"{ENV}: {part!r} is not NAME=kill or NAME=kill@N")
        found[name] = int(nth or "1")
    return found


_ARMED = armed(os.environ.get(ENV, ""))


def failpoint(name: str) -> None:
    """Die here if the environment armed this failpoint (and this is its N-th pass)."""
    if name not in _ARMED:
        return
    _hits[name] += 1
    if _hits[name] == _ARMED[name]:
        os.kill(os.getpid(), signal.SIGKILL)
