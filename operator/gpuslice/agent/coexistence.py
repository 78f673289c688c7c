"""Saying so when another DRA driver publishes this node's GPUs, or a device plugin advertises them (the
refusal itself is the publisher's: ``planning.node.coexistence.taken_gpus``,
``planning.node.device_plugins``): a Warning Event on the Node when a GPU is taken, a Normal one when it
is free again, a metric per GPU, and the log."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import structlog
from prometheus_client import Gauge

from gpuslice.agent.events import node_ref, record_event
from gpuslice.inventory.gpus import Gpu
from gpuslice.kube.client import KubeClient

log = structlog.get_logger(__name__)
DEVICE_PLUGIN_DRIVER = "device-plugin"  # the metric's driver label for a device plugin's GPUs
TAKEN = Gauge("gpuslice_agent_gpus_of_another_driver",
              "1 for each GPU another DRA driver publishes on this node (gpuslice publishes none of its devices).",
              ["node", "gpu", "driver"])


class OtherDrivers:
    """The GPUs other drivers held at the last cycle, so that only changes are told."""

    def __init__(self) -> None:
        self.taken: dict[str, tuple[str, str]] = {}

    async def report(self, kube: KubeClient | None, node: str, gpus: Sequence[Gpu],
                     taken: Mapping[str, tuple[str, str]]) -> None:
        by_uuid = {g.uuid: g for g in gpus}
        for uuid, (driver, how) in sorted(taken.items()):
            if self.taken.get(uuid) == (driver, how):
                continue
            gpu = by_uuid.get(uuid)
            where = f"GPU {gpu.index} ({uuid}, {gpu.pci_bus_id})" if gpu else f"GPU {uuid}"
            if driver == DEVICE_PLUGIN_DRIVER:
                message = (f"{where} is on a node whose allocatable advertises a device plugin's NVIDIA resources"
                           f" ({how}), which name no GPU: so gpuslice publishes none of its devices, as the plugin"
                           " could give it to a pod too. Its devices already allocated stay until their claims are"
                           " released. Turn the device plugin off on this node (the GPU Operator's: label it"
                           " nvidia.com/gpu.deploy.device-plugin=false; docs/nvidia.md#sharing-a-cluster).")
                reason = "GpuAdvertisedByDevicePlugin"
            else:
                message = (f"{where} is published by DRA driver {driver} too (same {how}), so gpuslice publishes none"
                           " of its devices: a GPU two drivers publish could be allocated twice. Its devices already"
                           " allocated stay until their claims are released. Turn one driver off on this node"
                           " (docs/nvidia.md#sharing-a-cluster).")
                reason = "GpuPublishedByAnotherDriver"
            log.warning("GPU of another driver or a device plugin; gpuslice leaves it out", node=node, gpu=uuid,
                        driver=driver, same=how)
            TAKEN.labels(node=node, gpu=uuid, driver=driver).set(1)
            await record_event(kube, node, node_ref(node), reason, message)
        for uuid, (driver, _) in sorted(self.taken.items()):
            if uuid in taken:
                if taken[uuid][0] != driver:
                    with contextlib.suppress(KeyError):
                        TAKEN.remove(node, uuid, driver)
                continue
            with contextlib.suppress(KeyError):
                TAKEN.remove(node, uuid, driver)
            log.info("GPU no longer published by another DRA driver; gpuslice publishes it again", node=node,
                     gpu=uuid, driver=driver)
            what = "advertised by a device plugin" if driver == DEVICE_PLUGIN_DRIVER else \
                f"published by DRA driver {driver}"
            await record_event(kube, node, node_ref(node), "GpuFreeOfAnotherDriver",
                               f"GPU {uuid} is no longer {what}; gpuslice publishes it again.", "Normal")
        self.taken = dict(taken)
