"""The dev cluster's state directory: where everything it makes lives, and the
record (``cluster.json``) that lets ``down`` and ``kubeconfig`` find a running
cluster and lets ``up`` recognise a stale one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpuslice.devcluster.errors import DevClusterError
from gpuslice.dra.names import DRIVER, short_hash

MAX_SOCKET_PATH = 107  # bytes of a unix socket path (sockaddr_un.sun_path, less its NUL)
# The longest socket path below a node's directory: the kubelet plugin's registration socket.
# The longest socket path under a node's directory: the kubelet plugin's registration socket, or a
# socket in an MPS daemon's pipe directory (agent.mps.daemons: its tags are of fixed length).
SOCKET_ROOM = max(len(f"/plugins_registry/{DRIVER}-reg.sock"), len("/agent/mps/gpu-01234567/ns-0123456789ab/pipe/")
                  + 20)


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpuslice" / "dev-cluster"


@dataclass
class ClusterRecord:
    """What a running dev cluster tells other commands about itself."""

    supervisor_pid: int
    server: str
    kubeconfig: str
    kubernetes_version: str
    components: dict[str, int] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)


class StateDir:
    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().resolve()

    @property
    def record_path(self) -> Path:
        return self.root / "cluster.json"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def runtime_dir(self) -> Path:
        """A short directory of this state directory's own, for node directories whose sockets would not
        fit a unix socket path under a deep state directory."""
        return Path(tempfile.gettempdir()) / f"gpuslice-{short_hash(str(self.root.absolute()))}"

    def node_dir(self, node: str) -> Path:
        """A fake node's own directory (created): ``nodes/<node>``, or, when a kubelet plugin socket under
        it would pass the 107 bytes of a unix socket path, a short one in the system's temporary
        directory that ``nodes/<node>`` links to (so ``exec-env`` and ``fake-gpu --node`` still find it)."""
        place = self.root / "nodes" / node
        if len(str(place.absolute()).encode()) + SOCKET_ROOM <= MAX_SOCKET_PATH:
            place.mkdir(parents=True, exist_ok=True)
            return place
        short = self.runtime_dir / node
        short.mkdir(parents=True, exist_ok=True)
        place.parent.mkdir(parents=True, exist_ok=True)
        if not place.is_symlink():
            place.symlink_to(short, target_is_directory=True)
        return short

    def read_record(self) -> ClusterRecord | None:
        try:
            return ClusterRecord(**json.loads(self.record_path.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as error:
            raise DevClusterError(
                f"{self.record_path} is not a dev cluster record ({error}). If no dev cluster"
                f" runs from {self.root}, delete that file and try again."
            ) from error

    def write_record(self, record: ClusterRecord) -> None:
        temporary = self.record_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(record), indent=2))
        temporary.replace(self.record_path)

    def remove_record(self) -> None:
        self.record_path.unlink(missing_ok=True)

    def running_record(self) -> ClusterRecord | None:
        """The record of a cluster that is still up, or None."""
        record = self.read_record()
        if record is not None and pid_alive(record.supervisor_pid):
            return record
        return None

    def prepare_fresh(self) -> str | None:
        """Make the directory ready for a new cluster; say what stale state was cleared.

        Every ``up`` starts from an empty etcd, new certificates and fresh nodes, so
        a directory left by a crashed cluster is simply wiped (after making sure
        none of its processes survived).
        """
        running = self.running_record()
        if running is not None:
            raise DevClusterError(
                f"A dev cluster is already running from {self.root} (supervisor pid"
                f" {running.supervisor_pid}, API server {running.server}). Use it (kubeconfig:"
                f" {running.kubeconfig}), or stop it first: gpuslice dev-cluster down"
                f" --state-dir {self.root}"
            )
        note = None
        stale = self.read_record()
        if stale is not None:
            for pid in stale.components.values():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            note = (
                f"Cleared stale state in {self.root} from a dev cluster that is no longer"
                f" running (supervisor pid {stale.supervisor_pid})."
            )
            self.remove_record()
        # A fresh cluster has fresh nodes: their pod runners' and agents' state (checkpoints, CDI specs,
        # recorded containers, fake GPUs) went with the old one.
        for directory in (self.etcd_data, self.pki, self.root / "nodes", self.runtime_dir):
            shutil.rmtree(directory, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.pki.mkdir(mode=0o700)
        self.logs.mkdir(exist_ok=True)
        for log in self.logs.glob("*.log"):
            log.unlink()
        return note


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive for our purposes.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies do not count; no /proc: no)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False
