"""A tenant with maxMemory 30Gi tries to hold more through the paths
the existing tests do not take: claims made by kube-controller-manager from its own template,
several pods racing for them, a claim deleted while its pod still holds it (to get its charge
released early), its namespace's routing labels taken off (by whoever may label namespaces), and
writing its own ledger. Real API server, scheduler, controller-manager, controller and webhook."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.claims import allocation, claim, pod_using, refused, request
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import PAUSE_IMAGE, RESOURCE, wait_for
from tests.cluster.observe import scheduler_attempts
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory, WebhookProcess
from tests.cluster.webhook.budgets import GI, budget_policy, claim_with_pod, ledger, refused_at_allocation

MEMORY_10 = {"mode": "memory", "sliceSize": "10Gi"}


def template(name: str, klass: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request(klass)}]}}}}


def pod_from_template(name: str, template_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}]}}


async def allocated_in(kube: KubeClient, ns: str) -> list[str]:
    return sorted(c["metadata"]["name"] for c in await kube.list(f"{RESOURCE}/namespaces/{ns}/resourceclaims")
                  if (c.get("status") or {}).get("allocation"))


async def test_a_tenants_own_template_and_racing_pods_get_no_more_than_max_memory(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, cluster: DevCluster,
) -> None:
    """Memory mode, 10Gi slices, maxMemory 30Gi, 7 slices on the GPU: six pods made at once from the
    tenant's own template (claims made by kube-controller-manager, allocated by the scheduler in
    parallel) get three slices, never more."""
    name, klass, _ = await budget_policy(kube, make_policy, gpu_node, namespace, MEMORY_10, devices=7)
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", template("mine", klass))
    for i in range(6):
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_from_template(f"p{i}", "mine"))

    async def three() -> list[str] | None:
        found = await allocated_in(kube, namespace)
        assert len(found) <= 3, f"{namespace} holds {len(found)} slices of 10Gi with maxMemory 30Gi: {found}"
        return found if len(found) == 3 else None

    await wait_for(three, within=60, what="three of the six template claims to be allocated")
    await scheduler_attempts(cluster, 6)
    found = await allocated_in(kube, namespace)
    assert len(found) == 3, f"{namespace} holds {len(found)} slices of 10Gi with maxMemory 30Gi: {found}"
    assert (await ledger(kube, name, namespace))["status"]["heldBytes"] == 30 * GI
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)


async def test_deleting_a_claim_its_pod_still_holds_releases_nothing(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, cluster: DevCluster,
) -> None:
    """Three 10Gi slices held by three pods; the tenant deletes one claim (not its pod) to have its
    charge released, then asks a fourth: the deleted claim stays (its pod holds it, the finalizer
    waits) and stays charged, so the fourth is refused."""
    name, klass, _ = await budget_policy(kube, make_policy, gpu_node, namespace, MEMORY_10, devices=7)
    for i in range(3):
        await claim_with_pod(kube, namespace, f"c{i}", claim(f"c{i}", request(klass)))
    for i in range(3):
        await wait_for(lambda i=i: allocation(kube, namespace, f"c{i}"), within=60, what=f"c{i} to be allocated")
    await kube.delete(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/c0")
    await claim_with_pod(kube, namespace, "c3", claim("c3", request(klass)))
    said = await refused_at_allocation(kube, namespace, "c3", "maxMemory")
    assert "holds 30Gi of its 30Gi maxMemory" in said, said
    await scheduler_attempts(cluster, 3)
    assert await allocation(kube, namespace, "c3") is None, "the fourth slice was allocated"
    assert await allocation(kube, namespace, "c0") is not None, "the deleted claim's pod still holds it"
    assert (await ledger(kube, name, namespace))["status"]["heldBytes"] == 30 * GI
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)


async def test_taking_the_routing_labels_off_a_max_memory_tenant_lets_nothing_through(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str,
) -> None:
    """Someone who may label namespaces takes gpuslice.dev/memory-limit off the tenant (the webhook's
    namespaceSelector): a claim made then is refused by the tenancy rule, and a claim made before
    is refused at allocation; with gpuslice.dev/tenancy off too, gpuslice-non-tenants refuses. The
    controller puts both back."""
    name, klass, _ = await budget_policy(kube, make_policy, gpu_node, namespace, MEMORY_10, devices=7)
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", claim("early", request(klass)))
    controller.pause()  # so the labels stay off while the tenant tries
    try:
        await kube.merge_patch(f"/api/v1/namespaces/{namespace}",
                               {"metadata": {"labels": {"gpuslice.dev/memory-limit": None}}})

        async def refused_without_label() -> str | None:
            try:
                await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
                                  claim("late", request(klass)), dryRun="All")
            except KubeError as error:
                return error.message if "not labelled gpuslice.dev/memory-limit=judged" in error.message else None
            return None

        await wait_for(refused_without_label, within=30, what="the tenancy rule to see the label gone")
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_using("early", "early"))
        said = await refused_at_allocation(kube, namespace, "early", "not labelled gpuslice.dev/memory-limit")
        assert "allocation of ResourceClaim early" in said, said
        await kube.merge_patch(f"/api/v1/namespaces/{namespace}",
                               {"metadata": {"labels": {"gpuslice.dev/tenancy": None}}})

        async def non_tenant() -> bool:
            try:
                await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
                                  claim("late", request(klass)), dryRun="All")
            except KubeError as error:
                return "gpuslice-non-tenants" in error.message
            return False

        await wait_for(non_tenant, within=30, what="gpuslice-non-tenants to refuse in the unlabelled namespace")
        assert await allocation(kube, namespace, "early") is None
    finally:
        controller.resume()

    async def labelled() -> bool:
        labels = (await kube.get(f"/api/v1/namespaces/{namespace}"))["metadata"].get("labels") or {}
        return labels.get("gpuslice.dev/memory-limit") == "judged" and labels.get("gpuslice.dev/tenancy") == "judged"

    await wait_for(labelled, within=60, what="the controller to label the tenant again")
    await wait_for(lambda: allocation(kube, namespace, "early"), within=60, what="early, once judged again")
    assert (await ledger(kube, name, namespace))["status"]["heldBytes"] == 10 * GI
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)


async def test_a_tenant_with_every_right_in_its_namespace_may_not_write_ledgers_labels_or_allocations(
    kube: KubeClient, namespace: str, unique: str,
) -> None:
    """The strongest tenant a platform makes: every verb on everything in its own namespace (a Role
    with wildcards; the dev cluster runs no role aggregation, so the built-in `admin` is empty here).
    The API server's own authorizer (SubjectAccessReview) still refuses it every write of a ledger
    (they live in gpuslice-system), of its namespace (its labels route admission), and of a claim's
    allocation (resourceclaims/binding is cluster-wide). It may write its own claims' status.devices
    (an overuse mark), which gets at most its own pods acted on."""
    user = f"tenant-{unique}"
    await kube.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles", {
        "metadata": {"name": "tenant-all"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]})
    await kube.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
        "metadata": {"name": "tenant-all"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-all"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}]})

    async def may(verb: str, resource: str, sub: str = "", ns: str = "gpuslice-system", group: str = "gpuslice.dev",
                  name: str = "") -> bool:
        review = await kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "resourceAttributes": {"namespace": ns, "verb": verb, "group": group,
                                                          "resource": resource, "subresource": sub, "name": name}}})
        return bool(review["status"].get("allowed"))

    await wait_for(lambda: may("create", "resourceclaims", ns=namespace, group="resource.k8s.io"), within=30,
                   what="the tenant's binding to let it make claims (the authorizer's cache)")
    for verb in ("create", "update", "patch", "delete"):
        assert not await may(verb, "gpusliceledgers")
        assert not await may(verb, "gpusliceledgers", "status")
    for verb in ("update", "patch"):
        assert not await may(verb, "namespaces", ns="", group="", name=namespace)
        assert not await may(verb, "resourceclaims", "binding", ns="", group="resource.k8s.io")


async def first_done(waits: list[Coroutine[Any, Any, str]]) -> str:
    """The answer of the first of ``waits`` to succeed (each fails on its own timeout)."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        for next_done in asyncio.as_completed(tasks):
            with contextlib.suppress(AssertionError):
                return await next_done
        raise AssertionError("no pod's Events said it was refused for maxMemory")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_mig_profiles_are_charged_their_memory(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: WebhookProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, cluster: DevCluster,
) -> None:
    """Dynamic MIG (1g.10gb and 3g.40gb on an H100: partitionable devices with shared counters, which
    no other maxMemory test takes), maxMemory 20Gi: a 3g.40gb is refused when made, two 1g.10gb
    (9984Mi each) are allocated, a third is refused at allocation."""
    name, _, _ = await budget_policy(kube, make_policy, gpu_node, namespace,
                                     {"mode": "mig", "mig": {"profiles": ["1g.10gb", "3g.40gb"]}},
                                     max_memory="20Gi", devices=9)
    small, large = f"1g.10gb.{name}.gpuslice.dev", f"3g.40gb.{name}.gpuslice.dev"
    await refused(kube, namespace, claim("large", request(large)), "maxMemory: 20Gi")
    for i in range(3):
        await claim_with_pod(kube, namespace, f"m{i}", claim(f"m{i}", request(small)))
    # The scheduler takes the three pods in no set order: whichever comes third is refused.
    said = await first_done([refused_at_allocation(kube, namespace, f"m{i}", "maxMemory") for i in range(3)])
    assert "this claim asks 9984Mi" in said or "this claim asks 9.8Gi" in said, said
    await scheduler_attempts(cluster, 3)
    found = await allocated_in(kube, namespace)
    assert len(found) == 2, f"{namespace} holds {found} with maxMemory 20Gi"
    assert (await ledger(kube, name, namespace))["status"]["heldBytes"] == 2 * 9984 * 2**20
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods", gracePeriodSeconds=0)
