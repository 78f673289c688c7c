"""The faults tier's cluster: its nodes, how long each component may take to recover, and the
factory its tests make policies with."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

NODES = ("gpu-node-1", "gpu-node-2")
RECOVERY = 30.0  # seconds the controller and the agents may take once the API server is back


# A restarted API server refreshes its admission REST mapper every 30 s: until it has learnt the
# GpuSlicePolicy CRD, the tenancy rule (whose paramKind it is) fails closed and cannot be probed,
# so an edit made at once is judged (and then published) only after that (and a retry, 10 s at most).
API_SERVER_MAPPER = 30.0
CONTROLLER_MANAGER_BACK = 90.0  # seconds kube-controller-manager may take to act again after an API server restart


PolicyMaker = Callable[..., Awaitable[str]]
