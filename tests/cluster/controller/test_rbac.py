"""The controller's own identity can write only what it owns: RBAC where names are fixed, the
admission policy gpuslice-controller-writes where they vary per policy."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import RESOURCE, ClusterObjects, device_class
from tests.cluster.operator_fixtures import ControllerProcess

VAP = "/apis/admissionregistration.k8s.io/v1"
OURS = {"app.kubernetes.io/managed-by": "gpuslice", "gpuslice.dev/policy": "p"}


@pytest.fixture
async def as_controller(controller: ControllerProcess, controller_kubeconfig: Path) -> AsyncIterator[KubeClient]:
    async with await KubeClient.from_kubeconfig(controller_kubeconfig) as client:
        yield client


async def refused(call: Awaitable[Any], *words: str) -> KubeError:
    with pytest.raises(KubeError) as error:
        await call
    assert error.value.status in (403, 422), error.value
    for word in words:
        assert word in error.value.message, error.value.message
    return error.value


async def test_no_admission_policy_can_be_touched(as_controller: KubeClient, agent_rbac: None) -> None:
    for name in ("gpuslice-agent-own-node", "gpuslice-tenancy", "gpuslice-admin-access-label"):
        await refused(as_controller.delete(f"{VAP}/validatingadmissionpolicies/{name}"), "forbidden")
        await refused(as_controller.delete(f"{VAP}/validatingadmissionpolicybindings/{name}"), "forbidden")
    await refused(as_controller.create(f"{VAP}/validatingadmissionpolicies", {
        "metadata": {"name": "sneaky"}, "spec": {"validations": [{"expression": "true"}]}}), "forbidden")


async def test_only_gpuslices_own_device_classes_quotas_and_templates(
    as_controller: KubeClient, cluster_objects: ClusterObjects, namespaces: Callable[..., Awaitable[str]],
    unique: str,
) -> None:
    vendor = await cluster_objects.create(f"{RESOURCE}/deviceclasses", device_class(f"vendor-{unique}", "gpu.example.com"))
    path = f"{RESOURCE}/deviceclasses/vendor-{unique}"
    taken = {**vendor, "metadata": {"name": vendor["metadata"]["name"], "labels": OURS}}
    await refused(as_controller.apply(path, taken, field_manager="gpuslice-controller"), "may write only objects labelled")
    await refused(as_controller.delete(path), "may write only objects labelled")
    await refused(as_controller.create(f"{RESOURCE}/deviceclasses", device_class(f"{unique}.gpuslice.dev", "x.example.com")),
                  "may write only objects labelled")
    named = device_class(f"vendor-{unique}-2", "gpu.example.com")
    named["metadata"]["labels"] = OURS
    await refused(as_controller.create(f"{RESOURCE}/deviceclasses", named), "may write only its own names")

    ns = await namespaces("others")
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "team-quota"},
             "spec": {"hard": {"pods": "10"}}}
    await refused(as_controller.create(f"/api/v1/namespaces/{ns}/resourcequotas", quota), "may write only objects labelled")
    quota["metadata"]["labels"] = OURS
    await refused(as_controller.create(f"/api/v1/namespaces/{ns}/resourcequotas", quota), "may write only its own names")


async def test_namespaces_only_in_the_admin_access_tenancy_and_memory_limit_labels(
    as_controller: KubeClient, namespaces: Callable[..., Awaitable[str]],
) -> None:
    ns = await namespaces("labels")
    await refused(as_controller.merge_patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {"team": "x"}}}),
                  "may change only the labels resource.kubernetes.io/admin-access and gpuslice.dev/tenancy and"
                  f" gpuslice.dev/memory-limit of namespace {ns}")
    await refused(as_controller.merge_patch(f"/api/v1/namespaces/{ns}", {"metadata": {"annotations": {"a": "b"}}}),
                  "may change only the labels")
    for label, value in (("resource.kubernetes.io/admin-access", "true"), ("gpuslice.dev/tenancy", "judged"),
                         ("gpuslice.dev/memory-limit", "judged")):
        await as_controller.merge_patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {label: value}}})
        await as_controller.merge_patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {label: None}}})
    await refused(as_controller.delete(f"/api/v1/namespaces/{ns}"), "forbidden")


async def test_claims_only_as_a_dry_run_in_its_own_namespace(
    as_controller: KubeClient, namespaces: Callable[..., Awaitable[str]],
) -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"generateName": "probe-"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "other.example.com"}}]}}}
    own = f"{RESOURCE}/namespaces/gpuslice-system/resourceclaims"
    await as_controller.request("POST", own, claim, query={"dryRun": "All"})
    await refused(as_controller.create(own, claim), "may create ResourceClaims only as a dry run")
    ns = await namespaces("claims")
    await refused(as_controller.request("POST", f"{RESOURCE}/namespaces/{ns}/resourceclaims", claim,
                                        query={"dryRun": "All"}), "forbidden")
    event = {"metadata": {"generateName": "e-"}, "involvedObject": {"kind": "Pod", "name": "x", "namespace": ns},
             "reason": "X", "message": "x"}
    await refused(as_controller.create(f"/api/v1/namespaces/{ns}/events", event), "forbidden")
    await refused(as_controller.list(f"/api/v1/namespaces/{ns}/secrets"), "forbidden")


async def test_secrets_only_the_webhooks_two(as_controller: KubeClient) -> None:
    """RBAC cannot name an object for create: gpuslice-controller-writes lets the controller make
    only the maxMemory webhook's CA and serving certificate, and only in its own namespace."""
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "stolen"}, "data": {}}
    await refused(as_controller.create("/api/v1/namespaces/gpuslice-system/secrets", secret,
                                       dryRun="All"), "may write only the Secrets of the maxMemory webhook")
    await refused(as_controller.create("/api/v1/namespaces/default/secrets", secret, dryRun="All"), "forbidden")
    await refused(as_controller.get("/api/v1/namespaces/gpuslice-system/secrets/other"), "forbidden")


