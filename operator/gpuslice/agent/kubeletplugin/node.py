"""The kubelet plugin as one piece of the node agent: its start-up order and shutdown.

Start-up order matters: the node is first made to match the checkpoints (what a
killed agent left half done is undone), and only then does the plugin register,
so the kubelet never calls into a half-recovered node.
"""

from __future__ import annotations

import structlog

from gpuslice.agent.events import node_ref, record_event
from gpuslice.agent.gpus import GpuBackend
from gpuslice.agent.health import HealthMonitor
from gpuslice.agent.kubeletplugin.cdi import CdiDirectory
from gpuslice.agent.kubeletplugin.health import health_stream
from gpuslice.agent.kubeletplugin.prepare import Preparer
from gpuslice.agent.kubeletplugin.recovery import recover
from gpuslice.agent.kubeletplugin.server import KubeletPlugin
from gpuslice.agent.kubeletplugin.settings import PluginSettings
from gpuslice.agent.mps.daemons import MpsDaemons
from gpuslice.agent.pool import NodePool
from gpuslice.agent.published import PublishedRecord
from gpuslice.dra.wire import device_gpu
from gpuslice.planning.devices import Device

log = structlog.get_logger(__name__)


def mig_gpus(record: PublishedRecord) -> set[str]:
    """GPUs whose last published devices were MIG devices (by UUID)."""
    last = record.load()
    devices = [Device.from_manifest(d) for d in (last.devices if last else [])]
    return {d.gpu_uuid for d in devices if d is not None and d.traits.instances}


def published_devices(record: PublishedRecord) -> list[tuple[str, str]]:
    """(device, GPU UUID) of every device last published."""
    last = record.load()
    return [(str(d["name"]), gpu) for d in (last.devices if last else []) if (gpu := device_gpu(d)) is not None]


class NodePlugin:
    """The kubelet plugin of ``pool``: its preparer and its gRPC server."""

    def __init__(self, pool: NodePool, preparer: Preparer, server: KubeletPlugin) -> None:
        self.pool, self.preparer, self.server = pool, preparer, server

    @classmethod
    async def start(cls, pool: NodePool, backend: GpuBackend, settings: PluginSettings,
                    health: HealthMonitor | None = None) -> NodePlugin:
        """Recover, then register. ``pool`` must be kept in the plugin's state directory
        (``PoolState.kept_in``): its checkpoints, record and MIG layouts are the plugin's too."""
        node, kube, record = pool.node, pool.kube, pool.state.record
        if record is None:
            raise ValueError("the kubelet plugin needs a pool kept in its state directory (PoolState.kept_in)")

        async def restarted(gpu: str, message: str) -> None:
            await record_event(kube, node, node_ref(node), "MpsDaemonRestarted", message)

        mps = MpsDaemons(node, backend, settings.resolved_mps_dir, settings.mps_shm_dir, on_restart=restarted)
        preparer = Preparer(pool, CdiDirectory(settings.cdi_dir), mps)
        await recover(preparer, mig_gpus(record))
        stream = health_stream(node, health, lambda: published_devices(record)) if health is not None else None
        server = KubeletPlugin(settings.paths, preparer, stream)
        await server.start()
        return cls(pool, preparer, server)

    async def stop(self) -> None:
        await self.server.stop()
