"""A node's labels change what a policy selects, at once and for good: the controller keeps the
inventory and every selection between reconciles (controller/world.py), and must let go of them
when a label comes or goes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import POLICIES, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory

NODE = "gpu-node-1"


async def test_a_node_labelled_later_joins_the_selection_and_leaves_it_unlabelled(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]], unique: str,
) -> None:
    label = f"test.gpuslice.dev/pool-{unique}"[:63]
    tenant = await namespaces("inventory")
    policy = await make_policy({
        "nodeSelector": {"matchLabels": {label: "yes"}},
        "slicing": {"mode": "memory", "sliceSize": "10Gi"},
        "tenants": [{"namespace": tenant}],
    })
    name = policy["metadata"]["name"]

    def selected(nodes: int, gpus: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            status = (await kube.get(f"{POLICIES}/{name}")).get("status") or {}
            judged = status.get("observedGeneration") == policy["metadata"]["generation"]
            return judged and (status.get("nodes") or 0, status.get("gpus") or 0) == (nodes, gpus)
        return check

    await wait_for(selected(0, 0), within=60, what=f"{name} to select no node")
    try:
        await kube.merge_patch(f"/api/v1/nodes/{NODE}", {"metadata": {"labels": {label: "yes"}}})
        await wait_for(selected(1, 8), within=30, what=f"{name} to select {NODE} once it has {label}=yes")
        # Another reconcile of the same policy (its drift and status timers, an edit) keeps it.
        await kube.merge_patch(f"{POLICIES}/{name}", {"metadata": {"labels": {"touched": "yes"}}})
        await wait_for(selected(1, 8), within=30, what=f"{name} to keep selecting {NODE}")
    finally:
        await kube.merge_patch(f"/api/v1/nodes/{NODE}", {"metadata": {"labels": {label: None}}})
    await wait_for(selected(0, 0), within=30, what=f"{name} to let {NODE} go once the label is gone")
