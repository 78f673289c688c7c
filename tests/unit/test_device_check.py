"""``hack/nvidia/device-check.sh``, the first thing to run on a GPU machine, run here against a node of
the mock NVML library (go-nvml's DGX H100 behind NVML's C ABI, a driver root with device nodes and
NVIDIA's MPS binaries, the toolkit's spec written by nvidia-ctk): what it prints is asserted, and that
the check reached no NVML entry point that writes (the library records every call)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslice.agent.check import READ_CALLS
from gpuslice.devcluster.mocknvml import MockProcess, MockState, prepare_node

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "nvidia" / "device-check.sh"
MAKE_INSTANCE = """
import sys
from pathlib import Path
from gpuslice.agent.gpus.nvml import NvmlBackend
backend = NvmlBackend(driver_root=Path(sys.argv[1]))
gpu = backend.discover()[1]
backend.set_mig_mode(gpu, True)
backend.create_mig(gpu, next(p for p in gpu.mig_profiles if p.name == "3g.40gb"), 4)
"""


def test_the_device_check_on_a_mock_dgx_h100(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("a mock NVML node needs root (device nodes): run the unit tier as root, as CI does")
    node = prepare_node(tmp_path / "node", "check-node", "h100-80gb", 2, mig=False)
    subprocess.run([sys.executable, "-c", MAKE_INSTANCE, str(node.root)], check=True, capture_output=True)
    config = node.state.config

    def busy(state: MockState) -> None:
        state.gpu(config, 0).processes = [MockProcess(pid=os.getpid(), memory=3 * 1024**3, sm=0.25)]

    node.state.update(busy)
    trace = tmp_path / "trace"
    out = tmp_path / "check.txt"
    env = {**os.environ, "NVIDIA_DRIVER_ROOT": str(node.root), "GPUSLICE_PYTHON": sys.executable,
           "GPUSLICE_NVIDIA_CDI_DIR": str(node.cdi), "GPUSLICE_HOST_PROC": str(node.root / "proc"),
           "GPUSLICE_MOCK_NVML_TRACE": str(trace)}
    done = subprocess.run(["sh", str(SCRIPT), str(out)], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert f"# driver root: {node.root}, user: 0" in text
    assert "== Inventory: 2 GPUs" in text
    assert "product 'NVIDIA H100 80GB HBM3'; GFD labels it 'NVIDIA-H100-80GB-HBM3'; catalog: h100-80gb" in text
    assert "memory 81559 MiB (catalog 81559 MiB: same)" in text
    assert "Nvidia, Hopper, compute capability 9.0, driver 550.54.15, CUDA 12.4" in text
    assert "PCI bus id 0000:1b:00.0" in text
    assert "NUMA node 0, NVLink domain nvswitch-0000:a0:00.0" in text, "where the mock's DGX puts GPU 0 (NVML)"
    assert "MIG: capable, mode enabled" in text
    assert "3g.40gb          40448 MiB  up to 2  60 SMs" in text
    assert "placements 0+4, 4+4" in text
    assert "NVML's versioned profile query: NOT_SUPPORTED with MIG mode off" in text
    assert "instances now: 1" in text
    assert f"specs in {node.cdi}, best first, for driver 550.54.15: {node.cdi}/nvidia.yaml (nvidia.com/gpu" in text
    assert "kernel (/proc/devices): nvidia 195, nvidia-uvm 510, nvidia-caps 511; mig-minors: present" in text
    assert "GPU 1, MIG instance 3g.40gb at 4 (made by nvcdi's rules" in text
    assert '"path": "/dev/nvidia-caps/nvidia-cap156"' in text, "gpu1/gi2/access: the 3g at slice 4 is GPU instance 2"
    assert f"nvidia-cuda-mps-control: {node.root}/usr/bin/nvidia-cuda-mps-control" in text
    assert f"pid {os.getpid()}" in text
    assert "# exit status of the check: 0 (0: nothing wrong)" in text, text[-3000:]
    assert "== 0 problems" in text
    called = set(trace.read_text().split())
    allowed = {name for call in READ_CALLS for name in (call, f"{call}_v2", f"{call}_v3", f"{call}V")}
    assert called - allowed - {"nvmlInitWithFlags", "nvmlErrorString"} == set(), "the check only read"
