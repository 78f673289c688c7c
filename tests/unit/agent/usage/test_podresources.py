"""The kubelet's PodResources answer, read as the agent reads it: this driver's devices of this node's
pool, per container, with the share id only where the kubelet set one."""

from __future__ import annotations

from gpuslice.agent.kubeletplugin.proto import podresources_pb2 as pb
from gpuslice.agent.usage.podresources import held_devices
from gpuslice.planning.node.gpu_use import PodRef


def test_only_this_drivers_devices_of_this_pool_per_container() -> None:
    ours = pb.ClaimResource(driver_name="gpu.gpuslice.dev", pool_name="n1", device_name="gpu-1-p-shared",
                            share_id="a1b2", cdi_devices=[pb.CDIDevice(name="gpuslice.dev/gpu=uid-gpu-1-p-shared")])
    slice_ = pb.ClaimResource(driver_name="gpu.gpuslice.dev", pool_name="n1", device_name="gpu-1-q-10g-0")
    elsewhere = pb.ClaimResource(driver_name="gpu.gpuslice.dev", pool_name="n2", device_name="gpu-9-q-10g-0")
    nvidia = pb.ClaimResource(driver_name="gpu.nvidia.com", pool_name="n1", device_name="gpu-0")
    answer = pb.ListPodResourcesResponse(pod_resources=[
        pb.PodResources(name="web", namespace="team-a", containers=[
            pb.ContainerResources(name="app", dynamic_resources=[
                pb.DynamicResource(claim_name="web-gpu", claim_namespace="team-a",
                                   claim_resources=[ours, slice_, elsewhere, nvidia])]),
            pb.ContainerResources(name="sidecar")]),
        pb.PodResources(name="plain", namespace="team-b", containers=[pb.ContainerResources(name="c")])])
    found = held_devices(answer, "n1")
    assert [(d.pod, d.container, d.claim, d.device, d.share_id) for d in found] == [
        (PodRef("team-a", "web"), "app", "team-a/web-gpu", "gpu-1-p-shared", "a1b2"),
        (PodRef("team-a", "web"), "app", "team-a/web-gpu", "gpu-1-q-10g-0", None)]
