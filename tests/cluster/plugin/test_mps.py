"""MPS for memory and shared slices (slicing.isolation: MPS) on fake nodes, with the real scheduler and the
kubelet's own DRA code: one control daemon (the fake backend's stand-in, a real process) per GPU and tenant
namespace with MPS devices prepared, started before the first prepare, kept while a claim needs it, stopped after the last
unprepare, started again when it dies, adopted by a restarted agent, and never left behind by one killed
mid-prepare; and each container's CDI edits carry the daemon's directories and the limits of its claim."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from gpuslice.dra.quantity import quantity_bytes
from gpuslice.kube.client import KubeClient
from gpuslice.planning.devices import gpu_tag
from gpuslice.planning.node.mps import namespace_tag
from tests.cluster.kubeutil import pod_claim, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.plugin.plugin_nodes import (
    PluginNodeFactory,
    event_with,
    gone,
    killed_at,
    mps_mounts,
    one_gpu_with_pods,
    process_alive,
    running,
    until,
)
from tests.cluster.pools import create_pods, published, tenant_policy

GPU_BACKENDS = ("fake", "nvml")  # each test on the fake backend and on the mock NVML library

MIB = 1024**2
MPS_20G = {"mode": "memory", "sliceSize": "20G", "isolation": "MPS"}
H100 = 81559 * MIB  # NVML's total for an H100 80GB HBM3 (the fake backend's catalog)


async def result_of(kube: KubeClient, namespace: str, pod: str) -> dict[str, Any]:
    claim = await pod_claim(kube, namespace, pod)
    assert claim is not None
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return {"claim": claim, **result}


def gpu_of(devices: dict[str, dict[str, Any]], device: str) -> str:
    attributes = devices[device]["attributes"]
    return str((attributes.get("gpuslice.dev/parentUUID") or attributes["gpuslice.dev/uuid"])["string"])


async def test_one_daemon_per_gpu_and_namespace_with_each_containers_limits(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    node = await plugin_node("h100-80gb", 2)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10G", "isolation": "MPS"})
    devices = await published(kube, node.name, 16)
    assert {d["attributes"]["gpuslice.dev/isolation"]["string"] for d in devices.values()} == {"MPS"}
    assert node.mps_daemons() == {}, "no daemon before a claim needs one"

    await create_pods(kube, namespace, "gpu-slice", ["a", "b"])
    await running(kube, namespace, ["a", "b"])
    gpus = {pod: gpu_of(devices, (await result_of(kube, namespace, pod))["device"]) for pod in ("a", "b")}
    daemons = node.mps_daemons()
    assert set(daemons) == {(g, namespace) for g in gpus.values()}, "a daemon for each GPU a pod's slice is on"
    for pod, gpu in gpus.items():
        env = node.env(namespace, pod)
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={10**10 // MIB}M", "the slice, in MiB"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "12", "10G of 79.6 GiB, rounded up"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        assert env["GPUSLICE_ISOLATION"] == "MPS"
        home = node.root / "agent" / "mps" / gpu_tag(gpu) / namespace_tag(namespace)
        assert mps_mounts(node, namespace, pod) == {
            "/tmp/nvidia-mps": str(home / "pipe"), "/var/log/nvidia-mps": str(home / "log"),
            "/dev/shm": str(node.root / "mps-shm" / gpu_tag(gpu) / namespace_tag(namespace))}, "its daemon's"
        assert (home / "pipe" / "control").exists()

    # A daemon that dies is started again, and the Node says so.
    key, pid = sorted(daemons.items())[0]
    gpu = key[0]
    os.kill(pid, signal.SIGKILL)
    again = await until(lambda: (node.mps_daemons().get(key) or pid) != pid and node.mps_daemons()[key],
                        within=30, what="the killed daemon to be started again")
    assert process_alive(again)
    event = await event_with(kube, "default", node.name,
                             f"the MPS control daemon of namespace {namespace} on GPU {gpu} was started again")
    assert event["reason"] == "MpsDaemonRestarted"
    assert await node.metric("gpuslice_agent_mps_daemons", {"node": node.name}) == len(set(gpus.values()))

    # Stopped after the last unprepare of its GPU, kept while another claim on it remains.
    current = node.mps_daemons()
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/a")
    await gone(kube, namespace, ["a"])
    if gpus["a"] == gpus["b"]:
        assert node.mps_daemons() == current, "b still needs it"
    else:
        assert node.mps_daemons() == {(gpus["b"], namespace): current[(gpus["b"], namespace)]}, "a's GPU has none left"
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/b")
    await gone(kube, namespace, ["b"])
    await until(lambda: node.mps_daemons() == {}, what="every daemon to be stopped")
    assert all(not process_alive(p) for p in (*daemons.values(), again))
    logs = node.root / "agent" / "mps" / gpu_tag(gpu) / namespace_tag(namespace) / "log"
    if node.nvml:  # NVIDIA's daemon (Debian's 535), in the foreground, logs to its stdout
        assert "Cmd:quit" in (logs / "daemon.out").read_text()
    else:
        assert "Accepting command 'quit'" in (logs / "control.log").read_text()


async def test_shared_devices_limit_each_container_to_its_consumed_capacity(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    node = await plugin_node("h100-80gb", 1)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "shared", "sliceSize": "10Gi", "isolation": "MPS"})
    [device] = (await published(kube, node.name, 1)).values()
    await create_pods(kube, namespace, "gpu-slice", ["s1", "s2"])
    await running(kube, namespace, ["s1", "s2"])
    assert list(node.mps_daemons()) == [(device["attributes"]["gpuslice.dev/uuid"]["string"], namespace)], "one, shared"
    for pod in ("s1", "s2"):
        consumed = quantity_bytes((await result_of(kube, namespace, pod))["consumedCapacity"]["memory"])
        env = node.env(namespace, pod)
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={consumed // MIB}M"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(-(-100 * consumed // H100))


async def test_policies_without_isolation_get_no_daemon_and_no_mps(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    node, _ = await one_gpu_with_pods(kube, make_policy, plugin_node, namespace, {"mode": "memory", "sliceSize": "20G"},
                                      4, ["plain"])
    env = node.env(namespace, "plain")
    assert not [k for k in env if k.startswith("CUDA_MPS")]
    assert "GPUSLICE_ISOLATION" not in env
    assert mps_mounts(node, namespace, "plain") == {}
    assert node.mps_daemons() == {}


async def test_a_killed_agent_leaves_the_daemon_to_its_clients_and_the_next_one_adopts_it(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    node, _ = await one_gpu_with_pods(kube, make_policy, plugin_node, namespace, MPS_20G, 4, ["keep"])
    [(key, pid)] = node.mps_daemons().items()

    await node.kill_agent()
    assert process_alive(pid), "the daemon outlives a killed agent: its clients keep their server"
    await node.start_agent()
    await until(lambda: "MPS control daemon adopted" in node.agent_log, what="the daemon to be adopted")
    assert node.mps_daemons() == {key: pid}, "adopted, not restarted under the running pod"

    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/keep")
    await gone(kube, namespace, ["keep"])
    await until(lambda: not process_alive(pid), what="the adopted daemon to be stopped after the last unprepare")


@pytest.mark.parametrize("point", ["prepare-started", "prepare-mps-started"])
async def test_killed_mid_prepare_the_agent_recovers_with_no_orphan_daemon(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, point: str,
) -> None:
    node, _ = await one_gpu_with_pods(kube, make_policy, plugin_node, namespace, MPS_20G, 4, [])
    await node.agent.stop()
    await node.start_agent(kill_at=point)
    await create_pods(kube, namespace, "gpu-slice", ["w"])
    await killed_at(node, point)
    [checkpoint] = node.checkpoints()
    assert checkpoint["phase"] == "started"
    orphan = node.mps_daemons()
    assert len(orphan) == (1 if point == "prepare-mps-started" else 0)

    # The restarted agent undoes the unfinished prepare before it registers; no claim then needs the
    # daemon started with it, so it is stopped (not adopted), and the kubelet's retry starts a fresh one.
    await node.start_agent()
    await running(kube, namespace, ["w"], within=90)
    assert "recovered from an unclean stop" in node.agent_log
    for pid in orphan.values():
        assert not process_alive(pid), "the daemon of the undone prepare was stopped"
    [pid] = node.mps_daemons().values()
    assert pid not in orphan.values()
    [checkpoint] = node.checkpoints()
    assert (checkpoint["phase"], checkpoint["devices"][0]["mps"]) == ("completed", True)
    assert node.env(namespace, "w")["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={20 * 10**9 // MIB}M"
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/w")
    await gone(kube, namespace, ["w"])
    try:
        await until(lambda: node.mps_daemons() == {}, what="the daemon to be stopped")
    except AssertionError as error:  # what the agent did, so that a failure in CI can be explained
        said = [line[:300] for line in node.agent_log.splitlines() if "unprepare" in line or "MPS" in line]
        raise AssertionError(f"{error}; the agent said: {said[-12:]}") from None
    assert not process_alive(pid)


async def test_a_claim_with_mps_devices_on_two_gpus_is_refused_with_the_fix(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    node = await plugin_node("h100-80gb", 2)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "40G", "isolation": "MPS"})
    devices = await published(kube, node.name, 4)
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "two"},
             "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                 "deviceClassName": f"{next(iter(devices.values()))['attributes']['gpuslice.dev/policy']['string']}"
                                    ".gpuslice.dev", "count": 4}}]}}}
    await kube.create(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims", claim)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "two"}, "spec": {
        "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpus"}]}}],
        "resourceClaims": [{"name": "gpus", "resourceClaimName": "two"}]}}
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    event = await event_with(kube, namespace, "two", "may hold devices of one GPU only", within=60)
    assert "matchAttribute constraint on gpu.gpuslice.dev/parentUUID" in event["message"]
    assert node.mps_daemons() == {}
    assert node.checkpoints() == [], "refused before anything was made"
    assert node.cdi_specs() == []


async def test_turning_isolation_off_under_a_running_pod_holds_its_device_and_daemon(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    """A GPU with MPS devices allocated is never reconfigured under them: the claim's device stays as it
    was published (MPS), held with the pending-change taint, and its daemon runs until it is released."""
    node, policy = await one_gpu_with_pods(kube, make_policy, plugin_node, namespace, MPS_20G, 4, ["kept"])
    held = (await result_of(kube, namespace, "kept"))["device"]
    [(key, pid)] = node.mps_daemons().items()

    await kube.merge_patch(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{policy}",
                           {"spec": {"slicing": {"isolation": "None"}}})

    async def changed() -> dict[str, dict[str, Any]] | None:
        devices = await published(kube, node.name, 4)
        return devices if all("gpuslice.dev/isolation" not in d["attributes"] for n, d in devices.items()
                              if n != held) else None

    devices = await wait_for(changed, what="the free devices to be published without MPS")
    kept = devices[held]
    assert kept["attributes"]["gpuslice.dev/isolation"] == {"string": "MPS"}, "the held device is as it was"
    assert any(t["key"] == "gpuslice.dev/pending-change" for t in kept.get("taints") or [])
    assert node.mps_daemons() == {key: pid}, "its daemon runs on under the pod"

    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/kept")
    await gone(kube, namespace, ["kept"])
    await until(lambda: node.mps_daemons() == {}, what="the daemon to be stopped")
    await wait_for(lambda: all_plain(kube, node.name), what="the released device to lose MPS too")


async def all_plain(kube: KubeClient, node: str) -> bool:
    devices = await published(kube, node, 4)
    return all("gpuslice.dev/isolation" not in d["attributes"] for d in devices.values())
