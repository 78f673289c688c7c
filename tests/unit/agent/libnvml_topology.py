"""The stand-in NVML library's topology calls (``libnvml``): NVLink state, the far end of each link
and what it is, and a GPU's NUMA memory affinity, as NVML answers them.

A GPU's ``links`` (``libnvml.FakeGpu``) are its NVLinks in order: (the far end's bus number, NVML's
device type) for an active link, None for one that is down; NVML answers INVALID_ARGUMENT past the
last and NOT_SUPPORTED for a GPU without NVLink (``links`` None). ``affinity`` is the NUMA nodes
NVML's memory affinity names (None: NOT_SUPPORTED)."""

from __future__ import annotations

from typing import Any, Protocol

import pynvml

OK = pynvml.NVML_SUCCESS
GPU, SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH


class _Gpu(Protocol):
    links: list[tuple[int, int] | None] | None
    affinity: tuple[int, ...] | None
    unreadable_links: frozenset[int]


class TopologyCalls:
    """Mixed into ``FakeLibNvml``, which finds a GPU by its handle (``_gpu``)."""

    def _gpu(self, handle: Any) -> Any: ...

    def _link(self, handle: Any, link: int) -> tuple[int, tuple[int, int] | None]:
        gpu: _Gpu | None = self._gpu(handle)
        if gpu is None or gpu.links is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED, None
        if not 0 <= int(link) < len(gpu.links):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT, None
        return OK, gpu.links[int(link)]

    def _nvmlDeviceGetNvLinkState(self, handle: Any, link: int, ref: Any) -> int:
        code, found = self._link(handle, link)
        if code == OK:
            ref._obj.value = pynvml.NVML_FEATURE_ENABLED if found is not None else pynvml.NVML_FEATURE_DISABLED
        return int(code)

    def _nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle: Any, link: int, ref: Any) -> int:
        code, found = self._link(handle, link)
        gpu: _Gpu | None = self._gpu(handle)
        if code != OK or found is None:
            return int(code) if code != OK else pynvml.NVML_ERROR_INVALID_ARGUMENT
        if gpu is not None and int(link) in gpu.unreadable_links:
            return pynvml.NVML_ERROR_UNKNOWN
        bus = found[0]
        ref._obj.busId = f"00000000:{bus:02X}:00.0".encode()  # NVML's form, as nvmlDeviceGetPciInfo's
        ref._obj.domain, ref._obj.bus, ref._obj.device = 0, bus, 0
        return OK

    def _nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int, ref: Any) -> int:
        code, found = self._link(handle, link)
        if code != OK or found is None:
            return int(code) if code != OK else pynvml.NVML_ERROR_INVALID_ARGUMENT
        ref._obj.value = found[1]
        return OK

    def _nvmlDeviceGetMemoryAffinity(self, handle: Any, words: int, ref: Any, scope: Any) -> int:
        gpu: _Gpu | None = self._gpu(handle)
        if gpu is None or gpu.affinity is None or scope.value != pynvml.NVML_AFFINITY_SCOPE_NODE:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        for node in gpu.affinity:
            ref._obj[node // 64] |= 1 << (node % 64)
        return OK


def switched(buses: tuple[int, ...], per_gpu: int = 18) -> list[tuple[int, int] | None]:
    """A GPU's links spread over NVSwitches at ``buses`` (an HGX board)."""
    return [(buses[i % len(buses)], SWITCH) for i in range(per_gpu)]


def bridged(partner: int, links: int = 12) -> list[tuple[int, int] | None]:
    """A GPU's links, every one to its partner (an NVLink bridge)."""
    return [(partner, GPU)] * links
