"""The fake backend behaves as a GPU does where the plugin and the MIG manager depend on it: MIG
instances take their memory slices, outlive the agent in its state directory, and operations can be
made to fail on cue."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuslice.agent.gpus import GpuBackendError
from gpuslice.agent.gpus.fake import FakeBackend, parse_fake_gpus
from gpuslice.agent.gpus.fake_state import FakeFault, InjectedFailure
from gpuslice.cli import main


def backend(tmp_path: Path) -> FakeBackend:
    return FakeBackend("node-a", [("a100-40gb", 2)], tmp_path)


def test_instances_take_their_memory_slices_and_outlive_the_backend(tmp_path: Path) -> None:
    fake = backend(tmp_path)
    gpu = fake.discover()[0]
    three, one = gpu.mig_profile("3g.20gb"), gpu.mig_profile("1g.5gb")
    assert three is not None
    assert one is not None
    made = fake.create_mig(gpu, three, 4)
    with pytest.raises(GpuBackendError, match=r"memory slices \[5\] are taken by the 3g.20gb instance at 4"):
        fake.create_mig(gpu, one, 5)
    with pytest.raises(GpuBackendError, match="cannot be placed at memory slice 1"):
        fake.create_mig(gpu, three, 1)
    fake.create_mig(gpu, one, 0)

    again = backend(tmp_path)  # a restarted agent
    [gpu_again, other] = again.discover()
    assert [(i.profile, i.start) for i in again.mig_instances(gpu_again)] == [("3g.20gb", 4), ("1g.5gb", 0)]
    assert again.mig_instances(other) == []
    again.destroy_mig(gpu_again, made)
    assert [(i.profile, i.start) for i in again.mig_instances(gpu_again)] == [("1g.5gb", 0)]
    remade = again.create_mig(gpu_again, three, 4)
    assert remade.uuid != made.uuid, "a remade instance has a new UUID, as on a real GPU"


def test_mig_mode_and_injected_failures(tmp_path: Path) -> None:
    fake = FakeBackend("node-a", [("h100-80gb", 2)], tmp_path)
    gpu = fake.discover()[0]
    one = gpu.mig_profile("1g.10gb")
    assert one is not None
    fake.set_mig_mode(gpu, False)
    assert not fake.mig_enabled(gpu)
    assert FakeBackend("node-a", [("h100-80gb", 2)], tmp_path).discover()[0].mig_enabled is False, "MIG mode persists"
    with pytest.raises(GpuBackendError, match="not in MIG mode"):
        fake.create_mig(gpu, one, 0)
    fake.set_mig_mode(gpu, True)

    fake.state.update(lambda s: s.failures.append(InjectedFailure(operation="create-mig", gpu=0, remaining=1)))
    with pytest.raises(GpuBackendError, match="create-mig failed"):
        fake.create_mig(gpu, one, 0)
    assert fake.create_mig(gpu, one, 0).profile == "1g.10gb", "the injected failure is used up"


def test_faults_are_reported_by_uuid_until_cleared(tmp_path: Path) -> None:
    fake = backend(tmp_path)
    gpus = fake.discover()
    fake.state.update(lambda s: s.faults.__setitem__(1, FakeFault(kind="xid", code=79, message="fell off the bus")))
    faults = fake.faults()
    assert list(faults) == [gpus[1].uuid]
    assert faults[gpus[1].uuid].reason == "XID-79"
    assert fake.faults() == faults, "a raised fault stays until cleared"
    fake.state.update(lambda s: s.faults.clear())
    assert fake.faults() == {}


def test_fake_processes_are_kept_per_gpu_and_pid(tmp_path: Path) -> None:
    """`gpuslice fake-gpu use` replaces a process's entry, and --memory 0 ends it."""
    runner = CliRunner()
    for memory in ("3Gi", "5Gi"):
        assert runner.invoke(main, ["fake-gpu", "--state-dir", str(tmp_path), "use", "1", "--pid", "7",
                                    "--memory", memory]).exit_code == 0
    shown = runner.invoke(main, ["fake-gpu", "--state-dir", str(tmp_path), "show"]).output
    assert '"memory": 5368709120' in shown
    assert shown.count('"pid": 7') == 1
    runner.invoke(main, ["fake-gpu", "--state-dir", str(tmp_path), "use", "1", "--pid", "7", "--memory", "0"])
    assert '"pid": 7' not in runner.invoke(main, ["fake-gpu", "--state-dir", str(tmp_path), "show"]).output


