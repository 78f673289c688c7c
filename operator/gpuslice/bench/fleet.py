"""Many node agents in one process: the harness mode that stands in for a fleet.

A thousand ``gpuslice agent`` processes do not fit on a 2-core machine, so each simulated
agent here runs the agent's own code (``AgentWatches`` and ``publish_loop``, with its own
drains, backoff and watch state) with its own API client, its own node-bound token and
its own connections: the requests a real agent makes. The only things the agents share
are this process's event loop and interpreter (and its metrics registry). One real agent
process is measured separately.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.agent.drain import RECHECK, Drains
from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.agent.node_state.gpuops import GpuOps
from gpuslice.agent.pool import NodePool
from gpuslice.agent.pool_state import PoolState
from gpuslice.agent.run import publish_loop
from gpuslice.agent.settings import AgentSettings
from gpuslice.agent.startup import AgentStopped, check_cluster
from gpuslice.agent.watches import AgentWatches
from gpuslice.backoff import Backoff
from gpuslice.kube.client import KubeClient


@dataclass
class Fleet:
    """Agents for ``nodes``, each with the kubeconfig of its node-bound identity."""

    kubeconfigs: dict[str, Path]
    resync: float = 60.0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    clients: list[KubeClient] = field(default_factory=list)
    watches: list[AgentWatches] = field(default_factory=list)

    async def start(self) -> None:
        """Every agent, or (when one cannot start: say, no file descriptor left) none: a fleet half
        started would go on running into the next figure."""
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        for node, kubeconfig in self.kubeconfigs.items():
            kube = await KubeClient.from_kubeconfig(kubeconfig)
            self.clients.append(kube)
            wake = asyncio.Event()
            wake.set()
            backend = FakeBackend(node, [("h100-80gb", 8)])
            ops = GpuOps(backend, backend.discover())
            watches = AgentWatches(kube, node, wake, self.stop)
            watches.start()
            self.watches.append(watches)
            self.tasks.append(asyncio.create_task(self._agent(kube, node, ops, wake, watches)))

    async def _agent(self, kube: KubeClient, node: str, ops: GpuOps, wake: asyncio.Event,
                     watches: AgentWatches) -> None:
        """What ``run_agent`` does after discovery, without the kubelet plugin: check the server, then publish."""
        try:
            verdict = await check_cluster(kube, node, self.stop)
        except AgentStopped as error:
            print(f"bench: agent {node} publishes nothing, as a real one would not: {error}", flush=True)
            return
        if verdict is not None:
            pool = NodePool(node, kube, ops, PoolState(drains=Drains(recheck=Backoff(RECHECK, self.resync)),
                                                      unsupported=verdict.unsupported_modes()))
            await publish_loop(AgentSettings(node=node, backend="fake", resync=self.resync), pool, wake, self.stop,
                               watches)

    async def close(self) -> None:
        self.stop.set()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for watches in self.watches:
            await watches.close()
        self.watches.clear()
        for kube in self.clients:
            await kube.close()
        self.tasks.clear()
        self.clients.clear()


async def start_fleet(kubeconfigs: dict[str, Path], resync: float = 60.0) -> Fleet:
    fleet = Fleet(kubeconfigs, resync)
    await fleet.start()
    return fleet


__all__: Sequence[str] = ("Fleet", "start_fleet")
