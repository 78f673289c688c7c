"""Jittered exponential backoff, the one way the agent waits before trying again.

A fleet of agents that fail together (an API server restart, a rule every node meets) must
not try again together: each wait is spread by half either way, and doubles while nothing
changes, up to a bound (usually the resync: a stuck loop then costs no more than a resync).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


def spread(seconds: float) -> float:
    """``seconds`` give or take half: retries of many agents spread out instead of arriving together."""
    return seconds * random.uniform(0.5, 1.5)


@dataclass
class Backoff:
    """``first`` seconds, doubling on every :meth:`next` up to ``limit``, until :meth:`reset`."""

    first: float
    limit: float
    current: float = 0.0

    def next(self) -> float:
        """The (jittered) wait before the next try; the one after it is twice as long."""
        self.current = self.first if self.current <= 0 else min(self.current * 2, self.limit)
        return min(spread(self.current), self.limit)

    def reset(self) -> None:
        self.current = 0.0
