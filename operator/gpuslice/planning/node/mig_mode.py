"""Which MIG mode a GPU must be in for a slicing mode, and which GPUs the agent may switch (pure).

NVML switches MIG mode with ``nvmlDeviceSetMigMode``, which "may unbind or reset the device to
activate the requested mode" and leaves it pending when the GPU is not idle (``activationStatus``
``NVML_ERROR_IN_USE``, ``RESET_REQUIRED``; go-nvml ``gen/nvml/nvml.h``). On a node nvidia-persistenced,
DCGM and the agents of monitoring hold every GPU, so in practice:

- **Hopper and later** switch without a reset. NVIDIA's DRA driver toggles MIG mode there itself
  (``cmd/gpu-kubelet-plugin/nvlib.go``: ``supportsMIGModeToggle`` is ``architecture >= Hopper``;
  ``createMigDevice`` turns it on, ``maybeDisableMigMode`` off once no MIG device is left), and so
  does gpuslice's agent.
- **Below Hopper** (A100, A30: Ampere) the mode changes only at a GPU reset, which neither NVIDIA's
  DRA driver nor gpuslice does ("MIG mode is disabled and cannot be toggled without GPU reset",
  ``isDynamicMIGCapable``): the GPU Operator's MIG manager stops the GPU's clients and resets it
  (``assets/state-mig-manager``). NVIDIA's DRA driver offers dynamic MIG on such a GPU only when
  its MIG mode is already on; so does gpuslice, for static layouts too, and it never calls
  ``SetMigMode`` there (a pending mode would take effect at a reset nobody asked for).

The other way round, a GPU in MIG mode cannot be used whole: CUDA sees only its MIG devices, and
the NVIDIA Container Toolkit writes no whole-GPU entry for it (``pkg/nvcdi/lib-nvml.go``: ``if
isMigEnabled { return nil }``). NVIDIA's DRA driver publishes a full GPU only with MIG mode off
(``GetPerGpuAllocatableDevices``). So a whole-GPU, memory-slice or shared policy publishes nothing
on a GPU whose MIG mode is on (a policy switched from ``mig``, dynamic MIG that left the mode on,
the GPU Operator's MIG config). On Hopper and later the agent then switches MIG mode off once
nothing of the GPU is published and it has no MIG instance (``agent.mig_manager``, as NVIDIA's
``maybeDisableMigMode`` does), unless the GPU Operator's MIG manager runs on the node (its config
owns the mode); before Hopper an admin does (a reset).
"""

from __future__ import annotations

from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.left_out import MIG_MODE_OFF, MIG_MODE_ON
from gpuslice.planning.mode_traits import ModeTraits

# go-nvlib's strings (nvml.ARCHITECTURES) of the architectures before Hopper. Anything else, an
# architecture NVML reports as unknown included, counts as Hopper or later, as NVIDIA's comparison
# of NVML's enum (unknown is 0xFFFFFFFF) does.
BEFORE_HOPPER = frozenset({"Kepler", "Maxwell", "Pascal", "Volta", "Turing", "Ampere", "Ada Lovelace"})


def switches_mig_mode(gpu: Gpu) -> bool:
    """Whether the agent may switch ``gpu``'s MIG mode: MIG-capable, Hopper or later."""
    return gpu.mig_capable and gpu.architecture not in BEFORE_HOPPER


def mig_mode_conflict(mode: ModeTraits, gpu: Gpu) -> str | None:
    """Why a policy of slicing ``mode`` can have no device on ``gpu`` in its MIG mode now, if so."""
    if mode.instances and gpu.mig_capable and not gpu.mig_enabled and not switches_mig_mode(gpu):
        return MIG_MODE_OFF
    if not mode.instances and gpu.mig_enabled:
        return MIG_MODE_ON
    return None


def conflict_note(policy: str, gpu: Gpu, reason: str) -> str:
    """The planner's note (the agent's log, ``gpuslice plan``) for a GPU left out for ``reason``."""
    if reason == MIG_MODE_ON:
        then = ("the agent switches it off once nothing of the GPU is published and it has no MIG instance"
                if switches_mig_mode(gpu) else
                f"switch it off (nvidia-smi -i {gpu.index} -mig 0, then reset the GPU or reboot)")
        return (f"{policy}: GPU {gpu.index} ({gpu.product_name}, {gpu.architecture}) has MIG mode on, so no whole-GPU,"
                f" memory or shared device can use it; {then}")
    return (f"{policy}: GPU {gpu.index} ({gpu.product_name}, {gpu.architecture}) has MIG mode off and switches"
            " it only at a GPU reset, which gpuslice does not do: enable MIG mode on it (nvidia-smi -i"
            f" {gpu.index} -mig 1, then reset the GPU or reboot); the agent publishes once it reads MIG mode on")
