"""Room on one GPU: which published devices a claim could get now (the view a mode judges, pure).

Each mode knows its own arithmetic (``SlicingMode.room``): a memory slice needs that much
memory left in its GPU's counter set, a whole GPU an idle GPU, a shared device the capacity,
a MIG placement its memory slices unused (and a ``+me`` one the GPU's single media-engines
counter). The read models that hold published devices with their holders and taints
(``planning.reads``) sit above the modes, so a mode judges this view of a device, which
their ``PublishedDevice`` is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from gpuslice.planning.devices import Device

FREE = "free"  # a device's state when nothing holds it, taints it or drains it
ALLOCATED = "allocated"  # held by a claim, and nothing else keeps claims off


class Candidate(Protocol):
    """A published device as a claim would find it."""

    @property
    def device(self) -> Device: ...

    @property
    def allocated(self) -> bool:
        """Some claim takes it (admin access takes nothing)."""
        ...

    @property
    def state(self) -> str:
        """``free`` when a claim could get it now; else ``allocated``, ``held``, ``draining``
        or ``tainted`` (``planning.reads.published``)."""
        ...

    @property
    def step(self) -> int:
        """A consumable device's capacity step; 0 for other devices."""
        ...


C = TypeVar("C", bound=Candidate)


@dataclass(frozen=True)
class Room(Generic[C]):
    ok: list[C]  # a claim could get these now, together
    off: list[C]  # these would do, but are tainted, draining or held


def by_state(fits: Iterable[C], usable: Sequence[str] = (FREE,)) -> Room[C]:
    """``fits`` split into what a claim could get and what is kept off, by state."""
    fits = list(fits)
    ok = [d for d in fits if d.state in usable]
    return Room(ok, [d for d in fits if d not in ok])
