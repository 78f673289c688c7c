"""Edits, late namespaces, deletion that waits for claims, taint rules, and restarts."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import (
    NO_NODES,
    POLICIES,
    RESOURCE,
    ClusterObjects,
    condition,
    get_or_none,
    pod_claim,
    pod_with_claim,
    policy_devices,
    template_path,
    wait_for,
)
from tests.cluster.observe import handler_retried, log_entries, reconciled_again
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory

ADMIN_LABEL = "resource.kubernetes.io/admin-access"
MEMORY = {"mode": "memory", "sliceSize": "10Gi"}


async def reconciled(kube: KubeClient, name: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        body = await kube.get(f"{POLICIES}/{name}")
        return body if (body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"] else None

    result: dict[str, Any] = await wait_for(check, what=f"policy {name} to be reconciled")
    return result


async def absent(kube: KubeClient, path: str) -> bool:
    return await get_or_none(kube, path) is None


async def test_editing_tenants_and_admins_adds_and_removes(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    a, b, c = await namespaces("a"), await namespaces("b"), await namespaces("c")
    ops1, ops2 = await namespaces("ops1"), await namespaces("ops2")
    name = (await make_policy({
        "nodeSelector": NO_NODES, "slicing": MEMORY,
        "tenants": [{"namespace": a, "maxSlices": 1}, {"namespace": b}], "adminAccess": {"namespaces": [ops1]},
    }))["metadata"]["name"]
    await wait_for(lambda: get_or_none(kube, f"/api/v1/namespaces/{a}/resourcequotas/gpuslice-{name}"), what="quota in a")
    await wait_for(lambda: get_or_none(kube, template_path(b)), what="template in b")

    async def label(ns: str) -> str | None:
        return (await kube.get(f"/api/v1/namespaces/{ns}"))["metadata"].get("labels", {}).get(ADMIN_LABEL)

    await wait_for(lambda: label(ops1), what="label on ops1")

    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {
        "tenants": [{"namespace": b, "maxSlices": 3}, {"namespace": c}], "adminAccess": {"namespaces": [ops2]},
    }})
    await wait_for(lambda: absent(kube, template_path(a)), what="template in a to go")
    await wait_for(lambda: absent(kube, f"/api/v1/namespaces/{a}/resourcequotas/gpuslice-{name}"), what="quota in a to go")
    await wait_for(lambda: get_or_none(kube, template_path(c)), what="template in c")
    quota = await wait_for(lambda: get_or_none(kube, f"/api/v1/namespaces/{b}/resourcequotas/gpuslice-{name}"),
                           what="quota in b")
    assert list(quota["spec"]["hard"].values()) == ["3"]
    await wait_for(lambda: label(ops2), what="label on ops2")

    async def unlabelled() -> bool:
        ns = await kube.get(f"/api/v1/namespaces/{ops1}")
        return ADMIN_LABEL not in ns["metadata"].get("labels", {}) and "gpuslice.dev/admin-access-for" not in (
            ns["metadata"].get("annotations") or {})

    await wait_for(unlabelled, what="gpuslice's label and annotation to leave ops1")


async def test_namespace_created_later_gets_its_objects(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]], unique: str,
) -> None:
    late = f"late-{unique}"
    name = (await make_policy({"nodeSelector": NO_NODES, "slicing": MEMORY,
                               "tenants": [{"namespace": late, "maxSlices": 4}]}))["metadata"]["name"]
    await reconciled(kube, name)
    assert await absent(kube, template_path(late))
    assert await namespaces("late") == late
    await wait_for(lambda: get_or_none(kube, template_path(late)), within=15, what="the template once the namespace exists")
    await wait_for(lambda: get_or_none(kube, f"/api/v1/namespaces/{late}/resourcequotas/gpuslice-{name}"), what="quota")


async def test_deletion_waits_for_claims_then_cleans_up(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, cluster_objects: ClusterObjects,
    namespaces: Callable[..., Awaitable[str]], unique: str,
) -> None:
    tenant, ops = await namespaces("tenant"), await namespaces("ops")
    # Devices published by hand, as gpu-node-1's agent would (none runs there): in its own pool, which
    # the policy selects (its devices are allocated on the nodes it selects only).
    policy = await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": "gpu-node-1"}},
                                "slicing": MEMORY, "tenants": [{"namespace": tenant}],
                                "adminAccess": {"namespaces": [ops]}})
    name = policy["metadata"]["name"]
    for item in policy_devices("gpu-node-1", "gpu-node-1", name, 2):
        await cluster_objects.create(f"{RESOURCE}/resourceslices", item)
    await wait_for(lambda: get_or_none(kube, template_path(tenant)), what="template")

    async def pod_allocated() -> bool:
        with contextlib.suppress(KubeError):  # the tenancy policy may still be loading, or the pod exists
            await kube.create(f"/api/v1/namespaces/{tenant}/pods", pod_with_claim("worker", "gpu-slice"))
        found = await pod_claim(kube, tenant, "worker")
        return bool(found and (found.get("status") or {}).get("allocation"))

    await wait_for(pod_allocated, within=60, what="the tenant pod's claim to be allocated")
    body = await wait_for(lambda: _with_allocated(kube, name), within=45, what="status to count the allocation")
    assert body["status"]["tenants"] == [{"namespace": tenant, "allocated": 1, "allocatedBytes": 10 * 1024**3,
                                          "kinds": [{"kind": "slice", "allocated": 1}]}]

    await kube.delete(f"{POLICIES}/{name}")

    async def waiting() -> dict[str, Any] | None:
        body = await kube.get(f"{POLICIES}/{name}")
        return body if condition(body, "Ready").get("reason") == "Deleting" else None

    body = await wait_for(waiting, what="the policy to report what it waits for")
    claim = await pod_claim(kube, tenant, "worker")
    assert claim is not None
    assert body["status"]["holdingClaims"] == [f"{tenant}/{claim['metadata']['name']}"]
    assert await get_or_none(kube, f"{RESOURCE}/deviceclasses/{name}.gpuslice.dev") is not None
    await handler_retried(controller, name, "policy_deleted")  # it looked again, and still waits
    assert await get_or_none(kube, f"{POLICIES}/{name}") is not None, "deletion must wait while a claim holds a device"

    await kube.delete(f"/api/v1/namespaces/{tenant}/pods/worker", gracePeriodSeconds=0)

    async def agents_awaited() -> dict[str, Any] | None:
        body = await kube.get(f"{POLICIES}/{name}")
        return body if "node agents of 1 nodes" in condition(body, "Ready").get("message", "") else None

    # Then for its devices to go (no agent publishes these: the test removes them, as an agent would).
    body = await wait_for(agents_awaited, within=60, what="the policy to wait for its devices once the claim is gone")
    assert "remove this policy's devices: gpu-node-1." in condition(body, "Ready")["message"]
    await handler_retried(controller, name, "policy_deleted")
    assert await get_or_none(kube, f"{POLICIES}/{name}") is not None, "deletion must wait while devices are published"
    await cluster_objects.delete_all()
    await wait_for(lambda: absent(kube, f"{POLICIES}/{name}"), within=60, what="the policy to go once its devices are gone")
    await wait_for(lambda: absent(kube, f"{RESOURCE}/deviceclasses/{name}.gpuslice.dev"), within=60,
                   what="garbage collection of the DeviceClass")
    await wait_for(lambda: absent(kube, template_path(tenant)), within=60, what="garbage collection of the template")
    ns = await kube.get(f"/api/v1/namespaces/{ops}")
    assert ADMIN_LABEL not in ns["metadata"].get("labels", {})


async def _with_allocated(kube: KubeClient, name: str) -> dict[str, Any] | None:
    body = await kube.get(f"{POLICIES}/{name}")
    slices = (body.get("status") or {}).get("slices") or {}
    return body if slices.get("allocated") == 1 and slices.get("published") == 2 else None


async def test_taints_make_no_device_taint_rules_and_old_rules_are_pruned(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, cluster_objects: ClusterObjects,
    unique: str,
) -> None:
    """A policy's taints travel on the devices its agents publish (tests/cluster/agent); the
    controller makes no DeviceTaintRule, and removes one an earlier version made."""
    name = f"p-{unique}"
    for item in policy_devices(f"pool-{unique}", "gpu-node-2", name, 2):
        await cluster_objects.create(f"{RESOURCE}/resourceslices", item)
    policy = await make_policy({"nodeSelector": NO_NODES, "slicing": MEMORY,
                                "taints": [{"key": "gpuslice.dev/maintenance", "value": "planned",
                                            "effect": "NoSchedule"}]})
    selector = f"gpuslice.dev/policy={name}"
    legacy = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
              "metadata": {"name": f"gpuslice-{name}-legacy", "labels": {"gpuslice.dev/policy": name,
                                                                         "app.kubernetes.io/managed-by": "gpuslice"},
                           "ownerReferences": [{"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
                                                "name": name, "uid": policy["metadata"]["uid"]}]},
              "spec": {"deviceSelector": {"driver": "gpu.gpuslice.dev", "pool": f"pool-{unique}",
                                          "device": "gpu-0-10gi-0"},
                       "taint": {"key": "gpuslice.dev/maintenance", "value": "planned", "effect": "NoSchedule"}}}
    await kube.create(f"{RESOURCE}/devicetaintrules", legacy)
    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"taints": [
        {"key": "gpuslice.dev/maintenance", "value": "planned", "effect": "NoExecute"}]}})

    async def none_left() -> bool:
        return not await kube.list(f"{RESOURCE}/devicetaintrules", labelSelector=selector)

    await wait_for(none_left, within=60, what="the DeviceTaintRule of an earlier version to be pruned")
    await reconciled(kube, name)  # the reconcile of the tainted spec is over, status written last
    assert await none_left(), "a tainted policy must not get DeviceTaintRules"


async def test_restart_mid_reconcile_converges_without_duplicates_or_writes(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    tenants = [await namespaces(f"r{i}") for i in range(12)]
    name = (await make_policy({"nodeSelector": NO_NODES, "slicing": MEMORY,
                               "tenants": [{"namespace": ns, "maxSlices": 2} for ns in tenants]}))["metadata"]["name"]
    await wait_for(lambda: get_or_none(kube, template_path(tenants[0])), what="the first template")
    await controller.restart(signal.SIGKILL)  # mid-reconcile: some templates exist, some do not yet

    selector = f"gpuslice.dev/policy={name}"

    async def complete() -> bool:
        templates = await kube.list(f"{RESOURCE}/resourceclaimtemplates", labelSelector=selector)
        quotas = await kube.list("/api/v1/resourcequotas", labelSelector=selector)
        return len(templates) == 12 and len(quotas) == 12

    await wait_for(complete, within=60, what="all 12 templates and quotas after the restart")
    await reconciled(kube, name)

    async def versions() -> dict[str, str]:
        found = {}
        for path in (f"{RESOURCE}/resourceclaimtemplates", "/api/v1/resourcequotas", f"{RESOURCE}/deviceclasses"):
            for item in await kube.list(path, labelSelector=selector):
                meta = item["metadata"]
                found[f"{path}/{meta.get('namespace', '')}/{meta['name']}"] = meta["resourceVersion"]
        return found

    async def quotas_counted() -> bool:
        # The quota controller's first status write bumps each quota's resourceVersion; wait it out.
        quotas = await kube.list("/api/v1/resourcequotas", labelSelector=selector)
        return all(q.get("status", {}).get("hard") == q["spec"]["hard"] for q in quotas)

    await wait_for(quotas_counted, within=60, what="the quota controller to count every quota")
    before = await versions()
    assert len(before) == 12 + 12 + 1
    await controller.restart()
    # The restarted controller resumes the policy from its initial listing; a policy created
    # after it is up proves that listing has been handled.
    probe = (await make_policy({"nodeSelector": NO_NODES, "slicing": MEMORY}, suffix="-probe"))["metadata"]["name"]
    await reconciled(kube, probe)
    await reconciled_again(controller, name, since=0)  # this copy of the controller has looked at it
    assert await versions() == before, "a restarted controller must not rewrite objects that are already right"


async def test_a_policy_deleted_before_the_controller_saw_it_leaves_nothing_behind(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, unique: str,
) -> None:
    """Created and deleted while the controller was frozen, the policy never got the finalizer
    that makes Kopf stop its timers: they must not converge its objects again, ever."""
    name = f"p-{unique}-gone"
    body = {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": name},
            "spec": {"nodeSelector": NO_NODES, "slicing": MEMORY}}
    controller.pause()
    try:
        await kube.create(POLICIES, body)
        await kube.delete(f"{POLICIES}/{name}")
    finally:
        controller.resume()
    # A policy made after it proves the controller has handled the events before it; its status
    # timer's first tick (status_interval, 10 s) comes after the gone one's would have converged.
    probe = (await make_policy({"nodeSelector": NO_NODES, "slicing": MEMORY}, suffix="-probe"))["metadata"]["name"]
    await reconciled(kube, probe)
    await reconciled_again(controller, probe, "status", since=0)
    said = [e for e in log_entries(controller.log_text()) if e.get("policy") == name]
    assert said == [], f"the controller acted on a policy that is gone: {said[:3]}"
    assert await absent(kube, f"{RESOURCE}/deviceclasses/{name}.gpuslice.dev")
