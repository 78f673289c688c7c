"""The read-only GPU check, on the stand-in NVML library under the real pynvml: what it prints, and
that it cannot change a GPU."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pynvml
import pytest
from click.testing import CliRunner

from gpuslice.agent import check as check_module
from gpuslice.agent.check import READ_CALLS, ReadOnlyNvml, WriteRefused, run_check
from gpuslice.agent.gpus import GpuBackendError, nvml
from gpuslice.agent.gpus.nvml import NvmlBackend
from gpuslice.cli import main
from gpuslice.inventory.catalog import MI
from tests.unit.agent import cdi_fixtures
from tests.unit.agent.libnvml import FakeLibNvml, installed


def hooks_on(root: Path, *paths: str) -> Path:
    """A host whose filesystem has ``paths`` (the toolkit's hook binaries)."""
    for path in paths:
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).touch()
    return root


def check(lib: FakeLibNvml, root: Path, spec: str | None,
          hooks: tuple[str, ...] = (cdi_fixtures.HOOK, cdi_fixtures.OPERATOR_HOOK)) -> tuple[int, str]:
    cdi = root / "cdi"
    cdi.mkdir(parents=True)
    if spec is not None:
        (cdi / "nvidia.yaml").write_text(spec)
    lines: list[str] = []
    with installed(lib):
        backend = NvmlBackend(pynvml)
        for gpu in backend.discover():  # an instance made beforehand, as an operator's layout would be
            if gpu.mig_enabled:
                backend.create_mig(gpu, gpu.mig_profiles[0], 0)
        lib.calls.clear()
        code = run_check(pynvml, [cdi], lines.append, host_root=hooks_on(root / "host", *hooks),
                         **cdi_fixtures.host(root))
    return code, "\n".join(lines)


def test_an_h200_node_is_described_and_nothing_is_written(tmp_path: Path) -> None:
    lib = FakeLibNvml([("h200-141gb", False), ("h200-141gb", True)])
    code, text = check(lib, tmp_path, cdi_fixtures.nvml_mode(lib.gpus[0].uuid, "MIG-none"))
    assert lib.writes == [], "the check made no call that changes a GPU"
    assert set(lib.calls) - {"nvmlInitWithFlags", "nvmlShutdown"} <= {
        f"{c}_v2" for c in READ_CALLS} | {f"{c}V" for c in READ_CALLS} | {f"{c}_v3" for c in READ_CALLS} | READ_CALLS
    assert "GPU 0 (minor 0)" in text
    assert "product 'NVIDIA H200'; GFD labels it 'NVIDIA-H200'; catalog: h200-141gb" in text
    assert "memory 143771 MiB (catalog 143771 MiB: same)" in text
    assert "PCI bus id 0000:18:00.0, PCIe root" in text
    assert '"cudaComputeCapability": {"version": "9.0.0"}' in text
    assert "1g.18gb+me" in text
    assert "placements 0+1, 1+1" in text
    assert "instances now: 1" in text
    assert "NVML's versioned profile query: NOT_SUPPORTED with MIG mode off" in text, "GPU 0"
    assert "go-nvlib's name" not in text, "GPU 1, in MIG mode: NVML names each profile as go-nvlib does"
    assert "a dynamic MIG instance" in text
    assert "nvidia-cap" in text
    assert "common edits each claim's spec copies" in text
    assert "== MPS (slicing.isolation: MPS): found, not started" in text
    assert "nvidia-cuda-mps-control: not on PATH nor under /" in text, "this machine has no NVIDIA driver"
    assert "GPU 0: compute capability 9.0: per-client memory and thread limits (Volta MPS)" in text
    assert "GPU 0: 0 processes" in text
    assert text.rstrip().endswith("== 0 problems"), text[-2000:]
    assert code == 0


def test_the_mps_binary_is_found_in_the_driver_root_and_never_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[Path] = []  # NVML's loading from the root is test_nvml's; here the root holds the binary
    monkeypatch.setattr(nvml, "load_nvml_from", loaded.append)
    lib = FakeLibNvml([("h100-80gb", False)])
    driver = tmp_path / "driver"
    (driver / "usr/bin").mkdir(parents=True)
    binary = driver / "usr/bin/nvidia-cuda-mps-control"
    ran = tmp_path / "ran"
    binary.write_text(f"#!/bin/sh\ntouch {ran}\n")
    binary.chmod(0o755)
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "nvidia.yaml").write_text(cdi_fixtures.nvml_mode(lib.gpus[0].uuid, "MIG-none"))
    lines: list[str] = []
    with installed(lib):
        run_check(pynvml, [tmp_path / "cdi"], lines.append, driver, **cdi_fixtures.host(tmp_path))
    assert f"nvidia-cuda-mps-control: {binary}" in lines
    assert not ran.exists(), "found, not started"
    assert loaded == [driver]


