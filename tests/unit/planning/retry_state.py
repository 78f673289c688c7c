"""A shared-mode policy on an L4, its pods the scheduler turned away and the memory their claims ask:
what the scheduler-retry reads are given."""

from __future__ import annotations

from typing import Any

from tests.unit.planning.cluster_state import policy_body, tag

NOTEBOOKS = policy_body("notebooks", {"mode": "shared", "sliceSize": "1Gi"}, tenants=[{"namespace": "ds"}])
DEVICE = f"{tag('n1', 'l4')}-notebooks-shared"  # an L4: 24Gi less its reserve, in steps of 1Gi
AWAY = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 cannot allocate all claims."}


def pod(name: str, *conditions: dict[str, Any], node: str = "") -> dict[str, Any]:
    return {"metadata": {"namespace": "ds", "name": name},
            "spec": {"nodeName": node, "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]},
            "status": {"phase": "Pending", "conditions": list(conditions)}}


def asks(name: str, memory: str, device_class: str = "notebooks.gpuslice.dev") -> dict[str, Any]:
    return {"metadata": {"namespace": "ds", "name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class, "capacity": {"requests": {"memory": memory}}}}]}}}
