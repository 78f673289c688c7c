"""Many node agents in one process: the harness mode that stands in for a fleet.

A thousand ``gpuslice agent`` processes do not fit on a 2-core machine, so each simulated
agent here is an agent's own loop (``publish_loop``, with its own drains and backoff)
with its own API client, its own node-bound token, and its own watches, exactly the
requests a real agent makes; the only thing the agents share is this process (its
event loop and interpreter). One real agent process is measured separately.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.agent.run import publish_loop
from gpuslice.dra.names import DRIVER
from gpuslice.kube.client import KubeClient
from gpuslice.kube.watch import watch

POLICIES = "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"


def agent_watches(kube: KubeClient, node: str, wake: asyncio.Event, stop: asyncio.Event) -> list[asyncio.Task[None]]:
    """The watches of ``gpuslice agent`` (agent/run.py's Kopf handlers): policies, Nodes,
    ResourceSlices and ResourceClaims, each cluster-wide, filtered here."""
    in_pool: set[tuple[str, str]] = set()

    def any_event(_: str | None, __: dict[str, Any]) -> None:
        wake.set()

    def node_event(_: str | None, body: dict[str, Any]) -> None:
        if body["metadata"]["name"] == node:
            wake.set()

    def slice_event(_: str | None, body: dict[str, Any]) -> None:
        spec = body.get("spec") or {}
        if spec.get("nodeName") == node and spec.get("driver") == DRIVER:
            wake.set()

    def claim_event(kind: str | None, body: dict[str, Any]) -> None:
        key = (body["metadata"].get("namespace") or "", body["metadata"]["name"])
        results = (((body.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        ours = kind != "DELETED" and any(r.get("driver") == DRIVER and r.get("pool") == node for r in results)
        if ours or key in in_pool:
            wake.set()
        if ours:
            in_pool.add(key)
        else:
            in_pool.discard(key)

    return [asyncio.create_task(watch(kube, path, handler, stop)) for path, handler in (
        (POLICIES, any_event), ("/api/v1/nodes", node_event),
        ("/apis/resource.k8s.io/v1/resourceslices", slice_event),
        ("/apis/resource.k8s.io/v1/resourceclaims", claim_event))]


@dataclass
class Fleet:
    """Agents for ``nodes``, each with the kubeconfig of its node-bound identity."""

    kubeconfigs: dict[str, Path]
    resync: float = 60.0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    clients: list[KubeClient] = field(default_factory=list)

    async def start(self) -> None:
        for node, kubeconfig in self.kubeconfigs.items():
            kube = await KubeClient.from_kubeconfig(kubeconfig)
            self.clients.append(kube)
            wake = asyncio.Event()
            wake.set()
            gpus = FakeBackend(node, [("h100-80gb", 8)]).discover()
            self.tasks += agent_watches(kube, node, wake, self.stop)
            self.tasks.append(asyncio.create_task(publish_loop(kube, node, gpus, wake, self.stop, self.resync)))

    async def close(self) -> None:
        self.stop.set()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for kube in self.clients:
            await kube.close()
        self.tasks.clear()
        self.clients.clear()


async def start_fleet(kubeconfigs: dict[str, Path], resync: float = 60.0) -> Fleet:
    fleet = Fleet(kubeconfigs, resync)
    await fleet.start()
    return fleet


__all__: Sequence[str] = ("Fleet", "agent_watches", "start_fleet")
