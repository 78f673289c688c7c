"""The kubelet's PodResources API, as the node agent reads it: which container of which pod holds
which gpuslice device of this node's pool.

``List`` (v1) returns the pods the kubelet runs (its active pods) with each container's DRA
claims and their devices (``DynamicResource``/``ClaimResource``: driver, pool, device, share id;
KEP-3695, GA and always on since Kubernetes 1.36). The socket is the kubelet's
(``/var/lib/kubelet/pod-resources/kubelet.sock``); reading it needs no credentials, only the
socket, which the agent's DaemonSet mounts. The kubelet rate-limits it (100 QPS, burst 10); the
agent asks once per usage pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from gpuslice.agent.kubeletplugin.proto import podresources_pb2, podresources_pb2_grpc
from gpuslice.dra.names import DRIVER
from gpuslice.errors import GpusliceError
from gpuslice.planning.node.gpu_use import PodRef


class PodResourcesError(GpusliceError):
    """The kubelet's PodResources API could not be read; the message says where and why."""


@dataclass(frozen=True)
class HeldDevice:
    """One device of this driver and pool that a container uses, as the kubelet says."""

    pod: PodRef
    container: str
    claim_namespace: str
    claim_name: str
    device: str
    share_id: str | None

    @property
    def claim(self) -> str:
        return f"{self.claim_namespace}/{self.claim_name}"


def held_devices(response: podresources_pb2.ListPodResourcesResponse, pool: str) -> list[HeldDevice]:
    """The devices of ``pool`` (this node's) of driver gpu.gpuslice.dev that containers hold."""
    found = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for claim in container.dynamic_resources:
                for resource in claim.claim_resources:
                    if resource.driver_name != DRIVER or resource.pool_name != pool:
                        continue
                    found.append(HeldDevice(
                        PodRef(pod.namespace, pod.name), container.name, claim.claim_namespace, claim.claim_name,
                        resource.device_name, resource.share_id if resource.HasField("share_id") else None))
    return found


class PodResources:
    def __init__(self, socket: Path, timeout: float = 10.0) -> None:
        self.socket, self.timeout = socket, timeout
        self._channel: grpc.aio.Channel | None = None

    async def list(self, pool: str) -> list[HeldDevice]:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self.socket}")
        stub = podresources_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        try:
            response = await stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.aio.AioRpcError as error:
            raise PodResourcesError(
                f"the kubelet's PodResources API at {self.socket} did not answer ({error.code().name}:"
                f" {error.details()}); mount the kubelet's pod-resources directory into the agent"
                " (--pod-resources-socket)") from error
        return held_devices(response, pool)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
