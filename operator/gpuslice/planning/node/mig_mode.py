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
the GPU Operator's MIG config). Once nothing of the GPU is published the agent destroys its MIG
instances and, on Hopper and later, switches MIG mode off (``agent.mig_manager``, as NVIDIA's
``maybeDisableMigMode`` does), unless the GPU Operator's MIG manager runs on the node (its config
owns the mode: ``MIG_MODE_ON_OPERATOR``); before Hopper an admin switches it and resets the GPU
(``MIG_MODE_ON_RESET``, with the step: ``mig_mode_step``).

Why the agent resets no GPU. NVIDIA's MIG manager (NVIDIA/mig-parted, ``pkg/mig/reconfigure/
reconfigure.go``, ``Run``) makes a GPU idle by taking every GPU client off the node: it pauses the
device plugin, GPU feature discovery, DCGM and its exporter by their deploy labels and waits for
their pods to go, stops the host's GPU services and, for a mode change, the kubelet. Only then does
``nvidia-mig-parted apply --mode-only`` destroy the GPUs' MIG instances, set the mode, and, when it
is pending, reset every GPU of the node in one ``nvidia-smi -r -i <every bus id>``
(``cmd/nvidia-mig-parted/apply/mode.go``, ``util/device.go``: ``nvmlResetAllGPUs``); with its reboot
option a mode that still did not change reboots the node. It checks no GPU for processes: idle means
no client left on the node. A node agent owns none of those clients, a reset of one GPU fails while
any of them holds it, and a reset of every GPU would end the pods on the others: the agent cannot do
it safely, so it names the step instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.left_out import MIG_MODE_OFF, MIG_MODE_ON, MIG_MODE_ON_OPERATOR, MIG_MODE_ON_RESET
from gpuslice.planning.mode_traits import ModeTraits

# go-nvlib's strings (nvml.ARCHITECTURES) of the architectures before Hopper. Anything else, an
# architecture NVML reports as unknown included, counts as Hopper or later, as NVIDIA's comparison
# of NVML's enum (unknown is 0xFFFFFFFF) does.
BEFORE_HOPPER = frozenset({"Kepler", "Maxwell", "Pascal", "Volta", "Turing", "Ampere", "Ada Lovelace"})


def switches_mig_mode(gpu: Gpu) -> bool:
    """Whether the agent may switch ``gpu``'s MIG mode: MIG-capable, Hopper or later."""
    return gpu.mig_capable and gpu.architecture not in BEFORE_HOPPER


def mig_mode_conflict(mode: ModeTraits, gpu: Gpu, operator: bool = False) -> str | None:
    """Why a policy of slicing ``mode`` can have no device on ``gpu`` in its MIG mode now, if so;
    ``operator``: the GPU Operator's MIG manager runs on the node (its config owns the mode)."""
    if mode.instances and gpu.mig_capable and not gpu.mig_enabled and not switches_mig_mode(gpu):
        return MIG_MODE_OFF
    if not mode.instances and gpu.mig_enabled:
        if operator:
            return MIG_MODE_ON_OPERATOR
        return MIG_MODE_ON if switches_mig_mode(gpu) else MIG_MODE_ON_RESET
    return None


def mig_mode_step(indexes: Sequence[int], enable: bool) -> str:
    """What an admin runs on the node to switch the MIG mode of GPUs ``indexes`` (before Hopper): the
    mode with nvidia-smi, then the reset that makes it current, as NVIDIA's MIG manager resets GPUs."""
    switch = " && ".join(f"nvidia-smi -i {i} -mig {int(enable)}" for i in sorted(indexes))
    return (f"{switch}, then nvidia-smi -r -i {','.join(str(i) for i in sorted(indexes))} with every client of"
            f" {'the GPU' if len(indexes) == 1 else 'these GPUs'} stopped, or reboot the node")


def conflict_note(policy: str, gpu: Gpu, reason: str) -> str:
    """The planner's note (the agent's log, ``gpuslice plan``) for a GPU left out for ``reason``."""
    where = f"{policy}: GPU {gpu.index} ({gpu.product_name}, {gpu.architecture})"
    if reason == MIG_MODE_ON:
        return (f"{where} has MIG mode on, so no whole-GPU, memory or shared device can use it; the agent destroys"
                " its MIG instances and switches MIG mode off once nothing of the GPU is published")
    if reason == MIG_MODE_ON_RESET:
        return (f"{where} has MIG mode on, so no whole-GPU, memory or shared device can use it, and switches it"
                " only at a GPU reset, which gpuslice does not do: the agent destroys its MIG instances once"
                f" nothing of the GPU is published; then switch MIG mode off ({mig_mode_step([gpu.index], False)})")
    if reason == MIG_MODE_ON_OPERATOR:
        return (f"{where} has MIG mode on, set by the GPU Operator's MIG manager, which owns MIG mode on this node:"
                " label the node nvidia.com/mig.config=all-disabled for whole-GPU, memory or shared devices")
    return (f"{where} has MIG mode off and switches it only at a GPU reset, which gpuslice does not do: enable MIG"
            f" mode on it ({mig_mode_step([gpu.index], True)}); the agent publishes once it reads MIG mode on")
