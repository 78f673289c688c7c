"""NVIDIA's device plugin v0.17.4 (built from its module, ``hack/nvidia/deviceplugin``) over the mock NVML
library, as a neighbour on a node would run: it registers with a kubelet (here a stand-in for the
kubelet's registration service) and advertises the GPUs it found, which are the library's: a whole GPU as
``nvidia.com/gpu`` and a MIG instance as ``nvidia.com/mig-<profile>`` (MIG strategy mixed). What it
advertises is what gpuslice's agent then sees in the Node's allocatable (``test_coexistence.py``).

The gRPC messages are read and written by hand (a few protobuf fields of the device plugin API v1beta1:
``RegisterRequest``'s version 1, endpoint 2, resource name 3; ``ListAndWatchResponse``'s devices 1,
each with its ID 1 and health 2): gpuslice carries no copy of the kubelet's protos."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gpuslice.devcluster.mocknvml import LIB_DIR, MockState, admin_sets_mig_mode, prepare_node
from gpuslice.devcluster.nvidia_build import device_plugin

MAKE_INSTANCE = """
import sys
from pathlib import Path
from gpuslice.agent.gpus.nvml import NvmlBackend
backend = NvmlBackend(driver_root=Path(sys.argv[1]))
gpu = backend.discover()[1]
backend.create_mig(gpu, next(p for p in gpu.mig_profiles if p.name == "3g.20gb"), 4)
print(backend.mig_instances(gpu)[0].uuid)
"""
# The plugin's sockets in a directory of ours: /var/lib/kubelet/device-plugins in its own mount namespace.
# The driver's /proc/driver (MIG capability files) is the mock root's there too.
IN_NAMESPACE = ('mount -t tmpfs tmpfs /var/lib; mkdir -p /var/lib/kubelet/device-plugins; '
                'mount --bind "$0" /var/lib/kubelet/device-plugins; mount --bind "$1" /proc/driver; shift; '
                'exec "$@"')


def fields(raw: bytes) -> Iterator[tuple[int, bytes | int]]:
    """A protobuf message's (field number, value): varints and length-delimited values only."""
    at = 0
    while at < len(raw):
        key, at = varint(raw, at)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, at = varint(raw, at)
            yield number, value
        elif kind == 2:
            size, at = varint(raw, at)
            yield number, raw[at:at + size]
            at += size
        else:
            raise ValueError(f"wire type {kind} is not read here")


def varint(raw: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = raw[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def test_nvidias_device_plugin_advertises_the_mock_librarys_gpus(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("a mock NVML node and a mount namespace need root: run the unit tier as root, as CI does")
    node = prepare_node(tmp_path / "node", "dp-node", "a100-40gb", 2)  # A100s start in MIG mode
    config = node.state.config

    def whole_gpu_0(state: MockState) -> None:
        admin_sets_mig_mode(state, config, 0, False)

    node.state.update(whole_gpu_0)
    made = subprocess.run([sys.executable, "-c", MAKE_INSTANCE, str(node.root)], check=True, capture_output=True,
                          text=True)
    mig_uuid = made.stdout.split()[-1]
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    registered: list[tuple[str, str]] = []

    def register(request: bytes, context: grpc.ServicerContext) -> bytes:
        found = dict(fields(request))
        registered.append((bytes(found[3]).decode(), bytes(found[2]).decode()))  # type: ignore[arg-type]
        return b""

    kubelet = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    kubelet.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "v1beta1.Registration", {"Register": grpc.unary_unary_rpc_method_handler(register)})])
    kubelet.add_insecure_port(f"unix://{sockets / 'kubelet.sock'}")
    kubelet.start()
    trace = tmp_path / "trace"
    env = {**os.environ, "LD_LIBRARY_PATH": str(node.root / LIB_DIR), "GPUSLICE_MOCK_NVML_TRACE": str(trace)}
    log = (tmp_path / "plugin.log").open("w")
    plugin = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-ec", IN_NAMESPACE,
                               str(sockets), str(node.root / "proc/driver"), str(device_plugin()),
                               f"--nvidia-driver-root={node.root}",
                               "--mig-strategy=mixed"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while len(registered) < 2 and time.monotonic() < deadline and plugin.poll() is None:
            time.sleep(0.2)
        assert sorted(r for r, _ in registered) == ["nvidia.com/gpu", "nvidia.com/mig-3g.20gb"], \
            (tmp_path / "plugin.log").read_text()[-3000:]
        advertised = {}
        for resource, endpoint in registered:
            with grpc.insecure_channel(f"unix://{sockets / endpoint}") as channel:
                watch = channel.unary_stream("/v1beta1.DevicePlugin/ListAndWatch")
                first = next(iter(watch(b"", timeout=20)))
                advertised[resource] = sorted(bytes(dict(fields(bytes(d)))[1]).decode()  # type: ignore[arg-type]
                                              for n, d in fields(first) if n == 1)
    finally:
        plugin.terminate()
        plugin.wait(timeout=30)
        kubelet.stop(None)
        log.close()
    whole = advertised["nvidia.com/gpu"]
    assert len(whole) == 1
    assert whole[0].startswith("GPU-"), "device id strategy uuid: the library's deterministic UUID"
    assert advertised["nvidia.com/mig-3g.20gb"] == [mig_uuid]
    called = trace.read_text().split()
    assert "nvmlDeviceGetMigDeviceHandleByIndex" in called
    assert not [c for c in called if c.startswith("stub:")], "the plugin called only what the library implements"
