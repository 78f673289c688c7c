"""Loopback ports for the dev cluster's components."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

from gpuslice.devcluster.errors import DevClusterError

_handed_out: set[int] = set()
PORTS_ENV = "GPUSLICE_DEV_PORTS"


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def port_range() -> range:
    """Where ports are drawn from: ``GPUSLICE_DEV_PORTS`` (``LOW-HIGH``, HIGH excluded) when set, so
    that dev clusters started at once by different processes (the test tiers' workers) draw from
    ranges of their own; else the 12,000 ports below the ephemeral range."""
    if chosen := os.environ.get(PORTS_ENV):
        low, _, high = chosen.partition("-")
        if not (low.isdigit() and high.isdigit() and 1024 <= int(low) < int(high) <= 65536):
            raise DevClusterError(f"{PORTS_ENV}={chosen!r}: expected LOW-HIGH, two port numbers with"
                                  " 1024 <= LOW < HIGH <= 65536, e.g. 20000-26000")
        return range(int(low), int(high))
    below = _ephemeral_range()[0]
    return range(max(1024, below - 12000), below)


def free_port() -> int:
    """A port that is free now and stays likely free until a component binds it.

    Ports the kernel hands out (bind to 0) come from the ephemeral range, which outgoing
    connections also draw from, so one could take ours between now and the bind. Ports are
    therefore drawn below that range (or from ``GPUSLICE_DEV_PORTS``), and never twice in one
    process.
    """
    candidates = list(port_range())
    random.SystemRandom().shuffle(candidates)
    for port in candidates[:200]:
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure_port_free(port: int, what: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as error:
            raise DevClusterError(
                f"Port {port} on 127.0.0.1, asked for {what}, is already in use ({error.strerror})."
                " Stop whatever listens there, or choose another port (or none, to get a free one)."
            ) from error


__all__ = ["PORTS_ENV", "ensure_port_free", "free_port", "port_range"]
