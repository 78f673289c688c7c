"""Whether the agent shares the node's PID namespace, which each pod's GPU use depends on.

NVML gives a GPU's processes by their PIDs in the *caller's* PID namespace, and leaves out those
it cannot see there (the kernel module's ``_gpuConvertPid``, ``os_find_ns_pid``): an agent in a
PID namespace of its own sees only its own processes (the MPS servers), none of the pods'. The
DaemonSet runs it with ``hostPID: true``; this says so loudly where that was dropped.
"""

from __future__ import annotations

import os
from pathlib import Path


def sees_node_pids(host_proc: Path, own_proc: Path = Path("/proc")) -> bool | None:
    """True where ``own_proc`` (this process's PID namespace) and ``host_proc`` (the node's /proc)
    are the same namespace: procfs resolves ``self`` to the reader's PID in the namespace the proc
    was mounted for, so the two differ in a child namespace. None where ``host_proc`` is no procfs
    (the dev cluster's fake nodes write their processes' cgroups into a directory)."""
    try:
        node = os.readlink(host_proc / "self")
    except OSError:
        return None
    return node == os.readlink(own_proc / "self")
