"""`make demo` as a user runs it: tenant pods of two modes reach Running on their slices, the demo
prints what each container received, the occupancy map shows them, and nothing is left running
afterwards."""

from __future__ import annotations

from pathlib import Path

from tests.cluster.devcluster.processes import gpuslice, processes_using


def test_the_demo_runs_tenant_pods_of_two_modes_on_their_slices(tmp_path: Path) -> None:
    state_dir = tmp_path / "demo"
    done = gpuslice("demo", "--state-dir", str(state_dir), timeout=420)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Tenant pods: Running" in out, out
    rows = [line for line in out.splitlines() if "/inference-" in line or "/notebook-" in line]
    assert sum(" memory " in row for row in rows) == 3, out
    assert sum(" shared " in row for row in rows) == 2, out
    assert "GPUSLICE_MODE=memory" in out, out
    assert "GPUSLICE_GPU_UUID=GPU-" in out, out
    assert "denied request" in out, out
    # It ends with `gpuslice status`: the memory pods hold their slices on the map.
    assert "GPU occupancy" in out, out
    assert "held by team-a/inference-" in out, out
    assert processes_using(state_dir) == []
