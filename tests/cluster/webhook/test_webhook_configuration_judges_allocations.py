"""The maxMemory webhook's configuration edited so that allocation writes no longer reach it (its
``UPDATE resourceclaims/status`` rule dropped): the controller's probe (a dry-run claim made) still
passes, but the controller reads the configuration too, and puts no tenant's maxMemory in force
while an allocation could pass unjudged (the second December review's B9). Put back, the tenant's
maxMemory is in force again."""

from __future__ import annotations

from typing import Any

from gpuslice.kube.client import KubeClient
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory, WebhookProcess
from tests.cluster.webhook.budgets import POLICIES, memory_in_force, on

CONFIG = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/gpuslice-memory"


async def _patch(kube: KubeClient, ops: list[dict[str, Any]]) -> None:
    await kube.request("PATCH", CONFIG, ops, content_type="application/json-patch+json")


async def test_a_configuration_that_lets_allocations_past_the_webhook_puts_no_max_memory_in_force(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    config = await kube.get(CONFIG)
    [hook] = config["webhooks"]
    [index] = [i for i, r in enumerate(hook["rules"]) if r["resources"] == ["resourceclaims/status"]]
    rule = hook["rules"][index]
    await _patch(kube, [{"op": "test", "path": f"/webhooks/0/rules/{index}/resources/0",
                         "value": "resourceclaims/status"},
                        {"op": "remove", "path": f"/webhooks/0/rules/{index}"}])
    try:
        node = await gpu_node("h100-80gb", 1)
        name = str((await make_policy({"nodeSelector": on(node.name), "slicing": {"mode": "memory", "sliceSize": "10G"},
                                       "tenants": [{"namespace": namespace, "maxMemory": "20Gi"}]}))["metadata"]["name"])

        async def told() -> dict[str, Any] | None:
            status = (await kube.get(f"{POLICIES}/{name}")).get("status") or {}
            found = next((c for c in status.get("conditions") or [] if c.get("type") == "Degraded"
                          and c.get("reason") == "MemoryLimitNotEnforced"), None)
            return found if found and "may not judge every allocation" in found.get("message", "") else None

        condition = await wait_for(told, within=90, what="the controller to find the allocation rule gone")
        print("B9 the policy says:", condition["message"][:300])
        status = (await kube.get(f"{POLICIES}/{name}")).get("status") or {}
        limits = [(a.get("limits") or {}).get("maxMemory") for a in status.get("admittedTenants") or []
                  if a["namespace"] == namespace]
        assert limits in ([], [None]), f"the tenant's maxMemory was put in force: {limits}"
        assert "UPDATE of resourceclaims/status" in condition["message"]
    finally:
        await _patch(kube, [{"op": "add", "path": f"/webhooks/0/rules/{index}", "value": rule}])
    await memory_in_force(kube, name, namespace, "20Gi")
