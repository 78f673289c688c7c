"""One module per slicing mode, behind one interface: the registry of modes.

A mode knows how to cut one GPU into devices for the policies that chose it,
which counter set guards that GPU, what would make a policy of its kind
impossible on the GPUs it selects, and what a container given one of its
devices is told. The node planner, the controller's validation and the kubelet
plugin dispatch here. The plugin's per-mode I/O, such as making a MIG instance,
is ``agent.kubeletplugin.modes``, keyed by the same names. The modules below
this one (the device model, and what reads published devices back) cannot
import it: they ask the mode's traits (``planning.mode_traits``), which each
mode here carries. What still branches outside the modes, and what adding a
mode takes, is in docs/modes.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.devices import CounterSet, Device, Mode
from gpuslice.planning.grants import Grant
from gpuslice.planning.kinds import DeviceKind
from gpuslice.planning.mode_traits import ModeTraits
from gpuslice.planning.modes import memory, mig, shared
from gpuslice.planning.room import C, Room
from gpuslice.planning.selection import Problem, Selection


class SlicingMode(Protocol):
    @property
    def name(self) -> Mode: ...

    @property
    def traits(self) -> ModeTraits:
        """What this mode's devices are, for the modules below the registry."""
        ...

    @property
    def exclusive(self) -> bool:
        """A GPU in this mode belongs to one policy; memory-mode policies share theirs."""
        ...

    def devices(self, gpu: Gpu, policies: Sequence[GpuSlicePolicy], notes: list[str]) -> list[Device]:
        """``gpu``'s devices for ``policies`` (several only for a sharing mode), noting what is left out."""
        ...

    def kinds(self, policy: GpuSlicePolicy, selection: Selection) -> list[DeviceKind]:
        """The kinds of device ``policy`` offers on the GPUs it selects, each its own DeviceClass,
        quota and template (``planning.kinds``), in the order the policy's status lists them."""
        ...

    def counter_set(self, gpu: Gpu) -> CounterSet | None:
        """The counter set that guards ``gpu`` in this mode, or None when the scheduler's own
        accounting does (consumable capacity)."""
        ...

    def fit_problems(self, policy: GpuSlicePolicy, selection: Selection) -> list[Problem]:
        """What makes ``policy`` impossible on the GPUs it selects."""
        ...

    def room(self, kind: str, candidates: Sequence[C], on_gpu: Sequence[C], free_memory: int,
             request: int | None) -> Room[C]:
        """Which of ``candidates`` (one policy's devices of ``kind``, this mode's, on one GPU) a
        claim could get now, as the scheduler would count them: ``on_gpu`` is every device
        published on that GPU, ``free_memory`` what no claim holds of it, and ``request`` the
        memory a consumable request takes (rounded to the step; None for the smallest)."""
        ...

    def example(self, gpu: Gpu) -> dict[str, Any] | None:
        """A ``spec.slicing`` of this mode that makes every kind of device it can make of ``gpu``
        (the node check, ``gpuslice agent check``, prints each kind's attributes); None when it
        makes none there."""
        ...

    def environment(self, grant: Grant) -> dict[str, str]:
        """The ``GPUSLICE_*`` variables a container using ``grant`` receives (see ``planning.grants``)."""
        ...


MODES: dict[Mode, SlicingMode] = {m.name: m for m in (memory.MODE, shared.MODE, mig.MODE)}


def mode_of(policy: GpuSlicePolicy) -> SlicingMode:
    return MODES[policy.spec.slicing.mode]


def device_kinds(policy: GpuSlicePolicy, selection: Selection) -> list[DeviceKind]:
    """The policy's kinds of device: smallest first within MIG, the slices first otherwise."""
    return mode_of(policy).kinds(policy, selection)


def environment(grant: Grant) -> dict[str, str]:
    """Every ``GPUSLICE_*`` variable for ``grant``: the common ones and its mode's."""
    return MODES[grant.device.mode].environment(grant)
