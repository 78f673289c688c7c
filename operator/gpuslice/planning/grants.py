"""What a claim is given on a device, and what its containers learn about it (pure).

An allocation result names a device; the kubelet plugin reads that device back from
the published slices (:meth:`Device.from_manifest`) and makes a :class:`Grant` of it,
together with what the result adds (a shared device's consumed capacity and share
id, admin access) and what prepare made (a MIG instance). Each slicing mode says
which ``GPUSLICE_*`` variables describe its grants (``planning.modes``); every
container that uses the device gets them, so a pod can print what it received.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuslice.dra.quantity import format_bytes
from gpuslice.planning.devices import Device

ENV_PREFIX = "GPUSLICE_"


@dataclass(frozen=True)
class Grant:
    """One device of one claim, as prepared."""

    claim: str  # namespace/name
    request: str
    device: Device
    share_id: str | None = None
    consumed_memory: int | None = None  # bytes the scheduler accounted to this claim (shared devices)
    admin_access: bool = False
    mig_uuid: str | None = None  # the MIG instance backing the device, once it exists

    @property
    def memory_limit(self) -> int:
        """The GPU memory this grant stands for: the claim's share of a shared device, else the device's."""
        return self.consumed_memory if self.consumed_memory is not None else self.device.memory


def common_environment(grant: Grant) -> dict[str, str]:
    """The variables every mode sets."""
    device = grant.device
    env = {
        "DEVICE": device.name,
        "GPU_UUID": device.gpu_uuid,
        "PRODUCT": device.product_name,
        "POLICY": device.policy,
        "MODE": device.mode,
        "CLAIM": grant.claim,
        "MEMORY_LIMIT": format_bytes(grant.memory_limit),
        "MEMORY_LIMIT_BYTES": str(grant.memory_limit),
    }
    if grant.admin_access:
        env["ADMIN_ACCESS"] = "true"
    elif device.isolation is not None:
        env["ISOLATION"] = device.isolation
    return env


def prefixed(env: Mapping[str, str]) -> dict[str, str]:
    return {f"{ENV_PREFIX}{k}": v for k, v in env.items()}
