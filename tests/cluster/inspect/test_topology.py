"""Aligned claims on a fake DGX H100, placed by the real kube-scheduler: a 4-GPU claim waits while only a
misaligned set of 4 is free (and ``why`` says so), and gets 4 GPUs of one NUMA node and NVLink domain once
one frees; a GPU aligned with a NIC of another DRA driver by PCIe root."""

from __future__ import annotations

from typing import Any

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.inventory.systems import SYSTEMS
from gpuslice.kube.client import KubeClient
from tests.cluster.cli import Cli, findings
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import PAUSE_IMAGE, on, pod_claim, wait_for
from tests.cluster.nic_driver import NIC_CLASS, publish_nics
from tests.cluster.observe import scheduler_settled, scrape, total
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import published

RESOURCE = "/apis/resource.k8s.io/v1"
NUMA, NVLINK, ROOT = "resource.kubernetes.io/numaNode", "gpuslice.dev/nvlinkDomain", "resource.kubernetes.io/pcieRoot"
TRAIN = {"mode": "memory", "sliceSize": "40Gi", "allowFullGpu": True}  # a 40Gi slice and the whole GPU: 2 per GPU


def pinned(name: str, device_class: str, index: int) -> dict[str, Any]:
    """A claim for the whole GPU of that index (a tenant may select within its class)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class,
                "selectors": [{"cel": {"expression": f'device.attributes["gpuslice.dev"].index == {index}'}}]}}]}}}


def pod(name: str, *, claim: str | None = None, template: str | None = None) -> dict[str, Any]:
    source = {"resourceClaimName": claim} if claim else {"resourceClaimTemplateName": template}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "work", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", **source}], "terminationGracePeriodSeconds": 0}}


async def hold(kube: KubeClient, namespace: str, device_class: str, indexes: list[int]) -> None:
    """Pods holding the whole GPUs of these indexes, once each is allocated."""
    for index in indexes:
        await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", pinned(f"hold-{index}", device_class, index))
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod(f"hold-{index}", claim=f"hold-{index}"))
    for index in indexes:
        async def allocated(index: int = index) -> bool:
            claim = await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/hold-{index}")
            return bool((claim.get("status") or {}).get("allocation"))

        await wait_for(allocated, within=60, what=f"hold-{index} allocated")


async def unschedulable(kube: KubeClient, namespace: str, name: str) -> None:
    async def check() -> bool:
        found = await kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
                   for c in (found.get("status") or {}).get("conditions") or [])

    await wait_for(check, within=60, what=f"{name} unschedulable")


async def release(kube: KubeClient, namespace: str, indexes: list[int]) -> None:
    for index in indexes:
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/hold-{index}", gracePeriodSeconds=0)
        await kube.delete(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/hold-{index}")


def by_device(devices: dict[str, dict[str, Any]], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [devices[r["device"]]["attributes"] for r in results if r["driver"] == "gpu.gpuslice.dev"]


async def test_an_aligned_claim_waits_for_an_aligned_set_and_why_says_what_would_free_one(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, gpuslice: Cli,
) -> None:
    node = await gpu_node("h100-80gb", 8, system="dgx-h100")
    policy = await make_policy({"nodeSelector": on(node.name), "slicing": TRAIN, "tenants": [{"namespace": namespace}],
                                "topology": {"counts": [4], "alignments": [{"match": ["NVLink", "NUMANode"]}]}})
    name = policy["metadata"]["name"]
    devices = await published(kube, node.name, 16)
    for device in devices.values():  # the acceptance of `gpuslice plan`, here as the agent publishes it
        assert {NUMA, NVLINK, ROOT} <= set(device["attributes"]), device["name"]
    template = "gpu-slice-full-x4"
    await wait_for(lambda: kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates/{template}"),
                   what=f"template {template}")
    # GPUs 0, 1 (NUMA 0) and 4, 5 (NUMA 1) held: 2, 3, 6 and 7 are free, four GPUs but two on each NUMA node.
    await hold(kube, namespace, f"full.{name}.gpuslice.dev", [0, 1, 4, 5])
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod("job", template=template))
    await unschedulable(kube, namespace, "job")
    await scheduler_settled(cluster)
    claim = await pod_claim(kube, namespace, "job")
    assert claim is not None
    assert not (claim.get("status") or {}).get("allocation"), "a misaligned set of 4 was free: it must wait"

    said = findings((await gpuslice("why", f"{namespace}/job", "-o", "json")).json())
    assert "FreeDevices" not in said
    message = said["NoAlignedSet"]
    assert f"gpus/nvlink-numa: 4 x whole GPU of {name} are free, but no 4 of them on one node share an NVLink" \
           " domain and a NUMA node" in message
    assert f"Releasing {namespace}/hold-0, {namespace}/hold-1 would free 4 that do" in message

    await release(kube, namespace, [0, 1])

    async def allocated() -> dict[str, Any] | None:
        found = await pod_claim(kube, namespace, "job")
        return found if found and (found.get("status") or {}).get("allocation") else None

    claim = await wait_for(allocated, within=90, what="the aligned claim allocated once GPUs 0 and 1 are free")
    results = claim["status"]["allocation"]["devices"]["results"]
    attributes = by_device(devices, results)
    assert len(attributes) == 4
    assert {a[NUMA]["int"] for a in attributes} == {0}
    assert len({a[NVLINK]["string"] for a in attributes}) == 1
    assert {r["request"] for r in results} == {"gpus/nvlink-numa"}, "the claim says the alignment granted"

    report = (await gpuslice("status", "-o", "json")).json()
    mine = [a for a in report["aligned"] if a["claim"] == claim["metadata"]["name"]]
    assert mine == [{"namespace": namespace, "claim": claim["metadata"]["name"], "node": node.name,
                     "gpus": [0, 1, 2, 3], "achieved": "nvlink-numa", "granted": "nvlink-numa"}]
    topology = next(t for t in report["topology"] if t["node"] == node.name)
    assert topology["numa"] == [[0, [0, 1, 2, 3]], [1, [4, 5, 6, 7]]]

    async def counted() -> bool:
        samples = await scrape(f"http://127.0.0.1:{controller.metrics_port}/metrics")
        return total(samples, "gpuslice_policy_aligned_allocations", policy=name, gpus="4",
                     alignment="nvlink-numa") == 1
    await wait_for(counted, within=60, what="the controller to count the aligned allocation")


async def test_a_gpu_aligned_with_a_nic_of_another_driver_waits_for_a_nic_under_its_root(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, unique: str,
) -> None:
    """The SR-IOV / RDMA case: one claim, a GPU of gpuslice's and a NIC of another DRA driver, matched on
    the standard pcieRoot. Only GPU 5 is free; the NICs under its root are taken, others are free: the
    claim waits rather than take a far NIC, and gets one under GPU 5's root once one frees."""
    node = await gpu_node("h100-80gb", 8, system="dgx-h100")
    policy = await make_policy({"nodeSelector": on(node.name), "slicing": TRAIN, "tenants": [{"namespace": namespace}]})
    name = policy["metadata"]["name"]
    devices = await published(kube, node.name, 16)
    nics = await publish_nics(kube, node.name, "dgx-h100", unique)
    layout = SYSTEMS["dgx-h100"]
    root = layout.gpus[5].root
    near = sorted(n.name for n in layout.nics if n.root == root)
    await hold(kube, namespace, f"full.{name}.gpuslice.dev", [0, 1, 2, 3, 4, 6, 7])
    for nic in near:  # the NICs under GPU 5's root, taken by another workload
        await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": f"taken-{nic}"},
            "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": NIC_CLASS, "selectors": [
                {"cel": {"expression": f'device.attributes["nic.example.com"].name == "{nic}"'}}]}}]}}})
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod(f"taken-{nic}", claim=f"taken-{nic}"))
    both = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "rdma"},
            "spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": f"full.{name}.gpuslice.dev"}},
                             {"name": "nic", "exactly": {"deviceClassName": NIC_CLASS}}],
                "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": ROOT}]}}}
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", both)
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod("rdma", claim="rdma"))
    await unschedulable(kube, namespace, "rdma")
    await scheduler_settled(cluster)
    claim = await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/rdma")
    assert not (claim.get("status") or {}).get("allocation"), "GPU 5 and NICs are free, but none under its root"

    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/taken-{near[0]}", gracePeriodSeconds=0)
    await kube.delete(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/taken-{near[0]}")

    async def allocated() -> dict[str, Any] | None:
        found = await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/rdma")
        return found if (found.get("status") or {}).get("allocation") else None

    claim = await wait_for(allocated, within=90, what="the GPU and NIC claim allocated")
    results = {r["request"]: r for r in claim["status"]["allocation"]["devices"]["results"]}
    gpu = devices[results["gpu"]["device"]]["attributes"]
    assert gpu["gpuslice.dev/index"]["int"] == 5
    assert results["nic"]["driver"] == "nic.example.com"
    assert results["nic"]["device"] == near[0]
    assert nics[near[0]]["attributes"][ROOT] == gpu[ROOT], "the NIC under the GPU's own PCIe root"
