"""The drain at sizes past what one admission message can name."""

from __future__ import annotations

from gpuslice.kube.client import KubeClient
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import get_or_none, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import H100, G, pool_devices, published, tenant_policy


async def test_hundreds_of_devices_of_a_deleted_policy_all_drain(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    """The drain probe's refusal names every device it is asked about, and the API server words at
    most 5 KiB of a refusal: past that it gives its static message, which names none."""
    node = await gpu_node("h100-80gb", 4)
    name = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "2G"})
    count = 4 * (H100 // (2 * G))
    devices = await published(kube, node.name, count)
    assert len(" ".join(f"{node.name}/{d}" for d in devices)) > 5 * 1024, "more than one refusal can name"
    await kube.delete(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}")

    async def drained() -> bool:
        return not await pool_devices(kube, node.name) and await get_or_none(
            kube, f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}") is None

    await wait_for(drained, within=60, what="every device of the deleted policy to drain and go, and the policy with them")
