"""The kubelet plugin binds its sockets at every length a unix socket path may have."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from gpuslice.agent.kubeletplugin.prepare import Preparer
from gpuslice.agent.kubeletplugin.server import KubeletPlugin
from gpuslice.agent.kubeletplugin.settings import MAX_SOCKET_PATH, PluginPathError, PluginPaths
from gpuslice.dra.names import DRIVER


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory (pytest's own may be too deep to leave room for the names)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as place:
        yield Path(place)


def _paths_of_length(place: Path, length: int) -> PluginPaths:
    """Registrar and plugins directories whose sockets are both ``length`` bytes long."""
    reg_tail = f"/{DRIVER}-reg.sock"
    service_tail = f"/{DRIVER}/dra.sock"
    base = str(place.absolute())
    registrar = Path(base + "/r" + "x" * (length - len(base) - 2 - len(reg_tail)))
    plugins = Path(base + "/p" + "x" * (length - len(base) - 2 - len(service_tail)))
    paths = PluginPaths(registrar, plugins)
    assert len(str(paths.registration_socket).encode()) == length
    assert len(str(paths.service_socket).encode()) == length
    return paths


@pytest.mark.parametrize("length", [MAX_SOCKET_PATH - 1, MAX_SOCKET_PATH])
async def test_sockets_bind_up_to_the_longest_unix_socket_path(short_dir: Path, length: int) -> None:
    # grpcio's "unix://" form refused 106 and 107 bytes; the plugin's check let them through.
    paths = _paths_of_length(short_dir, length)
    plugin = KubeletPlugin(paths, cast(Preparer, object()))
    await plugin.start()
    try:
        assert paths.registration_socket.is_socket()
        assert paths.service_socket.is_socket()
    finally:
        await plugin.stop()


def test_a_longer_socket_path_is_refused_with_the_flag_to_change(short_dir: Path) -> None:
    with pytest.raises(PluginPathError, match="--kubelet-registrar-dir"):
        KubeletPlugin(_paths_of_length(short_dir, MAX_SOCKET_PATH + 1), cast(Preparer, object()))
