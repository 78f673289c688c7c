"""gpuslice installed into a namespace other than gpuslice-system (issue 41), on the real API
server: the chart's CRDs, RBAC and admission policies as `helm template -n <ns>` renders them, and
the controller as its own process under its ServiceAccount there, told its namespace as the chart's
pod tells it (GPUSLICE_NAMESPACE). A policy converges, its agent view is written there and nowhere
else, the rendered CEL rules admit its tenants' claims and refuse one in gpuslice's namespace, and
that namespace, not gpuslice-system, is the one no policy may name as a tenant.

A control plane of its own (the install is cluster-wide: CRDs, admission policies), one fake node.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.devcluster.cluster import ClusterSpec, DevCluster
from gpuslice.kube.client import KubeClient, KubeError, NotFound
from tests.builders import policy
from tests.cluster.kubeutil import POLICIES, create_namespace, dev_cluster, wait_for
from tests.cluster.operator_fixtures import (
    ControllerProcess,
    admin_label_guarded,
    apply_manifests,
    write_controller_kubeconfig,
)
from tests.hacktools import hack_tool

CHART = Path(__file__).resolve().parents[3] / "charts" / "gpuslice"
RESOURCE = "/apis/resource.k8s.io/v1"
VIEWS = "/apis/gpuslice.dev/v1alpha1/namespaces/{}/gpusliceagentviews"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{}/leases"
DEFAULT = "gpuslice-system"
NAMESPACE = f"gpu-ops-{uuid.uuid4().hex[:6]}"
# What an install's namespace needs (docs/install.md, "Another namespace").
LABELS = {"pod-security.kubernetes.io/enforce": "privileged", "gpuslice.dev/tenancy": "judged"}
# Of the chart, what a cluster without pods needs: the controller runs here as a process, not a pod.
INSTALLED = {"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
             "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
# The setting the chart's pod gives the controller from the Downward API.
CONTROLLER_ENV = {"GPUSLICE_NAMESPACE": NAMESPACE}


def rendered(namespace: str) -> list[dict[str, Any]]:
    """The chart's objects of the kinds INSTALLED, as `helm template -n namespace` renders them (no hooks)."""
    done = subprocess.run([hack_tool("helm"), "template", "gpuslice", str(CHART), "--namespace", namespace],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout)
            if d and d["kind"] in INSTALLED and "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]


@pytest.fixture(scope="module")
async def ncluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[DevCluster]:
    spec = ClusterSpec(tmp_path_factory.mktemp("another-namespace"), nodes=1, gpus_per_node=2)
    async with dev_cluster(spec) as cluster:
        yield cluster


@pytest.fixture(scope="module")
async def nkube(ncluster: DevCluster) -> AsyncIterator[KubeClient]:
    async with await KubeClient.from_kubeconfig(ncluster.kubeconfig) as client:
        yield client


@pytest.fixture(scope="module")
async def installed(ncluster: DevCluster, nkube: KubeClient,
                    tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ControllerProcess]:
    """The chart rendered for NAMESPACE, applied as Helm would (CRDs first), and the controller under
    its ServiceAccount there. gpuslice-system exists too, as an ordinary namespace."""
    await create_namespace(nkube, NAMESPACE, LABELS)
    await create_namespace(nkube, DEFAULT)
    objects = rendered(NAMESPACE)
    crds = [d for d in objects if d["kind"] == "CustomResourceDefinition"]
    await apply_manifests(nkube, yaml.safe_dump_all(crds))

    async def served() -> bool:
        try:
            listing = await nkube.get("/apis/gpuslice.dev/v1alpha1")
        except NotFound:
            return False
        return {r["name"] for r in listing.get("resources", [])} >= {
            "gpuslicepolicies", "gpusliceledgers", "gpusliceagentviews"}

    await wait_for(served, within=60, what="the chart's CRDs to be served")
    rbac = [d for d in objects if d["kind"] not in ("CustomResourceDefinition", "ValidatingAdmissionPolicy",
                                                     "ValidatingAdmissionPolicyBinding")]
    kubeconfig = await write_controller_kubeconfig(ncluster, nkube, tmp_path_factory.mktemp("ns-controller"),
                                                   rbac=yaml.safe_dump_all(rbac), namespace=NAMESPACE)
    await apply_manifests(nkube, yaml.safe_dump_all(
        [d for d in objects if d["kind"].startswith("ValidatingAdmissionPolicy")]))
    await admin_label_guarded(nkube)
    controller = ControllerProcess(kubeconfig, tmp_path_factory.mktemp("ns-log") / "controller.log", CONTROLLER_ENV)
    controller.start()

    async def started() -> bool:
        assert controller.process is not None
        assert controller.process.poll() is None, controller.log_text()[-3000:]
        return "controller started" in controller.log_text()

    await wait_for(started, within=60, what="the controller to start")
    yield controller
    await controller.stop()


