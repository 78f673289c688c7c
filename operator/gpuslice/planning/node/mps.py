"""What a container of an MPS policy is given (pure): the daemon's directories and its limits.

One NVIDIA MPS control daemon serves the MPS claims of one tenant namespace on one GPU
(``agent.mps``): its control socket takes ``quit`` and ``terminate_client`` from any client, and
its clients share ``/dev/shm``, so no two namespaces share one. A container reaches its
namespace's daemon through three directories of that daemon, mounted where CUDA looks by
default, so a client finds its daemon even with its variables cleared:

- the pipe directory at ``/tmp/nvidia-mps`` (``CUDA_MPS_PIPE_DIRECTORY``'s default), read-write:
  the daemon's control socket and each server's;
- the log directory at ``/var/log/nvidia-mps`` (``CUDA_MPS_LOG_DIRECTORY``'s default), read-only:
  the daemon's own log, which clients never write;
- the daemon's shared-memory directory at ``/dev/shm``: an MPS server and its clients exchange
  shared memory there, so both must see the same one (NVIDIA's DRA driver and device plugin
  mount theirs the same way: ``sharing.go`` ``GetCDIContainerEdits``, ``internal/plugin/mps.go``).

And two variables the CUDA driver reads when the client starts (NVIDIA's MPS documentation,
"Environment Variables"; both only ever narrow what the daemon allows, and both are Volta MPS):

- ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M``: the device memory the client may allocate
  through CUDA, its allocation: the slice's size, or the capacity the claim consumed on a shared
  device. The device is named by ordinal: the daemon is started with ``CUDA_VISIBLE_DEVICES`` set
  to its one GPU's UUID, so every client sees that GPU as device 0 (the documentation's
  ``CUDA_VISIBLE_DEVICES`` remapping), and NVIDIA's device plugin moved its limits from UUIDs to
  ordinals because limits set by UUID were not applied (v0.15.0 release notes). ``M`` is MiB,
  as in NVIDIA's DRA driver (``limit.Megabyte`` in ``api/.../sharing.go``) and device plugin.
- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: the share of the GPU's threads the client may use, in
  proportion to its memory (a memory slice's ``compute`` counter is the same share in
  thousandths), rounded up, at least 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gpuslice.dra.cdi import ContainerEdits
from gpuslice.dra.names import short_hash
from gpuslice.dra.nvidia_cdi import MPS_PIPE_DIRECTORY

PIPE_IN_CONTAINER = MPS_PIPE_DIRECTORY
LOG_IN_CONTAINER = "/var/log/nvidia-mps"
SHM_IN_CONTAINER = "/dev/shm"
PINNED_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
LOG_DIRECTORY = "CUDA_MPS_LOG_DIRECTORY"
MIB = 1024**2


class DaemonKey(NamedTuple):
    """Whose daemon: a GPU (its UUID) and the tenant namespace whose claims on it it serves."""

    gpu: str
    namespace: str


def namespace_tag(namespace: str) -> str:
    """``ns-<12 hex digits>``: the namespace's directory name under its GPU's. A hash, not the name
    (up to 63 bytes), so that the pipe directory's sockets fit a unix socket path whatever the name."""
    return f"ns-{short_hash(namespace, length=12)}"


@dataclass(frozen=True)
class DaemonDirs:
    """One daemon's MPS directories on the host."""

    pipe: Path
    log: Path
    shm: Path


def pinned_limit(allocated: int) -> str:
    """``0=<MiB>M``: the client's device memory limit on its one visible GPU."""
    return f"0={max(allocated // MIB, 1)}M"


def thread_percentage(allocated: int, gpu_memory: int) -> int:
    """The client's share of the GPU's threads, in proportion to its memory (rounded up, 1 to 100)."""
    if gpu_memory <= 0:
        return 100
    return min(100, max(1, -(-100 * allocated // gpu_memory)))


def client_edits(dirs: DaemonDirs, allocated: int, gpu_memory: int) -> ContainerEdits:
    """The container edits that make a container an MPS client of its namespace's daemon, limited to
    ``allocated`` bytes of the GPU's ``gpu_memory``."""
    env: Mapping[str, str] = {
        PIPE_DIRECTORY: PIPE_IN_CONTAINER,
        LOG_DIRECTORY: LOG_IN_CONTAINER,
        PINNED_LIMIT: pinned_limit(allocated),
        THREAD_PERCENTAGE: str(thread_percentage(allocated, gpu_memory)),
    }
    mounts = (
        {"hostPath": str(dirs.pipe), "containerPath": PIPE_IN_CONTAINER, "options": ["rw", "nosuid", "nodev", "bind"]},
        {"hostPath": str(dirs.log), "containerPath": LOG_IN_CONTAINER,
         "options": ["ro", "nosuid", "nodev", "noexec", "bind"]},
        {"hostPath": str(dirs.shm), "containerPath": SHM_IN_CONTAINER,
         "options": ["rw", "nosuid", "nodev", "noexec", "bind"]},
    )
    return ContainerEdits(env=env, mounts=mounts)