def test_mig_capable_gpus_can_start_with_mig_mode_off(tmp_path: Path) -> None:
    """As a GPU fresh from the factory (or after the GPU Operator's all-disabled): MIG mode off, its
    profiles known all the same (NVML's v1 query answers whatever the mode)."""
    fake = FakeBackend("node-a", parse_fake_gpus("h100-80gb:2:mig-off,l4:1"), tmp_path)
    gpus = fake.discover()
    assert [(g.mig_capable, g.mig_enabled) for g in gpus] == [(True, False), (True, False), (False, False)]
    assert gpus[0].mig_profile("3g.40gb") is not None
    fake.set_mig_mode(gpus[0], True)
    assert [g.mig_enabled for g in FakeBackend("node-a", parse_fake_gpus("h100-80gb:2:mig-off"), tmp_path).discover()] \
        == [True, False], "after that, the state file knows better"


def test_mig_capable_gpus_start_as_a_node_is_usually_found(tmp_path: Path) -> None:
    """Without an option an A100 starts in MIG mode (an admin gave the node to MIG: only a reset
    switches it), an H100 with MIG mode off (from the factory; the agent switches it); mig-on and
    mig-off say otherwise."""
    fake = FakeBackend("node-a", parse_fake_gpus("a100-40gb:1,h100-80gb:1,h100-80gb:1:mig-on,l4:1"), tmp_path)
    assert [g.mig_enabled for g in fake.discover()] == [True, False, True, False]


def test_an_ampere_gpu_switches_mig_mode_only_at_a_reset(tmp_path: Path) -> None:
    """As a real A100 on a node whose clients hold it (planning.node.mig_mode): the agent never switches it."""
    fake = FakeBackend("node-a", parse_fake_gpus("a100-40gb:1:mig-off"), tmp_path)
    [gpu] = fake.discover()
    with pytest.raises(GpuBackendError, match=r"switches MIG mode only at a GPU reset"):
        fake.set_mig_mode(gpu, True)
    assert not fake.mig_enabled(gpu)
    with pytest.raises(GpuBackendError, match=r"unknown option 'mig-of'; the options are mig-off and mig-on"):
        parse_fake_gpus("a100-40gb:2:mig-of")


def test_an_admins_mig_mode_is_pending_until_the_reset_before_hopper_and_current_at_once_after(
    tmp_path: Path,
) -> None:
    """`fake-gpu mig-mode` is nvidia-smi -mig: an A100's mode waits for `fake-gpu reset` (nvidia-smi -r), which a
    process on the GPU refuses and which no MIG instance survives; an H100's is current at once."""
    fake = FakeBackend("node-a", parse_fake_gpus("a100-40gb:2,h100-80gb:1"), tmp_path)
    a100, _, h100 = fake.discover()
    run = CliRunner()

    def cli(*args: str) -> str:
        done = run.invoke(main, ["fake-gpu", "--state-dir", str(tmp_path), *args])
        assert done.exit_code == 0, done.output
        return done.output

    assert cli("mig-mode", "2", "on") == "GPU 2: MIG mode on.\n"
    assert fake.mig_enabled(h100)
    fake.create_mig(a100, a100.mig_profiles[0], 0)
    refused = run.invoke(main, ["fake-gpu", "--state-dir", str(tmp_path), "mig-mode", "0", "off"])
    assert refused.exit_code == 1
    assert "GPU 0 has 1 MIG instances; destroy them before turning MIG mode off" \
        in refused.output
    fake.destroy_mig(a100, fake.mig_instances(a100)[0])
    assert "pending until the GPU is reset (gpuslice fake-gpu reset 0" in cli("mig-mode", "0", "off")
    assert fake.mig_enabled(a100), "pending: NVML's current mode is still on"
    assert fake.discover()[0].mig_enabled, "a restarted agent reads it on too"
    cli("use", "0", "--pid", "4242", "--memory", "1Gi")
    refused = run.invoke(main, ["fake-gpu", "--state-dir", str(tmp_path), "reset", "0"])
    assert refused.exit_code == 1
    assert "processes 4242 use it" in refused.output
    cli("use", "0", "--pid", "4242", "--memory", "0")
    fake.create_mig(a100, a100.mig_profiles[0], 0)  # (the mode is still on)
    assert cli("reset", "0", "1") == "GPU 0 reset: MIG mode off.\nGPU 1 reset: MIG mode on.\n"
    assert not fake.mig_enabled(a100)
    assert fake.mig_instances(a100) == []
    assert fake.state.read().gpus[0].instances == [], "no instance survives a reset"

