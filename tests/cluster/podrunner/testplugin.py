"""A minimal DRA kubelet plugin, for tests only: it registers through the kubelet's plugin
registration protocol, answers NodePrepareResources with a CDI device whose spec injects
environment variables naming the claim and device, and records what it was asked.

It speaks the same generated code as gpuslice's own plugin (gpuslice.agent.kubeletplugin.proto).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc

from gpuslice.agent.kubeletplugin.proto import dra_pb2, dra_pb2_grpc
from gpuslice.agent.kubeletplugin.proto import pluginregistration_pb2 as reg_pb2
from gpuslice.agent.kubeletplugin.proto import pluginregistration_pb2_grpc as reg_pb2_grpc
from gpuslice.dra.names import short_hash
from gpuslice.kube.client import KubeClient


class DraTestPlugin:
    __test__ = False  # not a test class

    """Serve the Registration and DRAPlugin services for ``driver`` on a fake node."""

    def __init__(self, driver: str, node_root: Path, kube: KubeClient, cdi_kind: str = "test.gpuslice.dev/gpu",
                 broken_cdi: bool = False, hang: bool = False) -> None:
        self.driver, self.root, self.kube, self.cdi_kind = driver, node_root, kube, cdi_kind
        self.broken_cdi = broken_cdi  # write a CDI spec that does not parse, as a buggy driver might
        self.hang = hang  # accept NodePrepareResources and never answer, as a wedged driver might
        self.hung: list[str] = []
        self.prepared: list[str] = []
        self.unprepared: list[str] = []
        self.registration: list[bool] = []
        self._servers: list[grpc.aio.Server] = []

    # Unix socket paths are limited to 107 bytes: short names under the node's directories.
    @property
    def registration_socket(self) -> Path:
        return self.root / "plugins_registry" / f"{short_hash(self.driver)}-reg.sock"

    @property
    def endpoint(self) -> Path:
        return self.root / "plugins" / f"{short_hash(self.driver)}.sock"

    async def start(self) -> None:
        self.endpoint.parent.mkdir(parents=True, exist_ok=True)
        dra_server = grpc.aio.server()
        dra_pb2_grpc.add_DRAPluginServicer_to_server(_DRA(self), dra_server)
        dra_server.add_insecure_port(f"unix:{self.endpoint.absolute()}")
        await dra_server.start()
        reg_server = grpc.aio.server()
        reg_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), reg_server)
        reg_server.add_insecure_port(f"unix:{self.registration_socket.absolute()}")
        await reg_server.start()
        self._servers = [dra_server, reg_server]

    async def stop(self) -> None:
        for server in self._servers:
            await server.stop(grace=0)
        self.registration_socket.unlink(missing_ok=True)
        self.endpoint.unlink(missing_ok=True)
        # A spec left behind (the broken one, or one whose pod was force-deleted unprepared) would make
        # the runner's CDI registry fail every later pod on this node.
        for spec in (self.root / "cdi").glob(f"{self.driver}-*.json"):
            spec.unlink(missing_ok=True)

    async def prepare(self, claim: Any) -> Any:
        body = await self.kube.get(f"/apis/resource.k8s.io/v1/namespaces/{claim.namespace}/resourceclaims/{claim.name}")
        results = [r for r in body["status"]["allocation"]["devices"]["results"] if r["driver"] == self.driver]
        devices, spec_devices = [], []
        for result in results:
            name = f"{claim.uid}-{result['device']}"
            spec_devices.append({"name": name, "containerEdits": {"env": [
                f"GPUSLICE_TEST_DEVICE={result['device']}", f"GPUSLICE_TEST_CLAIM={claim.namespace}/{claim.name}"]}})
            devices.append(dra_pb2.Device(request_names=[result["request"]], pool_name=result["pool"],
                                          device_name=result["device"], cdi_device_ids=[f"{self.cdi_kind}={name}"]))
        spec = {"cdiVersion": "0.6.0", "kind": self.cdi_kind, "devices": spec_devices}
        text = '{"cdiVersion": "0.6.0", "kind": ' if self.broken_cdi else json.dumps(spec)
        (self.root / "cdi" / f"{self.driver}-{claim.uid}.json").write_text(text)
        self.prepared.append(claim.uid)
        return dra_pb2.NodePrepareResourceResponse(devices=devices)


class _DRA(dra_pb2_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, plugin: DraTestPlugin) -> None:
        self.plugin = plugin

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        if self.plugin.hang:
            self.plugin.hung.extend(claim.uid for claim in request.claims)
            await asyncio.Event().wait()  # until the caller gives up or the server stops
        claims = {claim.uid: await self.plugin.prepare(claim) for claim in request.claims}
        return dra_pb2.NodePrepareResourcesResponse(claims=claims)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        for claim in request.claims:
            (self.plugin.root / "cdi" / f"{self.plugin.driver}-{claim.uid}.json").unlink(missing_ok=True)
            self.plugin.unprepared.append(claim.uid)
        return dra_pb2.NodeUnprepareResourcesResponse(
            claims={c.uid: dra_pb2.NodeUnprepareResourceResponse() for c in request.claims})


class _Registration(reg_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, plugin: DraTestPlugin) -> None:
        self.plugin = plugin

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb2.PluginInfo(type="DRAPlugin", name=self.plugin.driver, endpoint=str(self.plugin.endpoint),
                                  supported_versions=["v1.DRAPlugin"])

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.plugin.registration.append(request.plugin_registered)
        return reg_pb2.RegistrationStatusResponse()
