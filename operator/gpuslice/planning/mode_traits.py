"""What a slicing mode's devices are, for the device model below the mode registry.

The registry (``planning.modes``) makes devices, so it imports the device model
(``planning.devices``), which therefore cannot import it; yet a device read back
from what was published must know what it is (its kind, whether it is capacity).
That is small and declarative, so each mode's traits are declared here, at the
bottom, and each mode of the registry carries its own (``SlicingMode.traits``; a
unit test holds the two tables equal). The read models and the node planning
above ask a trait (``consumable``, ``instances``), never a mode's name, and ask the
registry for what is a mode's own arithmetic (``SlicingMode.room``)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.api.policy import SlicingModeName
from gpuslice.planning import kinds

FULL_SLICE_SIZE = kinds.FULL  # the sliceSize attribute of a memory-mode whole-GPU device


@dataclass(frozen=True)
class ModeTraits:
    """What the devices of one slicing mode are."""

    name: SlicingModeName
    # One device per GPU that many claims share, each taking ``memory`` capacity in steps of the
    # policy's sliceSize (KEP-5075); no counter set guards it, the scheduler's capacity accounting does.
    consumable: bool = False
    # Each device is a MIG instance at a placement: the GPU must be in MIG mode (and every other
    # mode needs it out of MIG mode), the device's kind is its profile, and a static instance has
    # a UUID of its own.
    instances: bool = False

    def kind(self, slice_size: str, profile: str) -> str:
        """The kind of a published device of this mode (``planning.kinds``), from its
        ``sliceSize`` and ``profile`` attributes."""
        if self.instances:
            return profile
        if self.consumable:
            return kinds.SHARED
        return kinds.FULL if slice_size == FULL_SLICE_SIZE else kinds.SLICE


MEMORY = ModeTraits("memory")
SHARED = ModeTraits("shared", consumable=True)
MIG = ModeTraits("mig", instances=True)
TRAITS: dict[str, ModeTraits] = {t.name: t for t in (MEMORY, SHARED, MIG)}


def traits_of(mode: str) -> ModeTraits | None:
    """The traits of the mode named ``mode`` (as a device's ``mode`` attribute says), None for none."""
    return TRAITS.get(mode)
