"""The optimal packing of a trace, computed offline and exactly.

The question a packing answers is "how much of the trace's GPU memory can these GPUs
hold at once": a multiple knapsack whose items weigh what they are worth. It is solved
by depth-first branch and bound over the items, largest first, with two bounds: the
trace's remaining memory, and for each bin the largest sum of remaining items that fits
its free memory (a subset-sum bitset per suffix of the items). A trace larger than the GPUs usually packs to the second
bound, which proves optimality at once; otherwise the search runs to the end (or
to ``node_limit``, and then says the figure is only a bound).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Packing:
    value: int  # units of the trace packed
    bins: tuple[tuple[int, ...], ...]  # the items in each bin
    proven: bool  # False: the search hit its limit and ``bound`` is the best proof
    bound: int  # an upper bound on the optimum (== value when proven)
    nodes: int  # search nodes visited


def _greedy(items: Sequence[int], bins: int, capacity: int) -> tuple[int, list[list[int]]]:
    """Best fit decreasing; an item that fits nowhere is left out."""
    loads = [0] * bins
    packed: list[list[int]] = [[] for _ in range(bins)]
    for item in sorted(items, reverse=True):
        fits = [b for b in range(bins) if loads[b] + item <= capacity]
        if fits:
            best = max(fits, key=lambda b: loads[b])
            loads[best] += item
            packed[best].append(item)
    return sum(loads), packed


def optimal_packing(items: Sequence[int], bins: int, capacity: int, node_limit: int = 2_000_000) -> Packing:
    """The most of ``items`` (positive integers) that ``bins`` bins of ``capacity`` hold."""
    order = sorted((i for i in items if 0 < i <= capacity), reverse=True)
    suffix = [0] * (len(order) + 1)
    for k in range(len(order) - 1, -1, -1):
        suffix[k] = suffix[k + 1] + order[k]
    ceiling = min(suffix[0], bins * capacity)
    best_value, best_bins = _greedy(order, bins, capacity)
    loads = [0] * bins
    current: list[list[int]] = [[] for _ in range(bins)]
    visited = 0
    exhausted = True

    # reach[k]: the sums (up to capacity) that items k.. can make, as a bitset.
    full = (1 << (capacity + 1)) - 1
    reach = [1] * (len(order) + 1)
    for k in range(len(order) - 1, -1, -1):
        reach[k] = (reach[k + 1] | (reach[k + 1] << order[k])) & full

    def bound(k: int, value: int) -> int:
        if k == len(order):
            return value
        # Each bin filled as fully as the remaining items allow, as if no other bin took them.
        usable = sum((reach[k] & ((1 << (capacity - load + 1)) - 1)).bit_length() - 1 for load in loads)
        return value + min(suffix[k], usable)

    def search(k: int, value: int) -> bool:
        """True when the ceiling is reached (nothing better exists)."""
        nonlocal best_value, best_bins, visited, exhausted
        visited += 1
        if value > best_value:
            best_value, best_bins = value, [list(b) for b in current]
            if best_value == ceiling:
                return True
        if k == len(order):
            return False
        if visited > node_limit:
            exhausted = False
            return False
        if bound(k, value) <= best_value:
            return False
        item = order[k]
        tried: set[int] = set()
        for b in range(bins):
            if loads[b] + item > capacity or loads[b] in tried:
                continue  # bins of equal load are interchangeable
            tried.add(loads[b])
            loads[b] += item
            current[b].append(item)
            done = search(k + 1, value + item)
            current[b].pop()
            loads[b] -= item
            if done:
                return True
        return search(k + 1, value)  # leave the item out

    if best_value < ceiling:
        search(0, 0)
    proven = exhausted or best_value == ceiling
    return Packing(best_value, tuple(tuple(b) for b in best_bins), proven,
                   best_value if proven else ceiling, visited)
