"""The defragmentation planner's search: the smallest set of pods whose devices, released, cover
what a GPU lacks (pure). Exact: every set of k pods before any of k + 1, from a lower bound per
counter, the least memory first among sets of one size; past SEARCH_BUDGET sets, the largest first."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from math import comb
from typing import Protocol, TypeVar

Key = tuple[str, str]  # (counter set, counter)
SEARCH_BUDGET = 20_000  # sets of pods tried per GPU before the largest-first answer is taken


class Movable(Protocol):
    @property
    def ref(self) -> str: ...

    @property
    def memory(self) -> int: ...

    @property
    def cons(self) -> Mapping[Key, int]: ...


U = TypeVar("U", bound=Movable)


def _lower_bound(deficit: Mapping[Key, int], units: Sequence[U]) -> int:
    """No set smaller than this covers every counter: per counter, its largest holders first."""
    bound = 0
    for key, missing in deficit.items():
        count, total = 0, 0
        for amount in sorted((u.cons.get(key, 0) for u in units), reverse=True):
            if total >= missing:
                break
            total += amount
            count += 1
        bound = max(bound, count)
    return bound


def _covers(chosen: Iterable[U], deficit: Mapping[Key, int]) -> bool:
    chosen = list(chosen)
    return all(sum(u.cons.get(k, 0) for u in chosen) >= missing for k, missing in deficit.items())


def fewest(deficit: Mapping[Key, int], units: Sequence[U],
           feasible: Callable[[Sequence[U]], bool]) -> tuple[list[U] | None, bool]:
    """The smallest set of ``units`` covering ``deficit`` that is ``feasible``; least memory among
    those. Exact within SEARCH_BUDGET sets; past it, the largest first (and False)."""
    if not deficit:
        return [], True
    tried = 0
    for size in range(max(1, _lower_bound(deficit, units)), len(units) + 1):
        best: list[U] | None = None
        combos = sorted(itertools.combinations(units, size), key=lambda c: (sum(u.memory for u in c),
                                                                            [u.ref for u in c])) \
            if comb(len(units), size) <= SEARCH_BUDGET - tried else None
        if combos is None:
            break
        for combo in combos:
            tried += 1
            if _covers(combo, deficit) and feasible(combo):
                best = list(combo)
                break
        if best is not None:
            return best, True
    greedy: list[U] = []
    for unit in sorted(units, key=lambda u: (-u.memory, u.ref)):
        greedy.append(unit)
        if _covers(greedy, deficit):
            return (greedy, False) if feasible(greedy) else (None, False)
    return None, False


