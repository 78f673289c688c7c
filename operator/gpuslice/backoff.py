"""Jittered exponential backoff: the one way gpuslice waits before trying again.

A fleet that fails together (an API server restart, a rule every node meets, webhooks racing for
one ledger) must not try again together: each wait is spread by half either way (``spread``, the
one jitter rule), and doubles with each failure in a row up to a bound (usually the resync: a
stuck loop then costs no more than a resync). A loop that only one process runs for one object
(the controller's retry of a policy) may ask for the bare doubling, without the spread.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

_MAX_DOUBLINGS = 62  # 2**62 times any first wait is past every bound: no float overflow however long it fails


def spread(seconds: float) -> float:
    """``seconds`` give or take half: retries of many callers spread out instead of arriving together."""
    return seconds * random.uniform(0.5, 1.5)


@dataclass
class Backoff:
    """``first`` seconds after one failure, doubling with each failure in a row up to ``limit``;
    spread as :func:`spread` does, but never past ``limit``, unless ``jitter`` is off.

    Used as a value (:meth:`after` a count of failures the caller keeps) or as a counter
    (:meth:`next` after each failure, :meth:`reset` after a success)."""

    first: float
    limit: float
    jitter: bool = True
    failures: int = 0

    def after(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row (none after none)."""
        bare = self._bare(failures)
        # Half either way, but never past the limit: at the limit the waits spread below it rather
        # than pile up on it (a fleet in a long outage still tries again out of step).
        return random.uniform(0.5 * bare, min(1.5 * bare, self.limit)) if self.jitter else bare

    @property
    def current(self) -> float:
        """The last :meth:`next`'s wait before its spread: ``limit`` once it has doubled all the way."""
        return self._bare(self.failures)

    def _bare(self, failures: int) -> float:
        return min(self.first * 2.0 ** min(failures - 1, _MAX_DOUBLINGS), self.limit) if failures > 0 else 0.0

    def next(self) -> float:
        """The wait before the next try; the one after it is twice as long."""
        self.failures += 1
        return self.after(self.failures)

    def reset(self) -> None:
        self.failures = 0
