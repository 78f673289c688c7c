"""The controller's Kopf registry: its indexes, its policies' handlers and its watches' handlers,
on a registry of its own (never Kopf's global one), one per run of Kopf.

The handlers are module-level functions, grouped by what they watch: ``controller.indexes``
(what is kept in memory), ``controller.policy_handlers`` (GpuSlicePolicies, and Kopf's start,
stop and login), ``controller.watch_handlers`` (everything else watched). What they share is
Kopf's ``memo``, a :class:`~gpuslice.controller.runtime.Runtime` given to ``kopf.operator``.
"""

from __future__ import annotations

import kopf

from gpuslice.controller.indexes import register_indexes
from gpuslice.controller.policy_handlers import register_policy_handlers
from gpuslice.controller.settings import ControllerSettings
from gpuslice.controller.watch_handlers import register_watch_handlers


def build_registry(settings: ControllerSettings) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    register_indexes(registry)
    register_policy_handlers(registry, settings)
    register_watch_handlers(registry)
    return registry
