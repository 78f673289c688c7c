"""The kubelet plugin's gRPC servers (grpc.aio) on unix sockets.

The kubelet's plugin manager watches its ``plugins_registry`` directory: a socket
appears there, it calls ``GetInfo`` (type ``DRAPlugin``, the driver's name, the
service socket's absolute path, the services served), dials the service socket and
calls ``NotifyRegistrationStatus``. The service socket lives in the driver's own
directory under ``plugins/`` and serves ``DRAPlugin`` (v1) and, when the agent
reports health, ``DRAResourceHealth`` (v1, and v1alpha1 for the kubelets of 1.36).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import structlog

from gpuslice.agent.kubeletplugin.errors import PluginError
from gpuslice.agent.kubeletplugin.prepare import ClaimRef, Preparer
from gpuslice.agent.kubeletplugin.proto import dra_pb2, dra_pb2_grpc, drahealth_pb2, drahealth_pb2_grpc
from gpuslice.agent.kubeletplugin.proto import pluginregistration_pb2 as reg_pb2
from gpuslice.agent.kubeletplugin.proto import pluginregistration_pb2_grpc as reg_pb2_grpc
from gpuslice.agent.kubeletplugin.settings import PluginPaths
from gpuslice.agent.node_state.checkpoint import PreparedDevice
from gpuslice.dra.names import DRIVER
from gpuslice.kube.client import KubeError

log = structlog.get_logger(__name__)
DRA_SERVICE = "v1.DRAPlugin"
HEALTH_SERVICE = "v1.DRAResourceHealth"
# The kubelet of 1.36 asks for health on v1alpha1 only, whatever the plugin advertises
# (pkg/kubelet/cm/dra/plugin/dra_plugin.go at v1.36.3); its messages are v1's field for field
# (k8s.io/kubelet's dra-health v1alpha1 and v1 api.proto differ in their package alone). 1.37
# takes the first service the plugin advertises that it knows, v1, and keeps v1alpha1 until 1.40.
HEALTH_SERVICE_V1ALPHA1 = "v1alpha1.DRAResourceHealth"
HealthStream = Callable[[], AsyncIterator[drahealth_pb2.NodeWatchResourcesResponse]]


def _device(record: PreparedDevice) -> dra_pb2.Device:
    device = dra_pb2.Device(request_names=[record.request] if record.request else [], pool_name=record.pool,
                            device_name=record.device, cdi_device_ids=record.cdi_ids)
    if record.share_id:
        device.share_id = record.share_id
    return device


async def _answer(claim: ClaimRef, work: Callable[[], Awaitable[Any]], what: str) -> str:
    """Run ``work`` for one claim; the error text for the kubelet ("" on success)."""
    try:
        await work()
    except PluginError as error:
        log.warning(f"{what} refused", claim=str(claim), uid=claim.uid, error=str(error))
        return str(error)
    except KubeError as error:
        log.warning(f"{what}: API request failed", claim=str(claim), error=str(error))
        return f"claim {claim}: reading it from the API server failed ({error}); the kubelet retries."
    except Exception as error:  # a bug must fail one claim, not the agent
        log.exception(f"{what} failed unexpectedly", claim=str(claim), uid=claim.uid)
        return f"claim {claim}: internal error in the gpuslice agent ({type(error).__name__}: {error}); see its log."
    return ""


class _DraService(dra_pb2_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    async def NodePrepareResources(self, request: Any, context: Any) -> dra_pb2.NodePrepareResourcesResponse:
        async def one(claim: ClaimRef) -> tuple[str, dra_pb2.NodePrepareResourceResponse]:
            devices: list[PreparedDevice] = []

            async def work() -> None:
                devices.extend(await self.preparer.prepare(claim))

            error = await _answer(claim, work, "prepare")
            if error:
                return claim.uid, dra_pb2.NodePrepareResourceResponse(error=error)
            return claim.uid, dra_pb2.NodePrepareResourceResponse(devices=[_device(d) for d in devices])

        claims = [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]
        return dra_pb2.NodePrepareResourcesResponse(claims=dict(await asyncio.gather(*map(one, claims))))

    async def NodeUnprepareResources(self, request: Any, context: Any) -> dra_pb2.NodeUnprepareResourcesResponse:
        async def one(claim: ClaimRef) -> tuple[str, dra_pb2.NodeUnprepareResourceResponse]:
            error = await _answer(claim, lambda: self.preparer.unprepare(claim), "unprepare")
            return claim.uid, dra_pb2.NodeUnprepareResourceResponse(error=error)

        claims = [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]
        return dra_pb2.NodeUnprepareResourcesResponse(claims=dict(await asyncio.gather(*map(one, claims))))


class _HealthService(drahealth_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, stream: HealthStream) -> None:
        self.stream = stream

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for response in self.stream():
            yield response


def _add_health_v1alpha1(servicer: _HealthService, server: grpc.aio.Server) -> None:
    """The same stream under v1alpha1's name (not advertised: the kubelet that asks for it does not look)."""
    handler = grpc.unary_stream_rpc_method_handler(
        servicer.NodeWatchResources, request_deserializer=drahealth_pb2.NodeWatchResourcesRequest.FromString,
        response_serializer=drahealth_pb2.NodeWatchResourcesResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        HEALTH_SERVICE_V1ALPHA1, {"NodeWatchResources": handler}),))


