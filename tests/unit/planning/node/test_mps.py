"""What an MPS client container is given: its GPU daemon's directories and its limits."""

from __future__ import annotations

from pathlib import Path

from gpuslice.planning.node.mps import DaemonDirs, client_edits, pinned_limit, thread_percentage

GI, MI = 1024**3, 1024**2
H100 = 81559 * MI


def test_the_pinned_limit_is_the_allocation_in_mib_on_device_zero() -> None:
    assert pinned_limit(10 * GI) == "0=10240M"
    assert pinned_limit(10**10) == "0=9536M", "10G is 9536.7 MiB: rounded down, never above the slice"
    assert pinned_limit(1) == "0=1M"


def test_the_thread_share_follows_the_memory_share_rounded_up() -> None:
    assert thread_percentage(10**10, H100) == 12, "10G of 79.6 GiB is 11.7%"
    assert thread_percentage(H100, H100) == 100
    assert thread_percentage(256 * MI, H100) == 1
    assert thread_percentage(H100 // 2, H100) == 50
    assert thread_percentage(GI, 0) == 100


def test_client_edits_mount_the_daemons_directories_where_cuda_looks() -> None:
    dirs = DaemonDirs(Path("/var/lib/kubelet/plugins/gpu.gpuslice.dev/mps/GPU-1/pipe"),
                      Path("/var/lib/kubelet/plugins/gpu.gpuslice.dev/mps/GPU-1/log"), Path("/dev/shm/gpuslice-mps/GPU-1"))
    edits = client_edits(dirs, 10 * GI, H100).manifest()
    assert edits["env"] == ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=13", "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps",
                            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]
    assert [(m["hostPath"], m["containerPath"], m["options"][0]) for m in edits["mounts"]] == [
        (str(dirs.pipe), "/tmp/nvidia-mps", "rw"), (str(dirs.log), "/var/log/nvidia-mps", "ro"),
        (str(dirs.shm), "/dev/shm", "rw")]
    assert all("bind" in m["options"] and "nosuid" in m["options"] for m in edits["mounts"])
