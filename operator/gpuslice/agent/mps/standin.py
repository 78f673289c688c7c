"""A stand-in for ``nvidia-cuda-mps-control``, for nodes with fake GPUs (the dev cluster, kind).

It does what the agent relies on in the real one, from the same environment:

- ``standin -f``: the control daemon in the foreground. It reads ``CUDA_MPS_PIPE_DIRECTORY``,
  ``CUDA_MPS_LOG_DIRECTORY`` and ``CUDA_VISIBLE_DEVICES``, listens on ``<pipe>/control``, writes
  ``<pipe>/nvidia-cuda-mps-control.pid`` (as the real daemon does, MPS documentation, "Tools and
  Interface Reference") and logs to ``<log>/control.log``. It answers ``quit`` (and exits),
  ``get_server_list`` (no server: it runs no CUDA), ``get_default_active_thread_percentage``, and
  refuses anything else. SIGTERM ends it too. It also exits once its pipe directory is gone, so a
  test that removes a fake node's directory leaves no process behind.
- ``standin`` without ``-f``: the control client, as ``echo quit | nvidia-cuda-mps-control``: each
  line of stdin is sent to the daemon of ``CUDA_MPS_PIPE_DIRECTORY`` and its answer printed; exit
  1 when no daemon listens there.

It imports nothing of gpuslice, so it starts in a fraction of the agent's time.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import sys
import threading
from pathlib import Path

PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL = "control"


def _log(log_dir: Path, message: str) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    with (log_dir / "control.log").open("a") as log:
        log.write(f"[{stamp}] {message}\n")


def _answer(command: str, log_dir: Path) -> tuple[str, bool]:
    """The reply to one command, and whether the daemon then quits."""
    verb = command.split()[0] if command.split() else ""
    _log(log_dir, f"Accepting command {command!r}")
    if verb == "quit":
        return "", True
    if verb == "get_server_list":
        return "", False
    if verb == "get_default_active_thread_percentage":
        return "100.0", False
    return f"unknown command {verb!r} (gpuslice's stand-in daemon knows quit, get_server_list and" \
           " get_default_active_thread_percentage)", False


def daemon(pipe: Path, log_dir: Path) -> int:
    pipe.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    control = pipe / CONTROL
    control.unlink(missing_ok=True)
    # Logged before the control socket and pid file exist: they say "ready", and a reader of the log
    # then finds this line (under load it was read before it was written).
    _log(log_dir, f"Control daemon started (gpuslice stand-in), CUDA_VISIBLE_DEVICES="
                  f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')}")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(control))
    server.listen(8)
    server.settimeout(1.0)
    quitting = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: quitting.set())
    (pipe / PID_FILE).write_text(f"{os.getpid()}\n")
    try:
        while not quitting.is_set() and pipe.is_dir():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            with connection:
                command = connection.recv(4096).decode(errors="replace").strip()
                reply, stop = _answer(command, log_dir)
                connection.sendall(reply.encode())
                if stop:
                    quitting.set()
        _log(log_dir, "Control daemon exiting" if pipe.is_dir() else "Pipe directory removed; exiting")
    finally:
        server.close()
        if pipe.is_dir():
            control.unlink(missing_ok=True)
            (pipe / PID_FILE).unlink(missing_ok=True)
    return 0


def client(pipe: Path) -> int:
    for line in sys.stdin.read().splitlines():
        if not line.strip():
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(5.0)
            try:
                connection.connect(str(pipe / CONTROL))
            except OSError as error:
                print(f"Cannot find MPS control daemon process ({error})", file=sys.stderr)
                return 1
            connection.sendall(line.strip().encode())
            connection.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := connection.recv(4096):
                reply += chunk
            if reply:
                print(reply.decode(errors="replace"))
    return 0


def main(argv: list[str]) -> int:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    log_dir = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    if "-f" in argv:
        return daemon(pipe, log_dir)
    if "-d" in argv:
        print("gpuslice's stand-in runs in the foreground only (-f); the agent supervises it", file=sys.stderr)
        return 2
    return client(pipe)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