def test_what_differs_from_the_catalog_and_a_missing_spec_are_problems(tmp_path: Path) -> None:
    lib = FakeLibNvml([("h100-80gb", False)])
    lib.gpus[0].model = replace(lib.gpus[0].model, memory=81920 * MI)  # as a different driver might say
    code, text = check(lib, tmp_path, None)
    assert code == 1
    assert "NVML reports 81920 MiB, the catalog's h100-80gb 81559 MiB" in text
    assert "holds the driver's libraries and hooks" in text


def test_a_write_never_reaches_the_gpu(tmp_path: Path) -> None:
    lib = FakeLibNvml([("h100-80gb", False)])
    with installed(lib):
        backend = NvmlBackend(ReadOnlyNvml(pynvml))  # type: ignore[arg-type]
        [gpu] = backend.discover()
        with pytest.raises(WriteRefused, match="nvmlDeviceSetMigMode"):
            backend.set_mig_mode(gpu, True)
        with pytest.raises(WriteRefused, match="nvmlDeviceCreateGpuInstanceWithPlacement"):
            backend.create_mig(replace(gpu, mig_enabled=True), gpu.mig_profiles[0], 0)
    assert lib.writes == []
    assert lib.gpus[0].mig_mode == 0, "MIG mode untouched"


def test_the_agent_command_runs_the_check_without_a_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(check_module, "HOST_ROOT", hooks_on(tmp_path / "host", cdi_fixtures.HOOK))
    lib = FakeLibNvml([("l4", False)])
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "nvidia.yaml").write_text(cdi_fixtures.device_plugin(lib.gpus[0].uuid))
    with installed(lib):
        result = CliRunner().invoke(main, ["agent", "--backend", "nvml", "--check", "--node", "gpu-host",
                                           "--nvidia-cdi-dir", str(tmp_path / "cdi")], env={"KUBECONFIG": "/nowhere"})
    assert "skipped: everything that needs an API server" in result.output
    assert "NVIDIA L4" in result.output
    assert result.exit_code == 0, result.output
    assert lib.writes == []
    refused = CliRunner().invoke(main, ["agent", "--backend", "fake", "--check", "--node", "x"])
    assert refused.exit_code == 2
    assert "--check reads real GPUs" in refused.output


def test_a_gpu_operator_node_shows_where_the_host_keeps_its_nodes(tmp_path: Path) -> None:
    lib = FakeLibNvml([("a100-40gb", False), ("a100-40gb", True)])
    code, text = check(lib, tmp_path, cdi_fixtures.management_mode(cdi_fixtures.OPERATOR_DRIVER_ROOT))
    assert "where the specs say the host keeps its device nodes: /run/nvidia/driver" in text
    assert "kernel (/proc/devices): nvidia 195, nvidia-uvm 508, nvidia-caps 234, drm 226" in text
    assert '/dev/nvidia-uvm: {"fileMode": 438, "hostPath": "/run/nvidia/driver/dev/nvidia-uvm"' in text
    assert '"hostPath": "/run/nvidia/driver/dev/nvidia0"' in text, "a whole GPU's node, as the toolkit names it"
    assert text.rstrip().endswith("== 0 problems"), text[-2000:]
    assert code == 0


def test_a_spec_of_another_driver_is_a_problem(tmp_path: Path) -> None:
    lib = FakeLibNvml([("l4", False)])
    code, text = check(lib, tmp_path, cdi_fixtures.nvml_mode(lib.gpus[0].uuid, "MIG-none", driver="570.86.15"))
    assert "best first, for driver 580.95.05" in text
    assert "nvidia.com/gpu, cdiVersion 0.7.0, driver 570.86.15" in text
    assert "is a CDI spec of driver 570.86.15, the driver is 580.95.05" in text
    assert "are for another driver" in text, "and no common edits for claims"
    assert code == 1


def test_a_profile_nvml_names_otherwise_than_go_nvlib_is_a_problem(tmp_path: Path) -> None:
    lib = FakeLibNvml([("a100-40gb", True)])
    model = lib.gpus[0].model
    renamed = tuple(replace(p, name="3g.19gb") if p.name == "3g.20gb" else p for p in model.mig_profiles)
    lib.gpus[0].model = replace(model, mig_profiles=renamed)  # what the versioned query answers
    code, text = check(lib, tmp_path, cdi_fixtures.nvml_mode(lib.gpus[0].uuid, "MIG-none"))
    assert "GPU 0: profile 3g.20gb (go-nvlib's name) is 'MIG 3g.19gb' to NVML" in text
    assert code == 1


