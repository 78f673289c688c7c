"""A policy's agent view follows the policy whatever happens to the view: the controller's watch of
the views, not its memory of what it wrote, says whether a view is current (a view deleted under it
is written again), a view of the same name in another namespace is not the policy's, a policy made
again under its name ends planned from its own view, and a policy deleted while no controller leads
drains once one does (docs/controller.md, "What the view costs")."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuslice.api.agent_view import view_path
from gpuslice.kube.client import KubeClient
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import POLICIES, get_or_none, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import pool_devices, published, tenant_policy

STATUS_INTERVAL = 10.0  # the controller's --status-interval (its default): the view's retry


async def view_of(kube: KubeClient, policy: str) -> dict[str, Any] | None:
    return await get_or_none(kube, view_path(policy))


async def test_a_view_deleted_under_the_controller_is_written_again(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    """A view can go without its policy going (an admin's ``kubectl delete gsav``, a stale DELETE):
    the agents then drain the policy's free devices. The policy's next status refresh writes it
    again, and the devices come back."""
    node = await gpu_node("l4", 1)
    name = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "12G"})
    await published(kube, node.name, 2)
    await wait_for(lambda: view_of(kube, name), what=f"the agent view of {name}")
    await kube.delete(view_path(name))
    await wait_for(lambda: view_of(kube, name), within=3 * STATUS_INTERVAL,
                   what=f"the view of {name}, deleted, to be written again")
    await published(kube, node.name, 2)


async def test_a_policy_deleted_while_no_controller_leads_drains_once_one_does(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    """Only the controller writes the deletion into the view: while it is away the policy waits on
    its finalizer (its tenants' claims still judged against it); once it is back the view says the
    policy is being deleted, the agents drain its devices and the policy goes."""
    node = await gpu_node("l4", 1)
    name = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "12G"})
    await published(kube, node.name, 2)
    await wait_for(lambda: view_of(kube, name), what=f"the agent view of {name}")
    starts = controller.log_text().count("controller started")
    await controller.stop()
    try:
        await kube.delete(f"{POLICIES}/{name}")
        assert await get_or_none(kube, f"{POLICIES}/{name}") is not None, "its finalizer holds it"
    finally:
        controller.start()

        async def started() -> bool:
            return controller.log_text().count("controller started") > starts

        await wait_for(started, within=60, what="the controller to start again")

    async def drained() -> bool:
        return not await pool_devices(kube, node.name)

    await wait_for(drained, within=60, what=f"the free devices of {name}, being deleted, to drain")
    await wait_for(lambda: _gone(kube, name), within=60, what=f"{name} to go")


async def _gone(kube: KubeClient, name: str) -> bool:
    return await get_or_none(kube, f"{POLICIES}/{name}") is None

async def test_a_policy_recreated_under_its_name_is_planned_from_its_own_view(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    """Delete a policy and create it again at once, with another slicing: Kopf handles the two UIDs
    in separate workers, so the old one's deletion of its view and the new one's write race, and the
    garbage collector deletes a view whose owner's UID is gone. The view must end as the new
    policy's, and the agent publish the new slicing."""
    node = await gpu_node("l4", 1)
    spec = {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
            "tenants": [{"namespace": namespace}], "claimTemplateName": "gpu-slice"}
    body = await make_policy({**spec, "slicing": {"mode": "memory", "sliceSize": "12G"}})
    name = str(body["metadata"]["name"])
    await published(kube, node.name, 2)
    for round_, (size, count) in enumerate([("6G", 4), ("12G", 2), ("6G", 4), ("12G", 2)]):
        await kube.delete(f"{POLICIES}/{name}")

        async def gone() -> bool:
            return await get_or_none(kube, f"{POLICIES}/{name}") is None

        await wait_for(gone, within=30, what=f"{name} to be deleted (round {round_})")
        new = await kube.create(POLICIES, {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
                                           "metadata": {"name": name},
                                           "spec": {**spec, "slicing": {"mode": "memory", "sliceSize": size}}})
        uid = new["metadata"]["uid"]

        async def own_view(uid: str = uid) -> bool:
            view = await view_of(kube, name)
            return view is not None and view["spec"]["policy"].get("uid") == uid \
                and view["spec"].get("observedGeneration") == 1

        await wait_for(own_view, within=3 * STATUS_INTERVAL, what=f"the view of {name} to be the new policy's"
                       f" (round {round_})")
        await published(kube, node.name, count)
        await asyncio.sleep(2 * STATUS_INTERVAL)  # length: two status refreshes, each of which could have lost it
        assert await own_view(), f"the new policy's view went (round {round_})"
        assert len(await pool_devices(kube, node.name)) == count, f"devices drained (round {round_})"


async def test_a_view_of_the_same_name_elsewhere_does_not_stand_for_the_policys_own(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    """A GpuSliceAgentView named after a policy in another namespace, with the digest annotation
    copied from the real one, does not stand for the policy's own (``indexes.view_index``). Here the real one
    is gone and the controller restarted, which would otherwise write it again."""
    node = await gpu_node("l4", 1)
    name = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "12G"})
    await published(kube, node.name, 2)
    real = await wait_for(lambda: view_of(kube, name), what=f"the agent view of {name}")
    decoy_path = f"/apis/gpuslice.dev/v1alpha1/namespaces/{namespace}/gpusliceagentviews/{name}"
    decoy = {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSliceAgentView",
             "metadata": {"name": name, "namespace": namespace, "annotations": dict(real["metadata"]["annotations"])},
             "spec": {}}
    await kube.create(f"/apis/gpuslice.dev/v1alpha1/namespaces/{namespace}/gpusliceagentviews", decoy)
    try:
        await kube.delete(view_path(name))
        await controller.restart()
        await wait_for(lambda: view_of(kube, name), within=3 * STATUS_INTERVAL,
                       what=f"the view of {name} in gpuslice-system written again, a decoy in {namespace}")
        await published(kube, node.name, 2)
    finally:
        await kube.delete(decoy_path)