class _Registration(reg_pb2_grpc.RegistrationServicer):
    def __init__(self, plugin: KubeletPlugin) -> None:
        self.plugin = plugin

    async def GetInfo(self, request: Any, context: Any) -> reg_pb2.PluginInfo:
        return reg_pb2.PluginInfo(type="DRAPlugin", name=DRIVER, endpoint=str(self.plugin.paths.service_socket),
                                  supported_versions=self.plugin.services)

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> reg_pb2.RegistrationStatusResponse:
        self.plugin.registered = bool(request.plugin_registered)
        if request.plugin_registered:
            log.info("registered with the kubelet", driver=DRIVER, endpoint=str(self.plugin.paths.service_socket))
        else:
            log.error("the kubelet refused the plugin's registration", driver=DRIVER, error=request.error)
        return reg_pb2.RegistrationStatusResponse()


class KubeletPlugin:
    """Both servers; :meth:`start` once the node is recovered, :meth:`stop` on the way out."""

    def __init__(self, paths: PluginPaths, preparer: Preparer, health: HealthStream | None = None) -> None:
        paths.check()
        self.paths, self.preparer, self.health = paths, preparer, health
        self.registered = False
        self._servers: list[grpc.aio.Server] = []

    @property
    def services(self) -> list[str]:
        return [DRA_SERVICE, HEALTH_SERVICE] if self.health is not None else [DRA_SERVICE]

    async def start(self) -> None:
        service = grpc.aio.server()
        dra_pb2_grpc.add_DRAPluginServicer_to_server(_DraService(self.preparer), service)  # type: ignore[no-untyped-call]
        if self.health is not None:
            drahealth_pb2_grpc.add_DRAResourceHealthServicer_to_server(_HealthService(self.health), service)  # type: ignore[no-untyped-call]
            _add_health_v1alpha1(_HealthService(self.health), service)
        await self._serve(service, self.paths.service_socket)
        # Registration last: once its socket appears, the kubelet dials the service.
        registration = grpc.aio.server()
        reg_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), registration)  # type: ignore[no-untyped-call]
        await self._serve(registration, self.paths.registration_socket)
        log.info("kubelet plugin serving", registration=str(self.paths.registration_socket),
                 service=str(self.paths.service_socket), services=self.services)

    async def _serve(self, server: grpc.aio.Server, socket: Path) -> None:
        _clear(socket)  # left by a process that was killed
        server.add_insecure_port(_address(socket))
        await server.start()
        self._servers.append(server)

    async def stop(self) -> None:
        """Unregister (the registration socket goes first), then stop serving."""
        _clear(self.paths.registration_socket)
        for server in reversed(self._servers):
            await server.stop(grace=1)
        self._servers.clear()
        _clear(self.paths.service_socket)


def _address(socket: Path) -> str:
    """"unix:<absolute path>": gRPC then takes all 107 bytes a sockaddr_un holds. In the
    "unix://<path>" form grpcio 1.85 refuses a path of 106 or 107 bytes ("Path name should not have
    more than 107 characters"), which a pytest temporary directory reached."""
    return f"unix:{socket.absolute()}"


def _clear(socket: Path) -> None:
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)
