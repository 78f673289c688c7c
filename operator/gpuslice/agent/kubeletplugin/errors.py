"""Why a claim could not be prepared or unprepared. The message goes to the kubelet, which puts it
in the pod's Events, so it names the claim, the device and what to do."""

from __future__ import annotations

from gpuslice.agent.node_state.gpuops import GpuOps
from gpuslice.errors import GpusliceError
from gpuslice.inventory.gpus import Gpu


class PluginError(GpusliceError):
    """A claim failed; ``str()`` is what the pod's Event shows."""


class ClaimNotFound(PluginError):
    """The claim is gone or was recreated under the same name."""


class NotAllocated(PluginError):
    """The claim has no allocation (yet) for this node's pool."""


class DeviceNotPublished(PluginError):
    """The allocation names a device the agent does not publish now: it was removed (a policy edit,
    a drain) after the scheduler picked it. It never reaches a container."""


class DeviceUnusable(PluginError):
    """The device is published but cannot be given to a container now (its GPU is gone, MIG failed)."""


class DeviceHeld(PluginError):
    """Another claim prepared on this node holds the device, or what the claims would hold together
    is more than the GPU has (``planning.node.overlap``): whatever the allocation says, no container
    gets it."""


class UnprepareFailed(PluginError):
    """Something prepare made could not be removed; the kubelet retries."""


class NotATenant(PluginError):
    """The claim's namespace may not use the devices it was allocated: the tenancy rule did not judge
    the allocation (its binding gone, say) or its policy changed since. No container gets them."""


def present_gpu(ops: GpuOps, uuid: str, device: str = "") -> Gpu:
    """The GPU ``uuid`` as the agent found it at start: a device of a GPU gone since is unusable, and the
    pod is told what to do."""
    found = ops.gpus.get(uuid)
    if found is None:
        raise DeviceUnusable(
            f"GPU {uuid}{f' of device {device}' if device else ''} is not on this node any more (the agent"
            " found it missing at start: it fell off the bus or was removed); its devices are withdrawn once"
            " no claim holds them. Delete the pod so that the scheduler picks another device.")
    return found
