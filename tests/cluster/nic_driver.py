"""A second DRA driver for tests: the NICs of a fake server (``inventory.systems``), published as another
vendor's driver would (an SR-IOV or RDMA one), with the standard ``pcieRoot`` and ``numaNode`` of each, so
a claim can align a gpuslice GPU with a NIC by ``matchAttribute``. Published by the test as a driver's
node plugin would; nothing prepares them (the test cluster's nodes run no containers)."""

from __future__ import annotations

from typing import Any

from gpuslice.inventory.systems import SYSTEMS
from gpuslice.kube.client import KubeClient, KubeError

NIC_DRIVER = "nic.example.com"
NIC_CLASS = "nic.example.com"


def nic_devices(system: str) -> list[dict[str, Any]]:
    return [{"name": nic.name, "attributes": {
        f"{NIC_DRIVER}/name": {"string": nic.name},
        "resource.kubernetes.io/pciBusID": {"string": nic.bus},
        "resource.kubernetes.io/pcieRoot": {"string": nic.root},
        "resource.kubernetes.io/numaNode": {"int": nic.numa}}} for nic in SYSTEMS[system].nics]


async def publish_nics(kube: KubeClient, node: str, system: str, unique: str) -> dict[str, dict[str, Any]]:
    """The NIC driver's DeviceClass (shared by tests) and its slice for ``node``; the devices by name."""
    try:
        await kube.create("/apis/resource.k8s.io/v1/deviceclasses", {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": NIC_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{NIC_DRIVER}"'}}]}})
    except KubeError as error:
        if error.status != 409:
            raise
    node_body = await kube.get(f"/api/v1/nodes/{node}")
    devices = nic_devices(system)
    await kube.create("/apis/resource.k8s.io/v1/resourceslices", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"nics-{node}-{unique}", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_body["metadata"]["uid"]}]},
        "spec": {"driver": NIC_DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1}, "devices": devices}})
    return {d["name"]: d for d in devices}
