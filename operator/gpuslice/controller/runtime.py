"""What one run of Kopf shares among the controller's handlers: its memo.

Kopf hands every handler a ``memo``: the object given to ``kopf.operator(memo=...)``, shallow-copied
once per watched object, so what it holds is shared by all. The controller's is a
:class:`Runtime`, typed, rather than a closure the handlers are nested in: the handlers are plain
module-level functions (``controller.indexes``, ``controller.policy_handlers``,
``controller.watch_handlers``), and this is all the state they carry between events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gpuslice.controller.changes import Changes
from gpuslice.controller.defrag.auto import Defragmenter
from gpuslice.controller.indexes import world
from gpuslice.controller.login import KopfLogin
from gpuslice.controller.overuse import OveruseEnforcer
from gpuslice.controller.retry import SchedulerRetry
from gpuslice.controller.settings import ControllerSettings
from gpuslice.controller.state import Context
from gpuslice.controller.world import FleetMemo, World
from gpuslice.kube.client import KubeClient


@dataclass
class Runtime:
    """``client`` makes the API client reconciles write with (the leader's guarded one);
    ``logins`` are this run's Kopf logins (a run after the CRD came back gets new ones:
    controller.login); ``crd_leaving`` is set when the last policy went with its CRD being deleted
    (controller.crd). ``ctx``, ``defrag`` and ``retry`` are made by the startup handler, before any watch."""

    settings: ControllerSettings
    client: Callable[[], Awaitable[KubeClient]]
    logins: KopfLogin
    crd_leaving: asyncio.Event | None = None
    changes: Changes = field(default_factory=Changes)
    fleet: FleetMemo = field(default_factory=FleetMemo)
    overuse: OveruseEnforcer = field(default_factory=OveruseEnforcer)
    ctx: Context | None = None
    defrag: Defragmenter | None = None
    retry: SchedulerRetry | None = None
    # A policy's status refresh coming after its quotas' or ledgers' events (controller.watch_handlers).
    refreshes: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def context(self) -> Context:
        """The reconciles' Context; only a handler that cannot run before startup asks for it."""
        if self.ctx is None:
            raise RuntimeError("the controller's startup handler has not run")
        return self.ctx

    def world(self, kwargs: dict[str, Any]) -> World:
        """The cluster as the indexes in a handler's ``kwargs`` hold it, with the fleet's memo."""
        return world(kwargs, self.fleet, self.changes.nodes_version)
