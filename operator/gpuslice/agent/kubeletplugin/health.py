"""The plugin's health stream (DRAResourceHealth v1): every device of the pool, with its GPU's health.

The kubelet keeps the last report in its DRA manager's health cache and puts the
health of each allocated device into the pod's ``allocatedResourcesStatus``. It
treats a device not reported for ``health_check_timeout_seconds`` as Unknown, so
the whole list goes out at every change and every ``REPORT_EVERY`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from gpuslice.agent.health import HealthMonitor
from gpuslice.agent.kubeletplugin.proto import drahealth_pb2

REPORT_EVERY = 10.0
TIMEOUT_SECONDS = 60


def report(node: str, devices: list[tuple[str, str]],
           monitor: HealthMonitor) -> drahealth_pb2.NodeWatchResourcesResponse:
    now = int(time.time())
    found = []
    for name, gpu in devices:
        health = monitor.state.get(gpu)
        found.append(drahealth_pb2.DeviceHealth(
            device=drahealth_pb2.DeviceIdentifier(pool_name=node, device_name=name),
            health=drahealth_pb2.HEALTHY if health is None else drahealth_pb2.UNHEALTHY,
            last_updated_time=now, health_check_timeout_seconds=TIMEOUT_SECONDS,
            message="" if health is None else f"GPU {gpu}: {health.message}"[:1024],
        ))
    return drahealth_pb2.NodeWatchResourcesResponse(devices=found)


def health_stream(node: str, monitor: HealthMonitor, devices: Callable[[], list[tuple[str, str]]],
                  ) -> Callable[[], AsyncIterator[drahealth_pb2.NodeWatchResourcesResponse]]:
    async def stream() -> AsyncIterator[drahealth_pb2.NodeWatchResourcesResponse]:
        while True:
            version = monitor.version
            yield report(node, devices(), monitor)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REPORT_EVERY):
                    await monitor.wait_for_change(version)

    return stream
