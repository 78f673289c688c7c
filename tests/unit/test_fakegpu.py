"""`gpuslice fake-gpu` on a node of the mock NVML library: the same commands as on the fake backend,
reaching the agent through NVML as a real GPU's would (processes, XID and ECC events, a lost GPU,
failing calls, an admin's MIG mode switch), read back here through the real pynvml."""

from __future__ import annotations

import os
from pathlib import Path

import pynvml
import pytest
from click.testing import CliRunner

from gpuslice.agent.gpus import GpuBackendError
from gpuslice.agent.gpus.nvml import NvmlBackend
from gpuslice.cli import main
from gpuslice.devcluster.mocknvml import CONFIG_DIR, LIB_DIR, STATE_LINK
from tests.unit.agent.mocknvml_node import MockNode, mock_node


def fake_gpu(agent_dir: Path, *args: str) -> str:
    done = CliRunner().invoke(main, ["fake-gpu", "--state-dir", str(agent_dir), *args])
    assert done.exit_code == 0, done.output
    return done.output


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    """The agent's state directory, linked to the node's mock state as the dev cluster links it."""
    directory = tmp_path / "agent"
    directory.mkdir()
    os.symlink(tmp_path / "root" / LIB_DIR / CONFIG_DIR, directory / STATE_LINK)
    return directory


def test_processes_and_their_sm_share_reach_nvml(tmp_path: Path, agent_dir: Path) -> None:
    with mock_node(tmp_path / "root", "h100-80gb", count=2):
        backend = NvmlBackend(pynvml)
        first, _ = backend.discover()
        fake_gpu(agent_dir, "use", "0", "--pid", "4242", "--memory", "12Gi", "--sm", "30")
        assert [(p.pid, p.used, p.sm) for p in backend.processes(first)] == [(4242, 12 * 1024**3, 0.3)]
        fake_gpu(agent_dir, "use", "0", "--pid", "4242", "--memory", "0")
        assert backend.processes(first) == []


def test_a_lost_gpu_until_cleared_and_failing_calls(tmp_path: Path, agent_dir: Path) -> None:
    with mock_node(tmp_path / "root", "h100-80gb", count=1) as node:
        backend = NvmlBackend(pynvml)
        [gpu] = backend.discover()
        fake_gpu(agent_dir, "fault", "0", "--lost")
        assert {f.kind for f in backend.faults().values()} == {"lost"}
        fake_gpu(agent_dir, "clear", "0")
        assert backend.faults() == {}
        fake_gpu(agent_dir, "mig-mode", "0", "on")  # an admin's nvidia-smi -mig 1: current at once on an H100
        assert backend.mig_enabled(gpu)
        fake_gpu(agent_dir, "fail", "create-mig", "--gpu", "0")
        with pytest.raises(GpuBackendError, match="Unknown Error"):
            backend.create_mig(gpu, gpu.mig_profiles[0], 0)
        backend.create_mig(gpu, gpu.mig_profiles[0], 0)  # once only
        shown = fake_gpu(agent_dir, "show")
        assert '"migMode": 1' in shown
        assert _posted(node) == 0


def test_xid_79_is_an_event_and_a_lost_gpu(tmp_path: Path, agent_dir: Path) -> None:
    with mock_node(tmp_path / "root", "a100-40gb", count=1) as node:
        fake_gpu(agent_dir, "fault", "0", "--xid", "79")
        fake_gpu(agent_dir, "fault", "0", "--ecc")
        state = node.state.read()
        assert [(e.type, e.data) for e in state.gpus["0"].events] == [(0x8, 79), (0x2, 0)]
        assert state.gpus["0"].lost
        fake_gpu(agent_dir, "heal")
        assert not node.state.read().gpus["0"].lost


def _posted(node: MockNode) -> int:
    return node.state.read().seq


def test_an_admins_mig_mode_is_pending_until_the_reset_before_hopper_and_current_at_once_after(
    tmp_path: Path, agent_dir: Path,
) -> None:
    """`fake-gpu mig-mode` is nvidia-smi -mig here too, through NVML's own pending mode: an A100's waits for
    `fake-gpu reset` (nvidia-smi -r), which a process on the GPU refuses and which no MIG instance
    survives; an H100's is current at once (as on the fake backend, tests/unit/agent/gpus/test_fake.py)."""
    with mock_node(tmp_path / "root", ["a100-40gb", "a100-40gb", "h100-80gb"], mig=True) as node:
        backend = NvmlBackend(pynvml)
        a100, _, h100 = backend.discover()
        assert fake_gpu(agent_dir, "mig-mode", "2", "off") == "GPU 2: MIG mode off.\n"
        assert not backend.mig_enabled(h100)
        made = backend.create_mig(a100, a100.mig_profiles[0], 0)
        refused = CliRunner().invoke(main, ["fake-gpu", "--state-dir", str(agent_dir), "mig-mode", "0", "off"])
        assert refused.exit_code == 1
        assert "GPU 0 has 1 MIG instances; destroy them before turning MIG mode off" in refused.output
        backend.destroy_mig(a100, made)
        assert "pending until the GPU is reset (gpuslice fake-gpu reset 0" in fake_gpu(agent_dir, "mig-mode", "0", "off")
        assert backend.mig_enabled(a100), "pending: NVML's current mode is still on"
        pynvml.nvmlInit()
        try:
            assert pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0)) == [1, 0], "current, pending"
        finally:
            pynvml.nvmlShutdown()
        fake_gpu(agent_dir, "use", "0", "--pid", "4242", "--memory", "1Gi")
        refused = CliRunner().invoke(main, ["fake-gpu", "--state-dir", str(agent_dir), "reset", "0"])
        assert refused.exit_code == 1
        assert "processes 4242 use it" in refused.output
        fake_gpu(agent_dir, "use", "0", "--pid", "4242", "--memory", "0")
        backend.create_mig(a100, a100.mig_profiles[0], 0)  # (the mode is still on)
        assert fake_gpu(agent_dir, "reset", "0", "1") == "GPU 0 reset: MIG mode off.\nGPU 1 reset: MIG mode on.\n"
        assert not backend.mig_enabled(a100)
        assert node.state.read().gpus["0"].instances == [], "no MIG instance survives a reset"
