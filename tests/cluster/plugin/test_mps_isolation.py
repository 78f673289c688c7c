"""What two tenants on one MPS GPU share, read from the mounts the kubelet's
own DRA code resolved for their containers (the pod runner), with the real scheduler.

An MPS client's pipe directory (read-write) holds its control daemon's socket, which takes `quit`,
`terminate_client` and `set_*` from anyone who can reach it, and its `/dev/shm` is shared with every
client of that daemon. Once the agent ran one daemon per GPU, so any tenant on an MPS GPU could stop
the others' MPS server and read or write their shared memory. Now each tenant namespace on a GPU has
its own daemon, pipe and shared-memory directories (NVIDIA's DRA driver has one per claim); the first
two tests are the review's repros, turned into regression tests; the third holds each daemon to its own
namespace's claims.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from gpuslice.kube.client import KubeClient
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.plugin.plugin_nodes import (
    PluginNode,
    PluginNodeFactory,
    gone,
    mps_mounts,
    process_alive,
    running,
    until,
)
from tests.cluster.pools import create_pods, published


def exists(path: str) -> bool:
    return Path(path).exists()


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


async def test_a_tenant_cannot_stop_its_neighbours_mps_daemon(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, namespaces: Any,
) -> None:
    node, other = await neighbours(kube, make_policy, plugin_node, namespace, namespaces)
    # What `echo quit | nvidia-cuda-mps-control` does inside the attacker's container, whose
    # /tmp/nvidia-mps is this host directory; each daemon writes its pid there.
    pipe = Path(mps_mounts(node, namespace, "attacker")["/tmp/nvidia-mps"])
    victims = Path(mps_mounts(node, other, "victim")["/tmp/nvidia-mps"])
    mine = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    pid = int((victims / "nvidia-cuda-mps-control.pid").read_text())
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(5.0)
        connection.connect(str(pipe / "control"))
        connection.sendall(b"quit")
        connection.shutdown(socket.SHUT_WR)
        print("the daemon answered", connection.recv(4096))
    await until(lambda: not process_alive(mine), within=10, what="the attacker's own daemon to quit")
    assert process_alive(pid), f"tenant {namespace} stopped the MPS daemon (pid {pid}) that tenant {other}'s pod uses"
    # The agent starts the attacker's daemon again (its claim still needs one); the victim's is untouched.
    [gpu] = {g for g, _ in node.mps_daemons()}
    await until(lambda: (node.mps_daemons().get((gpu, namespace)) or mine) != mine, within=30,
                what="the attacker's daemon to be started again")
    assert node.mps_daemons() == {(gpu, namespace): node.mps_daemons()[(gpu, namespace)], (gpu, other): pid}


async def test_each_tenants_daemon_lives_as_long_as_its_own_claims_on_the_gpu(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, namespaces: Any,
) -> None:
    """Two daemons on one GPU: the first tenant's last pod going stops its daemon and removes its pipe and
    shared memory; the neighbour's daemon and directories are untouched."""
    node, other = await neighbours(kube, make_policy, plugin_node, namespace, namespaces)
    daemons = node.mps_daemons()
    [gpu] = {g for g, _ in daemons}
    assert set(daemons) == {(gpu, namespace), (gpu, other)}, "a daemon for each tenant on the GPU"
    mine, theirs = mps_mounts(node, namespace, "attacker"), mps_mounts(node, other, "victim")

    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/attacker")
    await gone(kube, namespace, ["attacker"])
    await until(lambda: (gpu, namespace) not in node.mps_daemons(), what="the first tenant's daemon to be stopped")
    assert not process_alive(daemons[(gpu, namespace)])
    assert not exists(mine["/tmp/nvidia-mps"])
    assert not exists(mine["/dev/shm"])
    assert node.mps_daemons() == {(gpu, other): daemons[(gpu, other)]}, "the neighbour's daemon runs on"
    assert exists(theirs["/tmp/nvidia-mps"] + "/control")
    assert exists(theirs["/dev/shm"])
