"""Hostile review, December (third round), aligned templates (spec.topology): a tenant limited by
maxFullGpus gets no more whole GPUs through claims of its own that use firstAvailable, whatever the
shape, and no template of a count it may not hold.

docs/topology.md: "ResourceQuota charges a firstAvailable request by its largest subrequest per
DeviceClass ... A tenant's template of a count its maxFullGpus can never allow is not made." Tried
as the tenant would: the aligned template's shape with count 4, a cheap slice first and 4 whole GPUs
second, two requests that each stay within the limit, allocationMode All; a claim of another
policy's class. A promise test: it passes while each is refused.
"""

from __future__ import annotations

from typing import Any

from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import RESOURCE, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.tenancy import ready_tenant


def _claim(name: str, requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": devices}}


def _way(name: str, klass: str, count: int | None = None) -> dict[str, Any]:
    way: dict[str, Any] = {"name": name, "deviceClassName": klass}
    if count is None:
        way["allocationMode"] = "All"
    else:
        way.update(allocationMode="ExactCount", count=count)
    return way


async def test_a_max_full_gpus_tenant_gets_no_more_whole_gpus_through_first_available(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str, namespaces: Any,
) -> None:
    other = await namespaces("oth")
    node = await gpu_node("h100-80gb", 8, system="dgx-h100")
    spec = {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
            "slicing": {"mode": "memory", "sliceSize": "40Gi", "allowFullGpu": True},
            "topology": {"counts": [2, 4]}}
    name = str((await make_policy({**spec, "tenants": [{"namespace": namespace, "maxSlices": 2,
                                                        "maxFullGpus": 2}]}))["metadata"]["name"])
    other_policy = str((await make_policy({**spec, "nodeSelector": {"matchLabels": {"gpuslice.dev/none": "x"}},
                                           "tenants": [{"namespace": other}]}, "-o"))["metadata"]["name"])
    await ready_tenant(kube, name, namespace, classes=2)

    async def x2_template() -> bool:
        names = [t["metadata"]["name"] for t in
                 await kube.list(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates")]
        return any(n.endswith("-x2") for n in names)

    await wait_for(x2_template, within=60, what="the tenant's aligned template of 2 GPUs")
    full, slice_ = f"full.{name}.gpuslice.dev", f"{name}.gpuslice.dev"
    templates = sorted(t["metadata"]["name"] for t in
                       await kube.list(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates"))
    print("A templates of the maxFullGpus 2 tenant:", templates)
    tries = {
        "the aligned shape, 4 whole GPUs": _claim("x4", [{"name": "gpus", "firstAvailable": [
            _way("nvlink", full, 4), _way("any", full, 4)]}], [{"requests": ["gpus/nvlink"],
                                                                "matchAttribute": "gpuslice.dev/nvlinkDomain"}]),
        "a slice first, 4 whole GPUs second": _claim("cheap-first", [{"name": "gpus", "firstAvailable": [
            _way("slice", slice_, 1), _way("full", full, 4)]}]),
        "two requests of 2 whole GPUs each": _claim("two", [
            {"name": "a", "firstAvailable": [_way("full", full, 2)]},
            {"name": "b", "firstAvailable": [_way("full", full, 2)]}]),
        "allocationMode All of the whole GPUs": _claim("all", [{"name": "gpus", "firstAvailable": [
            _way("slice", slice_, 1), _way("full", full)]}]),
        "another policy's class second": _claim("foreign", [{"name": "gpus", "firstAvailable": [
            _way("mine", slice_, 1), _way("theirs", f"full.{other_policy}.gpuslice.dev", 2)]}]),
    }
    said: dict[str, str] = {}
    for what, body in tries.items():
        try:
            await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", body)
            said[what] = "ADMITTED"
        except KubeError as error:
            said[what] = f"{error.status}: {error.message[:220]}"
        print(f"A {what}: {said[what]}")

    async def control() -> bool:  # the limit itself: 2 whole GPUs in one aligned claim is admitted
        try:
            await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", _claim("x2", [
                {"name": "gpus", "firstAvailable": [_way("nvlink", full, 2)]}]))
        except KubeError as error:
            if "try again" in error.message:
                return False
            raise
        return True

    await wait_for(control, within=30, what="the control claim of 2 whole GPUs to be admitted")
    assert not any(t.endswith("-x4") for t in templates), f"a template of 4 whole GPUs for maxFullGpus 2: {templates}"
    admitted = [what for what, answer in said.items() if answer == "ADMITTED"]
    assert not admitted, f"claims past maxFullGpus 2 (or of another policy) were admitted: {admitted}"
