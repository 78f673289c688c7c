"""Device health reaches the kubelet of each supported minor: 1.37's asks on v1.DRAResourceHealth,
which the plugin advertises; 1.36's asks on v1alpha1.DRAResourceHealth only, without looking at what
the plugin advertises (its pkg/kubelet/cm/dra/plugin/dra_plugin.go), so the plugin serves the same
stream under both names."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import grpc

from gpuslice.agent.kubeletplugin.prepare import Preparer
from gpuslice.agent.kubeletplugin.proto import drahealth_pb2
from gpuslice.agent.kubeletplugin.server import DRA_SERVICE, HEALTH_SERVICE, KubeletPlugin
from gpuslice.agent.kubeletplugin.settings import PluginPaths


async def _health() -> AsyncIterator[drahealth_pb2.NodeWatchResourcesResponse]:
    device = drahealth_pb2.DeviceHealth(
        device=drahealth_pb2.DeviceIdentifier(pool_name="node-a", device_name="gpu-0-10g-0"),
        health=drahealth_pb2.HealthStatus.Value("UNHEALTHY"), last_updated_time=1, message="XID 79")
    yield drahealth_pb2.NodeWatchResourcesResponse(devices=[device])


async def test_health_streams_on_v1_for_137_and_on_v1alpha1_for_136() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as place:
        paths = PluginPaths(Path(place) / "registry", Path(place) / "plugins")
        plugin = KubeletPlugin(paths, cast(Preparer, object()), health=_health)
        await plugin.start()
        try:
            assert plugin.services == [DRA_SERVICE, HEALTH_SERVICE], "v1alpha1 is served, not advertised"
            async with grpc.aio.insecure_channel(f"unix:{paths.service_socket}") as channel:
                for service in ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"):
                    watch = channel.unary_stream(
                        f"/{service}/NodeWatchResources",
                        request_serializer=drahealth_pb2.NodeWatchResourcesRequest.SerializeToString,
                        response_deserializer=drahealth_pb2.NodeWatchResourcesResponse.FromString)
                    answers = [answer async for answer in watch(drahealth_pb2.NodeWatchResourcesRequest())]
                    [device] = answers[0].devices
                    assert (device.device.device_name, device.health, device.message) == (
                        "gpu-0-10g-0", drahealth_pb2.HealthStatus.Value("UNHEALTHY"), "XID 79"), service
        finally:
            await plugin.stop()
