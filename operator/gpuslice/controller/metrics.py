"""Prometheus metrics of the controller."""

from __future__ import annotations

from prometheus_client import Counter

RECONCILES = Counter("gpuslice_controller_reconciles", "Policy reconciles, by result.", ["result"])