@pytest.fixture
async def as_webhook(memory_webhook: Any) -> AsyncIterator[KubeClient]:
    async with await KubeClient.from_kubeconfig(memory_webhook.kubeconfig) as client:
        yield client


async def test_the_webhook_writes_only_the_charges_and_reads_only_its_certificate(
    as_webhook: KubeClient, kube: KubeClient, make_policy: Any, namespace: str,
) -> None:
    """The webhook's identity: its ledgers' status (the charges) and nothing else; not their spec
    (the limit), no Secret but its serving certificate (not the CA's key), no policy, no claim."""
    name = (await make_policy({"nodeSelector": {"matchLabels": {"gpuslice.dev/no-such-node": "true"}},
                               "slicing": {"mode": "shared", "sliceSize": "1Gi"},
                               "tenants": [{"namespace": namespace, "maxMemory": "4Gi"}]}))["metadata"]["name"]
    ledgers = "/apis/gpuslice.dev/v1alpha1/namespaces/gpuslice-system/gpusliceledgers"

    async def ledger() -> dict[str, Any] | None:
        try:
            return await kube.get(f"{ledgers}/{name}.{namespace}")
        except KubeError:
            return None

    from tests.cluster.kubeutil import wait_for

    found = await wait_for(ledger, within=30, what="the tenant's ledger")
    raised = {**found, "spec": {**found["spec"], "limitBytes": 2**40}}
    await refused(as_webhook.replace(f"{ledgers}/{name}.{namespace}", raised), "forbidden")
    await refused(as_webhook.delete(f"{ledgers}/{name}.{namespace}"), "forbidden")
    await as_webhook.get("/api/v1/namespaces/gpuslice-system/secrets/gpuslice-webhook-tls")
    await refused(as_webhook.get("/api/v1/namespaces/gpuslice-system/secrets/gpuslice-webhook-ca"), "forbidden")
    await refused(as_webhook.merge_patch(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{name}",
                                         {"spec": {"tenants": []}}), "forbidden")
    await refused(as_webhook.delete(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/any"), "forbidden")


async def test_evictions_and_pod_events_only_in_namespaces_a_policy_names(
    as_controller: KubeClient, kube: KubeClient, namespaces: Callable[..., Awaitable[str]],
) -> None:
    """Defragmentation gave the controller evictions and Events everywhere by RBAC; the admission
    policy keeps both to the namespaces a policy names (labelled gpuslice.dev/tenancy=judged)."""
    outside = await namespaces("outside")
    await kube.create(f"/api/v1/namespaces/{outside}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bystander"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "bystander", "namespace": outside},
                "deleteOptions": {"dryRun": ["All"]}}
    await refused(as_controller.create(f"/api/v1/namespaces/{outside}/pods/bystander/eviction", eviction),
                  "may evict pods only in the namespaces a policy names")
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "sneaky", "namespace": outside},
             "involvedObject": {"kind": "Pod", "name": "bystander", "namespace": outside},
             "reason": "X", "message": "x", "type": "Normal"}
    await refused(as_controller.create(f"/api/v1/namespaces/{outside}/events", event), "may post Events only")
    assert (await kube.get(f"/api/v1/namespaces/{outside}/pods/bystander"))["metadata"].get("deletionTimestamp") is None
