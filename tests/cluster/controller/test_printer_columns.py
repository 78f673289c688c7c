"""``kubectl get gsp``: the columns as the apiserver's own table printer fills them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import POLICIES, RESOURCE, claim_template, condition, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


async def table_row(kube: KubeClient, name: str) -> dict[str, Any]:
    """What ``kubectl get gsp NAME`` prints, by column (the server converts the object to a Table)."""
    table = await kube.request("GET", f"{POLICIES}/{name}", accept=TABLE)
    columns = [c["name"] for c in table["columnDefinitions"]]
    [row] = table["rows"]
    return dict(zip(columns, row["cells"], strict=True))


async def test_every_tenant_nodes_gpus_and_degraded_are_columns(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    tenants = [await namespaces(f"col{i}") for i in range(3)]
    # A tenant's own template of the policy's name: the policy is Degraded (NameTaken), still Valid.
    await kube.create(f"{RESOURCE}/namespaces/{tenants[0]}/resourceclaimtemplates",
                      claim_template("gpu-slice", "someone-elses.example.com"))
    policy = await make_policy({
        "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": "gpu-node-1"}},
        "slicing": {"mode": "memory", "sliceSize": "10Gi"},
        "tenants": [{"namespace": ns} for ns in tenants],
    })
    name = policy["metadata"]["name"]

    async def degraded() -> dict[str, Any] | None:
        body = await kube.get(f"{POLICIES}/{name}")
        return body if condition(body, "Degraded").get("reason") == "NameTaken" else None

    await wait_for(degraded, within=60, what="the policy to be Degraded (NameTaken)")
    row = await table_row(kube, name)
    assert row["Tenants"] == ", ".join(tenants)
    assert (row["Nodes"], row["GPUs"]) == (1, 8)  # gpu-node-1's labels: 8 fake H100s
    assert (row["Degraded"], row["Degraded-Reason"]) == ("True", "NameTaken")
    assert row["Mode"] == "memory"
