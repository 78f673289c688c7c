"""Hostile review 2 (MPS): what two tenants on one MPS GPU share, read from the mounts the kubelet's
own DRA code resolved for their containers (the pod runner), with the real scheduler.

The README's isolation table says of `isolation: MPS` that "another tenant's memory is readable: no".
That is true of GPU memory (each Volta+ client has its own address space), but the agent mounts one
host directory per GPU over every MPS container's `/dev/shm` and one pipe directory (read-write, with
the control daemon's socket) into every MPS container of that GPU, whatever its namespace. Tenants
who follow docs/nvidia.md ("run an MPS policy's containers as one UID") then share POSIX shared
memory (a framework's shm tensors, the MPS server's own segments) and any of them can send the
control daemon `quit` or `terminate_client`: one tenant's host shared memory is readable and
writable by another, and one tenant can stop the others' MPS server. NVIDIA's DRA driver runs a
daemon (and so a /dev/shm) per claim, never across namespaces.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from gpuslice.kube.client import KubeClient
from tests.cluster.agent.test_publishing import create_pods, published
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.plugin.conftest import PluginNode, PluginNodeFactory, process_alive, running, until
from tests.cluster.plugin.test_mps import mps_mounts


async def neighbours(kube: KubeClient, make_policy: PolicyFactory, plugin_node: PluginNodeFactory, namespace: str,
                     namespaces: Any) -> tuple[PluginNode, str]:
    """One H100 with 10G MPS slices and a running pod of each of two tenants on it: (node, the victim's
    namespace). The attacker's pod is ``attacker`` in ``namespace``."""
    node = await plugin_node("h100-80gb", 1)
    other: str = await namespaces("victim")
    await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                       "slicing": {"mode": "memory", "sliceSize": "10G", "isolation": "MPS"},
                       "tenants": [{"namespace": namespace}, {"namespace": other}], "claimTemplateName": "gpu-slice"})
    await published(kube, node.name, 8)
    await create_pods(kube, namespace, "gpu-slice", ["attacker"])
    await create_pods(kube, other, "gpu-slice", ["victim"])
    await running(kube, namespace, ["attacker"])
    await running(kube, other, ["victim"])
    return node, other


@pytest.mark.xfail(strict=True, reason=(
    "hostile2 M1: every MPS container of a GPU, of any tenant, gets the same host /dev/shm and the same"
    " read-write pipe directory; a fix needs a daemon (and shm) per tenant or per claim, as NVIDIA's DRA"
    " driver has. Until then the README's isolation table must say so"))
async def test_two_tenants_on_one_mps_gpu_share_no_host_shared_memory_or_control_pipe(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, namespaces: Any,
) -> None:
    node, other = await neighbours(kube, make_policy, plugin_node, namespace, namespaces)
    mine, theirs = mps_mounts(node, namespace, "attacker"), mps_mounts(node, other, "victim")
    print("attacker mounts", mine)
    print("victim mounts", theirs)
    assert mine, "the attacker is an MPS container"
    assert theirs, "the victim is an MPS container"
    assert mine["/dev/shm"] != theirs["/dev/shm"], (
        f"tenants {namespace} and {other} get the same host directory as /dev/shm: {mine['/dev/shm']}")
    assert mine["/tmp/nvidia-mps"] != theirs["/tmp/nvidia-mps"], (
        f"tenants {namespace} and {other} get the same MPS control pipe directory: {mine['/tmp/nvidia-mps']}")


@pytest.mark.xfail(strict=True, reason=(
    "hostile2 M2: the pipe directory every MPS container of a GPU gets read-write holds the control"
    " daemon's socket, so any tenant on the GPU can send it quit (or terminate_client) and stop the"
    " neighbours' MPS server; a fix needs a daemon per tenant or per claim"))
async def test_a_tenant_cannot_stop_its_neighbours_mps_daemon(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, namespaces: Any,
) -> None:
    node, other = await neighbours(kube, make_policy, plugin_node, namespace, namespaces)
    [pid] = node.mps_daemons().values()
    # What `echo quit | nvidia-cuda-mps-control` does inside the attacker's container, whose
    # /tmp/nvidia-mps is this host directory (the victim's is the same one).
    pipe = Path(mps_mounts(node, namespace, "attacker")["/tmp/nvidia-mps"])
    assert Path(mps_mounts(node, other, "victim")["/tmp/nvidia-mps"]) == pipe
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(5.0)
        connection.connect(str(pipe / "control"))
        connection.sendall(b"quit")
        connection.shutdown(socket.SHUT_WR)
        print("the daemon answered", connection.recv(4096))
    try:
        await until(lambda: not process_alive(pid), within=10, what="the daemon to quit")
    except AssertionError:
        return  # held: the daemon ignored the neighbour
    raise AssertionError(f"tenant {namespace} stopped the MPS daemon (pid {pid}) that tenant {other}'s pod uses")