def test_the_check_loads_nvml_from_the_driver_root_it_is_given(tmp_path: Path) -> None:
    """--nvidia-driver-root reaches the check (a GPU Operator node keeps libnvidia-ml.so.1 only under
    /run/nvidia/driver): a root without the library is a problem line naming it, not a traceback."""
    (tmp_path / "driver").mkdir()
    with installed(FakeLibNvml([("l4", False)])):
        result = CliRunner().invoke(main, ["agent", "--backend", "nvml", "--check", "--node", "gpu-host",
                                           "--nvidia-driver-root", str(tmp_path / "driver")],
                                    env={"KUBECONFIG": "/nowhere"})
    assert f"NVML from the driver's root {tmp_path / 'driver'}" in result.output
    assert f"PROBLEM: no libnvidia-ml.so.1 under --nvidia-driver-root {tmp_path / 'driver'}" in result.output
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_user_nvml_refuses_the_placement_query_is_told_to_run_as_root(tmp_path: Path) -> None:
    """nvmlDeviceGetGpuInstancePossiblePlacements "Requires privileged user" (nvml.h): as another
    user the check goes on, and says what it could not read."""
    lib = FakeLibNvml([("h100-80gb", False), ("l4", False)])
    lib.privileged = False
    code, text = check(lib, tmp_path, cdi_fixtures.nvml_mode(lib.gpus[0].uuid, "MIG-none"))
    assert "NVML refused the MIG placement query (NO_PERMISSION: it needs root)" in text
    assert "NVIDIA L4" in text, "the rest of the check ran"
    assert "== CDI" in text
    assert code == 1


def test_a_hook_the_host_does_not_have_is_a_problem(tmp_path: Path) -> None:
    """`nvidia-ctk cdi generate` on a GPU Operator node without --nvidia-cdi-hook-path names
    /usr/bin/nvidia-cdi-hook, which only the toolkit's container has: every container would fail."""
    lib = FakeLibNvml([("l4", False)])
    code, text = check(lib, tmp_path, cdi_fixtures.nvml_mode(lib.gpus[0].uuid, "MIG-none"),
                       hooks=(cdi_fixtures.OPERATOR_HOOK,))
    assert f"names the hook {cdi_fixtures.HOOK}, which" in text
    assert "--nvidia-cdi-hook-path=/usr/local/nvidia/toolkit/nvidia-cdi-hook" in text
    assert code == 1
    code, text = check(lib, tmp_path / "again", cdi_fixtures.nvml_mode(lib.gpus[0].uuid, "MIG-none"))
    assert f"{cdi_fixtures.HOOK}: present" in text
    assert code == 0, text[-2000:]


def test_an_nvml_error_in_the_mig_listing_is_a_problem_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(self: NvmlBackend, gpu: object) -> None:
        raise GpuBackendError("NVML failed while listing (GPU is lost)")

    monkeypatch.setattr(NvmlBackend, "versioned_profile_names", fails)
    lib = FakeLibNvml([("h100-80gb", False)])
    code, text = check(lib, tmp_path, cdi_fixtures.nvml_mode(lib.gpus[0].uuid, "MIG-none"))
    assert "PROBLEM: GPU 0 MIG: NVML failed while listing (GPU is lost)" in text
    assert "== CDI" in text, "the check went on"
    assert code == 1


def test_a_gpu_no_spec_names_on_a_node_without_the_drivers_devices_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    """GPU 1 is in MIG mode (the device plugin's spec names only GPU 0) and /proc/devices lists no NVIDIA
    device (the check run where the kernel's files are not the node's): a problem line, and the check goes
    on (it ended in a traceback, found by running device-check.sh on a mock node)."""
    lib = FakeLibNvml([("h100-80gb", False), ("h100-80gb", True)])
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "nvidia.yaml").write_text(cdi_fixtures.device_plugin(lib.gpus[0].uuid))
    (tmp_path / "proc").mkdir()
    lines: list[str] = []
    with installed(lib):
        code = run_check(pynvml, [cdi], lines.append, host_root=tmp_path, dev=tmp_path / "dev",
                         proc=tmp_path / "proc", sysfs=tmp_path / "sys")
    text = "\n".join(lines)
    assert code == 1
    assert "PROBLEM: GPU 1 as a whole GPU: /proc/devices lists no nvidia character device" in text
    assert "== NVML calls made:" in text, "the check went on to its end"
