"""Where the dev cluster's ports come from (devcluster.ports)."""

from __future__ import annotations

import pytest

from gpuslice.devcluster import ports
from gpuslice.devcluster.errors import DevClusterError


def test_ports_come_from_the_range_the_environment_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ports.PORTS_ENV, "23000-23040")
    drawn = {ports.free_port() for _ in range(10)}
    assert len(drawn) == 10
    assert all(23000 <= p < 23040 for p in drawn)


def test_else_below_the_kernels_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ports.PORTS_ENV, raising=False)
    below = ports._ephemeral_range()[0]
    assert below - 12000 <= ports.free_port() < below


@pytest.mark.parametrize("bad", ["23000", "23040-23000", "80-2000", "a-b", "23000-70000"])
def test_a_range_that_is_not_one_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(ports.PORTS_ENV, bad)
    with pytest.raises(DevClusterError, match="GPUSLICE_DEV_PORTS"):
        ports.free_port()