@pytest.fixture(scope="module")
async def tenant(nkube: KubeClient, installed: ControllerProcess) -> str:
    return await create_namespace(nkube, f"team-{uuid.uuid4().hex[:6]}")


def _claim(device_class: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"c-{uuid.uuid4().hex[:6]}"},
            "spec": {"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": device_class}}]}}}


async def refusal(kube: KubeClient, namespace: str, device_class: str) -> str | None:
    """The message a claim of ``device_class`` in ``namespace`` is refused with (a dry run); None: admitted."""
    try:
        await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", _claim(device_class), dryRun="All")
    except KubeError as error:
        return error.message
    return None


async def conditions(kube: KubeClient, name: str) -> tuple[int, dict[str, dict[str, Any]]]:
    body = await kube.get(f"{POLICIES}/{name}")
    found = {c["type"]: c for c in (body.get("status") or {}).get("conditions") or []}
    return int(body["metadata"]["generation"]), found


async def converged(kube: KubeClient, name: str, tenants: list[str]) -> None:
    """Policy ``name`` of ``tenants`` made, and Valid at its generation (the controller's tenancy probe,
    a claim in its own namespace, was refused by the rendered rule)."""
    body = policy(name, {"mode": "memory", "sliceSize": "10G"}, None, tenants=tenants,
                  claimTemplateName=f"{name}-slice")
    body["metadata"] = {"name": name}
    await kube.create(POLICIES, body)

    async def valid() -> bool:
        generation, found = await conditions(kube, name)
        valid = found.get("Valid", {})
        return valid.get("status") == "True" and valid.get("observedGeneration") == generation

    await wait_for(valid, within=120, what=f"policy {name} to be Valid at its generation")


async def test_a_policy_converges_with_its_view_and_lease_in_gpuslices_namespace(
        nkube: KubeClient, installed: ControllerProcess, tenant: str) -> None:
    await converged(nkube, "elsewhere", [tenant])

    async def viewed() -> bool:
        return [v["metadata"]["name"] for v in await nkube.list(VIEWS.format(NAMESPACE))] == ["elsewhere"]

    await wait_for(viewed, within=30, what=f"the policy's agent view in {NAMESPACE}")
    assert await nkube.list(VIEWS.format(DEFAULT)) == []
    assert [lease["metadata"]["name"] for lease in await nkube.list(LEASES.format(NAMESPACE))]
    assert await nkube.list(LEASES.format(DEFAULT)) == []


async def test_the_rendered_rules_admit_tenants_and_refuse_gpuslices_namespace(
        nkube: KubeClient, installed: ControllerProcess, tenant: str) -> None:
    await converged(nkube, "judged", [tenant])
    klass = "judged.gpuslice.dev"
    assert await refusal(nkube, tenant, klass) is None
    refused = await refusal(nkube, NAMESPACE, klass)
    assert "gpuslice-tenancy" in (refused or "admitted"), refused
    # A namespace no policy names is refused too (gpuslice-system now among them).
    refused = await refusal(nkube, DEFAULT, klass)
    assert "is not a tenant" in (refused or "admitted"), refused


async def test_gpuslices_namespace_is_the_one_no_policy_may_name(
        nkube: KubeClient, installed: ControllerProcess, tenant: str) -> None:
    body = policy("own", {"mode": "memory", "sliceSize": "10G"}, None, tenants=[NAMESPACE],
                  claimTemplateName="gpu-slice-own")
    body["metadata"] = {"name": "own"}
    with pytest.raises(KubeError) as refused:
        await nkube.create(POLICIES, body)
    assert f"{NAMESPACE} is gpuslice's own namespace and cannot be a tenant" in refused.value.message
    # gpuslice-system is an ordinary namespace here: a policy may name it, and its claims are admitted.
    await converged(nkube, "ordinary", [DEFAULT])
    assert await refusal(nkube, DEFAULT, "ordinary.gpuslice.dev") is None
