"""Where the kubelet plugin meets the kubelet and the container runtime, and where it keeps its state."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuslice.dra.names import DRIVER
from gpuslice.errors import GpusliceError

MAX_SOCKET_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux


class PluginPathError(GpusliceError):
    pass


@dataclass(frozen=True)
class PluginPaths:
    registrar_dir: Path  # the kubelet's plugins_registry
    plugins_dir: Path  # the kubelet's plugins directory; ours is <plugins_dir>/gpu.gpuslice.dev

    @property
    def registration_socket(self) -> Path:
        return self.registrar_dir / f"{DRIVER}-reg.sock"

    @property
    def driver_dir(self) -> Path:
        return self.plugins_dir / DRIVER

    @property
    def service_socket(self) -> Path:
        return self.driver_dir / "dra.sock"

    def check(self) -> None:
        """A socket path must fit a ``sockaddr_un``, which a deep state directory easily exceeds: refuse
        it at start with the fix, rather than fail at bind."""
        for flag, socket in (("--kubelet-registrar-dir", self.registration_socket),
                             ("--kubelet-plugins-dir", self.service_socket)):
            length = len(str(socket.absolute()).encode())
            if length > MAX_SOCKET_PATH:
                raise PluginPathError(
                    f"the kubelet plugin socket {socket.absolute()} is {length} bytes long; a unix socket path has"
                    f" at most {MAX_SOCKET_PATH}. Give {flag} a shorter directory (the kubelet's defaults,"
                    " /var/lib/kubelet/plugins_registry and /var/lib/kubelet/plugins, fit).")


@dataclass(frozen=True)
class PluginSettings:
    """Where the plugin meets the kubelet and the container runtime, and where it keeps its state.

    The defaults are a kubelet's and containerd's; the dev cluster gives each fake node its own.
    ``state_dir`` holds the claims' checkpoints, the record of what was published and, with the
    fake backend, the fake GPUs' state (default: the driver's directory under ``plugins_dir``).
    ``boot_id_file`` is where the node's boot ID is read, to tell checkpoints from an earlier boot.
    """

    registrar_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    cdi_dir: Path = Path("/var/run/cdi")
    state_dir: Path | None = None
    boot_id_file: Path = Path("/proc/sys/kernel/random/boot_id")
    mps_dir: Path | None = None  # the MPS daemons' pipe and log directories; unset: <state dir>/mps
    mps_shm_dir: Path = Path("/dev/shm/gpuslice-mps")  # the MPS daemons' shared memory (the host's tmpfs)

    @property
    def paths(self) -> PluginPaths:
        return PluginPaths(self.registrar_dir, self.plugins_dir)

    @property
    def resolved_state_dir(self) -> Path:
        return self.state_dir if self.state_dir is not None else self.plugins_dir / DRIVER

    @property
    def resolved_mps_dir(self) -> Path:
        return self.mps_dir if self.mps_dir is not None else self.resolved_state_dir / "mps"
