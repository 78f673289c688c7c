"""The agent's check that it shares the node's PID namespace (NVML numbers processes in the
caller's)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

from gpuslice.agent.usage.pidns import sees_node_pids
from gpuslice.kube.client import KubeClient


def test_the_same_proc_is_the_same_namespace() -> None:
    assert sees_node_pids(Path("/proc")) is True


def test_a_proc_whose_self_is_another_pid_is_another_namespace(tmp_path: Path) -> None:
    """As the node's /proc reads to an agent in a PID namespace of its own: its own PID there differs."""
    own, node = tmp_path / "own", tmp_path / "node"
    own.mkdir(), node.mkdir()
    (own / "self").symlink_to("1")
    (node / "self").symlink_to(str(os.getpid()))
    assert sees_node_pids(node, own) is False
    assert sees_node_pids(own, own) is True


def test_a_directory_that_is_no_proc_cannot_tell(tmp_path: Path) -> None:
    (tmp_path / "4103").mkdir()  # a dev-cluster node's process cgroups, written by its tests
    assert sees_node_pids(tmp_path) is None


async def test_an_agent_in_a_pid_namespace_of_its_own_says_so_on_the_node(tmp_path: Path) -> None:
    from gpuslice.agent.usage.collector import UsageCollector
    from gpuslice.agent.usage.podresources import PodResources

    events: list[dict[str, Any]] = []

    class Kube:
        async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            events.append(body)
            return body

    node = tmp_path / "node"
    node.mkdir()
    (node / "self").symlink_to("999999999")  # no PID of ours in this namespace

    def collector(host_proc: Path) -> UsageCollector:
        return UsageCollector("n1", cast(KubeClient, Kube()), cast(Any, None), [], PodResources(tmp_path / "sock"),
                              list, dict, host_proc)

    assert await collector(Path("/proc")).check_pid_namespace() is True
    assert await collector(tmp_path).check_pid_namespace() is None
    assert events == []
    assert await collector(node).check_pid_namespace() is False
    [event] = events
    assert (event["reason"], event["involvedObject"]["kind"]) == ("GpuProcessesNotVisible", "Node")
    assert "hostPID: true" in event["message"]
