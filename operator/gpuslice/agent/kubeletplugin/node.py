"""The kubelet plugin as one piece of the node agent: its settings, start-up order and shutdown.

Start-up order matters: the node is first made to match the checkpoints (what a
killed agent left half done is undone), and only then does the plugin register,
so the kubelet never calls into a half-recovered node.
"""

from __future__ import annotations

import asyncio

import structlog

from gpuslice.agent.events import node_ref, record_event
from gpuslice.agent.gpus import GpuBackend
from gpuslice.agent.health import HealthMonitor
from gpuslice.agent.kubeletplugin.cdi import CdiDirectory
from gpuslice.agent.kubeletplugin.checkpoint import Checkpoints, read_boot_id
from gpuslice.agent.kubeletplugin.gpuops import GpuOps
from gpuslice.agent.kubeletplugin.health import health_stream
from gpuslice.agent.kubeletplugin.prepare import Preparer
from gpuslice.agent.kubeletplugin.recovery import recover
from gpuslice.agent.kubeletplugin.server import KubeletPlugin
from gpuslice.agent.kubeletplugin.settings import PluginSettings
from gpuslice.agent.mig_manager import MigManager
from gpuslice.agent.mps.daemons import MpsDaemons
from gpuslice.agent.published import PublishedRecord
from gpuslice.inventory.gpus import Gpu
from gpuslice.kube.client import KubeClient
from gpuslice.planning.devices import Device
from gpuslice.planning.taints import device_gpu

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
    def __init__(self, preparer: Preparer, record: PublishedRecord, server: KubeletPlugin, mig: MigManager) -> None:
        self.preparer, self.record, self.server, self.mig = preparer, record, server, mig

    @property
    def pool_lock(self) -> asyncio.Lock:
        return self.preparer.pool_lock

    @classmethod
    async def start(cls, node: str, kube: KubeClient, backend: GpuBackend, gpus: list[Gpu],
                    settings: PluginSettings, health: HealthMonitor | None = None) -> NodePlugin:
        paths = settings.paths
        paths.check()
        state = settings.resolved_state_dir
        state.mkdir(parents=True, exist_ok=True)
        ops = GpuOps(backend, gpus)
        mig = MigManager(node, ops, state)

        async def restarted(gpu: str, message: str) -> None:
            await record_event(kube, node, node_ref(node), "MpsDaemonRestarted", message)

        mps = MpsDaemons(node, backend, settings.resolved_mps_dir, settings.mps_shm_dir, on_restart=restarted)
        preparer = Preparer(node, kube, ops, Checkpoints(state, read_boot_id(settings.boot_id_file)),
                            CdiDirectory(settings.cdi_dir), asyncio.Lock(), mps,
                            static_gpus=mig.static_gpus)
        record = PublishedRecord(state)
        await recover(preparer, mig_gpus(record))
        stream = health_stream(node, health, lambda: published_devices(record)) if health is not None else None
        server = KubeletPlugin(paths, preparer, stream)
        await server.start()
        return cls(preparer, record, server, mig)

    async def stop(self) -> None:
        await self.server.stop()
