"""Test 2: the apiserver's validation of partitionable pools (KEP-4815, 1.35+ layout)."""

from __future__ import annotations

import pytest

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import RESOURCE, ClusterObjects, counter_slice, device_slice, partition


async def test_counter_slice_and_device_slice_are_accepted(
    cluster: DevCluster, kube: KubeClient, cluster_objects: ClusterObjects, unique: str
) -> None:
    driver, node = f"{unique}.accept.test.gpuslice.dev", cluster.node_names[0]
    await cluster_objects.create(f"{RESOURCE}/resourceslices", counter_slice(f"{unique}-0", driver, node, {"memory": "80Gi"}))
    devices = [partition(f"gpu-0-10g-{i}", "10Gi") for i in range(8)]
    await cluster_objects.create(f"{RESOURCE}/resourceslices", device_slice(f"{unique}-1", driver, node, devices))

    stored = await kube.list(f"{RESOURCE}/resourceslices", fieldSelector=f"spec.driver={driver}")
    assert sorted(s["metadata"]["name"] for s in stored) == [f"{unique}-0", f"{unique}-1"]
    by_name = {s["metadata"]["name"]: s["spec"] for s in stored}
    assert by_name[f"{unique}-0"]["sharedCounters"][0]["counters"]["memory"]["value"] == "80Gi"
    assert [d["name"] for d in by_name[f"{unique}-1"]["devices"]] == [f"gpu-0-10g-{i}" for i in range(8)]


async def test_slice_with_devices_and_counters_is_rejected(
    cluster: DevCluster, cluster_objects: ClusterObjects, unique: str
) -> None:
    driver, node = f"{unique}.reject.test.gpuslice.dev", cluster.node_names[0]
    both = counter_slice(f"{unique}-both", driver, node, {"memory": "80Gi"}, slices=1)
    both["spec"]["devices"] = [partition("gpu-0-10g-0", "10Gi")]
    with pytest.raises(KubeError) as rejected:
        await cluster_objects.create(f"{RESOURCE}/resourceslices", both)
    assert rejected.value.status == 422
    assert "only one of `sharedCounters` or `devices` is allowed" in rejected.value.message
