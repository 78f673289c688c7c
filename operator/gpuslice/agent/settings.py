"""The node agent's settings that are not about the kubelet plugin (see ``kubeletplugin.settings``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HealthSettings:
    """How the agent watches GPU health. ``recovery`` is the hysteresis: an unhealthy GPU's taint is
    lifted only after this long without a fault, so a flapping GPU does not churn the slices."""

    interval: float = 2.0  # seconds between polls of the backend
    recovery: float = 300.0
