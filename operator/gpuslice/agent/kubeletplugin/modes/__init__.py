"""What prepare does on the node for each slicing mode, behind one interface.

The pure half of a mode (its devices, the variables a container receives) is in
``planning.modes``; this is the half that touches the GPU. Memory and shared
devices need nothing made: the scheduler's counters and capacity accounting are
their boundary, and prepare only records what the claim got. Dynamic MIG makes
the instance at the allocated placement; a static layout's instance exists already.
"""

from __future__ import annotations

from typing import Protocol

from gpuslice.agent.gpus import MigInstance
from gpuslice.agent.kubeletplugin.modes import memory, mig, shared
from gpuslice.agent.node_state.checkpoint import MigRecord, PreparedDevice
from gpuslice.agent.node_state.gpuops import GpuOps
from gpuslice.planning.devices import Device
from gpuslice.planning.mode_traits import MEMORY, MIG, SHARED


class DevicePrep(Protocol):
    def plan(self, device: Device, admin_access: bool, static: bool) -> MigRecord | None:
        """What prepare is going to make for ``device`` (written to the ``started`` checkpoint first)."""
        ...

    async def prepare(self, ops: GpuOps, record: PreparedDevice) -> MigInstance | None:
        """Make it so; the MIG instance the device stands on, if any. Idempotent."""
        ...

    async def unprepare(self, ops: GpuOps, record: PreparedDevice) -> None:
        """Undo what ``prepare`` made (nothing that existed before it). Idempotent."""
        ...


# Keyed as the registry is (planning.modes.MODES; tests/unit/planning/test_modes.py holds them equal).
PREPS: dict[str, DevicePrep] = {MEMORY.name: memory.PREP, SHARED.name: shared.PREP, MIG.name: mig.PREP}


def prep_of(mode: str) -> DevicePrep:
    return PREPS[mode]
