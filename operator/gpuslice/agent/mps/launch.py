"""Start ``nvidia-cuda-mps-control`` with its GPU's shared-memory directory as ``/dev/shm``.

An MPS server and its clients exchange shared memory under ``/dev/shm``, so the daemon (and the
servers it starts) must see the same directory the GPU's client containers get there
(``planning.node.mps``). NVIDIA's DRA driver gives its daemon pod a hostPath at ``/dev/shm``
(``templates/mps-control-daemon.tmpl.yaml``); the agent runs its daemons itself, so each one gets a
private mount namespace in which that directory is bind-mounted on ``/dev/shm``, and then becomes
the daemon (exec). The agent's own ``/dev/shm`` is untouched. It needs CAP_SYS_ADMIN (the agent of
the ``nvidia`` overlay is privileged).

``python -m gpuslice.agent.mps.launch SHM_DIR COMMAND [ARGS...]``
"""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)} (the agent needs CAP_SYS_ADMIN to run MPS daemons)")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m gpuslice.agent.mps.launch SHM_DIR COMMAND [ARGS...]", file=sys.stderr)
        return 2
    shm, command = argv[0], argv[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # Nothing mounted here may reach the agent's namespace (or the host's, through shared mounts).
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
    _check(libc.mount(shm.encode(), b"/dev/shm", None, MS_BIND, None), f"bind-mounting {shm} on /dev/shm")
    os.execvp(command[0], command)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
