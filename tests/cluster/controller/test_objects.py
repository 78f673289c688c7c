"""A policy becomes every cluster object a tenant needs; edits add and remove them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import NO_NODES, POLICIES, RESOURCE, condition, get_or_none, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory


async def test_policy_creates_class_templates_quota_admission_and_labels(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    team_a, team_b, ops = await namespaces("team-a"), await namespaces("team-b"), await namespaces("ops")
    policy = await make_policy({
        "nodeSelector": NO_NODES,
        "slicing": {"mode": "memory", "sliceSize": "10Gi"},
        "tenants": [{"namespace": team_a, "maxSlices": 2}, {"namespace": team_b}],
        "adminAccess": {"namespaces": [ops]},
        "extendedResourceName": f"example.com/{policy_name_placeholder()}",
    })
    name = policy["metadata"]["name"]
    klass = f"{name}.gpuslice.dev"

    device_class = await wait_for(lambda: get_or_none(kube, f"{RESOURCE}/deviceclasses/{klass}"), what="the DeviceClass")
    expression = device_class["spec"]["selectors"][0]["cel"]["expression"]
    assert 'device.driver == "gpu.gpuslice.dev"' in expression
    assert f'.?policy.orValue("") == "{name}"' in expression
    assert device_class["spec"]["extendedResourceName"] == f"example.com/{policy_name_placeholder()}"
    assert device_class["metadata"]["ownerReferences"][0]["uid"] == policy["metadata"]["uid"]

    for ns in (team_a, team_b):
        template = await wait_for(lambda ns=ns: get_or_none(kube, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates/gpu-slice"),
                                  what=f"the claim template in {ns}")
        [request] = template["spec"]["spec"]["devices"]["requests"]
        assert request["exactly"]["deviceClassName"] == klass
    quota = await wait_for(lambda: get_or_none(kube, f"/api/v1/namespaces/{team_a}/resourcequotas/gpuslice-{name}"), what="the quota")
    assert quota["spec"]["hard"] == {f"{klass}.deviceclass.resource.k8s.io/devices": "2"}
    assert await get_or_none(kube, f"/api/v1/namespaces/{team_b}/resourcequotas/gpuslice-{name}") is None

    async def labelled() -> bool:
        ns = await kube.get(f"/api/v1/namespaces/{ops}")
        return ns["metadata"].get("labels", {}).get("resource.kubernetes.io/admin-access") == "true"

    await wait_for(labelled, what="the admin-access label on the admin namespace")

    async def status() -> dict[str, Any] | None:
        body = await kube.get(f"{POLICIES}/{name}")
        return body if condition(body, "Valid").get("status") == "True" else None

    body = await wait_for(status, what="status with Valid=True")
    assert body["status"]["deviceClassName"] == klass
    assert body["status"]["deviceClasses"] == [{"kind": "slice", "name": klass, "memoryBytes": 10 * 1024**3}]
    uid = {ns: (await kube.get(f"/api/v1/namespaces/{ns}"))["metadata"]["uid"] for ns in (team_a, team_b)}
    # The limited tenant is admitted once kube-controller-manager has synced its quota's status.hard
    # (Valid may come first), with the limits, the classes and the creation time of that quota.
    quota = await wait_for(lambda: _synced(kube, team_a, name), what="the quota's status.hard")

    async def admitted() -> dict[str, Any] | None:
        body = await kube.get(f"{POLICIES}/{name}")
        return body if len(body["status"].get("admittedTenants") or []) == 2 else None

    body = await wait_for(admitted, what="both tenants admitted")
    assert body["status"]["admittedTenants"] == sorted([
        {"namespace": team_a, "uid": uid[team_a], "limits": {"maxSlices": 2}, "classes": [klass],
         "since": quota["metadata"]["creationTimestamp"]},
        {"namespace": team_b, "uid": uid[team_b]},
    ], key=lambda a: a["namespace"])
    assert body["status"]["adminAccessLabels"] == [ops]
    assert condition(body, "Published")["reason"] == "NoMatchingNodes"
    assert condition(body, "Ready")["status"] == "False"
    assert body["status"]["observedGeneration"] == body["metadata"]["generation"]
    assert body["status"]["tenants"] == [
        {"namespace": team_a, "allocated": 0, "limit": 2, "allocatedBytes": 0, "limitBytes": 20 * 1024**3,
         "kinds": [{"kind": "slice", "allocated": 0, "limit": 2}]},
        {"namespace": team_b, "allocated": 0, "allocatedBytes": 0, "kinds": []},
    ]

    # A field the policy stops asking for goes from the object too (apply removes what we owned).
    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"extendedResourceName": None}})

    async def dropped() -> bool:
        return "extendedResourceName" not in (await kube.get(f"{RESOURCE}/deviceclasses/{klass}"))["spec"]

    await wait_for(dropped, what="extendedResourceName to leave the DeviceClass with the policy's field")


def policy_name_placeholder() -> str:
    return "gpu-slice-test"


async def test_printer_columns_show_mode_tenants_and_readiness(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    """What `kubectl get gsp` prints: the apiserver's Table rendering of the CRD's columns."""
    tenant = await namespaces("cols")
    name = (await make_policy({"nodeSelector": NO_NODES, "slicing": {"mode": "memory", "sliceSize": "10Gi"},
                               "tenants": [{"namespace": tenant}]}))["metadata"]["name"]

    async def table() -> dict[str, Any] | None:
        body = await kube.request("GET", f"{POLICIES}/{name}", query={},
                                  accept="application/json;as=Table;v=v1;g=meta.k8s.io")
        row = dict(zip([c["name"] for c in body["columnDefinitions"]], body["rows"][0]["cells"], strict=True))
        return row if row.get("Ready") else None

    row = await wait_for(table, what="the policy's Ready column")
    assert (row["Name"], row["Mode"], row["Slice"], row["Tenants"]) == (name, "memory", "10Gi", tenant)
    assert (row["Published"], row["Allocated"], row["Ready"]) == (0, 0, "False")


async def _synced(kube: KubeClient, ns: str, policy: str) -> dict[str, Any] | None:
    quota = await get_or_none(kube, f"/api/v1/namespaces/{ns}/resourcequotas/gpuslice-{policy}")
    return quota if quota is not None and (quota.get("status") or {}).get("hard") else None
