"""Node agents on fake nodes, as in tests/cluster/agent."""

from __future__ import annotations

from tests.cluster.agent.conftest import agent_rbac, gpu_node

__all__ = ["agent_rbac", "gpu_node"]
