"""Faults on purpose: restart, kill or stall one component of a running dev cluster.

Used by the faults tier; each keeps the component's command line (port, certificates,
etcd data), so what comes back is the same component, as after a crash on a real node.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator

from gpuslice.devcluster.errors import DevClusterError
from gpuslice.devcluster.process import Component


class FaultControls:
    """Mixed into DevCluster: needs its ``components`` and ``_write_record``."""

    components: list[Component]

    def _write_record(self) -> None:
        raise NotImplementedError

    def component(self, name: str) -> Component:
        """A running component by name: etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
        pod-runner-<node>, gpuslice-controller, gpuslice-agent-<node>."""
        for component in self.components:
            if component.name == name:
                return component
        raise DevClusterError(f"The dev cluster has no component {name!r}; it has"
                              f" {', '.join(c.name for c in self.components)}.")

    async def restart(self, name: str, *, crash: bool = False) -> None:
        """Restart one component with the same command line (port, certificates, etcd data): SIGTERM,
        or SIGKILL with ``crash``. Returns once it is healthy again."""
        await self.component(name).restart(crash=crash)
        self._write_record()  # `down` must find the new process

    @contextlib.asynccontextmanager
    async def down(self, name: str) -> AsyncIterator[None]:
        """The component is killed (SIGKILL) on entry and started again, healthy, on exit."""
        component = self.component(name)
        await component.kill()
        try:
            yield
        finally:
            await component.start()
            self._write_record()
            await component.wait_healthy()

    def pause(self, name: str) -> None:
        """SIGSTOP the component: it holds every connection open and answers nothing (a stall)."""
        self.component(name).send(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.component(name).send(signal.SIGCONT)

    @contextlib.asynccontextmanager
    async def paused(self, name: str) -> AsyncIterator[None]:
        self.pause(name)
        try:
            yield
        finally:
            self.resume(name)
