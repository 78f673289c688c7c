"""gpuslice never judges, and never refuses, what it does not own: another DRA driver's claims and
allocations pass none of gpuslice's admission rules, with gpuslice running, with its CRD deleted
under a running controller, and with its CRD gone while the controller was away.

A control plane of its own (its CRD is deleted here), with the controller as its own process
under its ServiceAccount, one fake node, and a second driver made by hand: a DeviceClass, a
ResourceSlice of four devices, claims and pods that the real scheduler allocates.
"""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.agent.drain import DRAINING
from gpuslice.agent.drain import LABEL as DRAIN_LIST
from gpuslice.devcluster.cluster import ClusterSpec, DevCluster
from gpuslice.kube.client import KubeClient, KubeError, NotFound
from gpuslice.planning.cluster.admission import static_manifests
from tests.cluster.kubeutil import POLICIES, create_namespace, dev_cluster, wait_for
from tests.cluster.operator_fixtures import (
    ADMISSION,
    MANIFESTS,
    ControllerProcess,
    apply_manifests,
    write_controller_kubeconfig,
)

CRD = Path(__file__).resolve().parents[3] / "crds" / "gpuslicepolicies.gpuslice.dev.yaml"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gpuslicepolicies.gpuslice.dev"
RESOURCE = "/apis/resource.k8s.io/v1"
ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"
OTHER_DRIVER = "nic.example.com"
NODE = "gpu-node-1"
TENANCY_LABEL = "gpuslice.dev/tenancy"


@pytest.fixture(scope="module")
async def scluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[DevCluster]:
    spec = ClusterSpec(tmp_path_factory.mktemp("scoped-admission"), nodes=1, gpus_per_node=2)
    async with dev_cluster(spec) as cluster:
        yield cluster


@pytest.fixture(scope="module")
async def skube(scluster: DevCluster) -> AsyncIterator[KubeClient]:
    async with await KubeClient.from_kubeconfig(scluster.kubeconfig) as client:
        yield client


async def install_crd(kube: KubeClient) -> None:
    await kube.apply(CRD_PATH, yaml.safe_load(CRD.read_text()), field_manager="gpuslice-tests")

    async def served() -> bool:
        try:
            listing = await kube.get("/apis/gpuslice.dev/v1alpha1")
        except NotFound:
            return False
        return any(r["name"] == "gpuslicepolicies" for r in listing.get("resources", []))

    await wait_for(served, within=60, what="the GpuSlicePolicy CRD to be served")


@pytest.fixture(scope="module")
async def installed(scluster: DevCluster, skube: KubeClient,
                    tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ControllerProcess]:
    """gpuslice as a user installs it (CRD, RBAC of both components, admission), and its controller."""
    await install_crd(skube)
    kubeconfig = await write_controller_kubeconfig(scluster, skube, tmp_path_factory.mktemp("scoped-controller"))
    await apply_manifests(skube, (MANIFESTS / "agent-rbac.yaml").read_text())
    await apply_manifests(skube, ADMISSION.read_text())
    controller = ControllerProcess(kubeconfig, tmp_path_factory.mktemp("scoped-log") / "controller.log")
    controller.start()
    await wait_for(lambda: _logged(controller, "controller started"), within=60, what="the controller to start")
    yield controller
    await controller.stop()


async def _logged(controller: ControllerProcess, text: str) -> bool:
    return text in controller.log_text()


@pytest.fixture(scope="module")
async def other_driver(skube: KubeClient) -> str:
    """A second DRA driver's class and devices on the node, as any vendor's driver would publish."""
    await skube.apply(f"{RESOURCE}/deviceclasses/{OTHER_DRIVER}", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": OTHER_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{OTHER_DRIVER}"'}}]},
    }, field_manager="gpuslice-tests")
    await skube.apply(f"{RESOURCE}/resourceslices/nic-{NODE}", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"nic-{NODE}"},
        "spec": {"driver": OTHER_DRIVER, "nodeName": NODE, "pool": {"name": NODE, "generation": 1,
                                                                    "resourceSliceCount": 1},
                 "devices": [{"name": f"nic-{i}"} for i in range(4)]},
    }, field_manager="gpuslice-tests")
    return OTHER_DRIVER


def _claim(name: str, device_class: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": device_class}}]}}}


async def allocated_to_a_pod(kube: KubeClient, namespace: str, device_class: str) -> dict[str, Any]:
    """Make a claim of ``device_class`` and a pod that uses it; the real scheduler allocates it and
    writes the allocation (which admission judges). Both are deleted afterwards."""
    name = f"c-{uuid.uuid4().hex[:6]}"
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", _claim(name, device_class))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"tolerations": [{"operator": "Exists"}],
                    "resourceClaims": [{"name": "dev", "resourceClaimName": name}],
                    "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "dev"}]}}]}}
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}"
    claim: dict[str, Any] = {}

    async def allocated() -> bool:
        nonlocal claim
        claim = await kube.get(path)
        return bool((claim.get("status") or {}).get("allocation"))

    try:
        await wait_for(allocated, within=60, what=f"the scheduler to allocate {namespace}/{name} ({device_class})")
    finally:
        with contextlib.suppress(KubeError):
            await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{name}", gracePeriodSeconds=0)
        with contextlib.suppress(KubeError):
            await kube.delete(path)
    return claim


async def refused(kube: KubeClient, namespace: str, device_class: str) -> str:
    try:
        await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
                          _claim(f"r-{uuid.uuid4().hex[:6]}", device_class), dryRun="All")
    except KubeError as error:
        return error.message
    raise AssertionError(f"a claim of {device_class} in {namespace} was admitted")


async def admitted(kube: KubeClient, namespace: str, device_class: str) -> bool:
    try:
        await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
                          _claim(f"a-{uuid.uuid4().hex[:6]}", device_class), dryRun="All")
    except KubeError:
        return False
    return True


async def labelled(kube: KubeClient, namespace: str) -> bool:
    labels = (await kube.get(f"/api/v1/namespaces/{namespace}"))["metadata"].get("labels") or {}
    return labels.get(TENANCY_LABEL) == "judged"


@pytest.fixture(scope="module")
async def tenant(skube: KubeClient, installed: ControllerProcess) -> str:
    return await create_namespace(skube, "scoped-tenant")


@pytest.fixture(scope="module")
async def stranger(skube: KubeClient, installed: ControllerProcess) -> str:
    return await create_namespace(skube, "scoped-stranger")


async def make_policy(kube: KubeClient, tenant: str) -> None:
    await kube.apply(f"{POLICIES}/scoped", {
        "apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": "scoped"},
        "spec": {"slicing": {"mode": "memory", "sliceSize": "10G"}, "tenants": [{"namespace": tenant}],
                 "claimTemplateName": "gpu-slice"},
    }, field_manager="gpuslice-tests")

    async def valid() -> bool:
        body = await kube.get(f"{POLICIES}/scoped")
        conditions = {c["type"]: c for c in (body.get("status") or {}).get("conditions") or []}
        return conditions.get("Valid", {}).get("status") == "True"

    await wait_for(valid, within=120, what="policy scoped to be Valid (its tenancy probe answered)")
    await wait_for(lambda: labelled(kube, tenant), within=30, what=f"{tenant} to be labelled")


def _documents(kind: str) -> dict[str, dict[str, Any]]:
    """gpuslice's admission objects of ``kind`` by name: the generated ones and the agent's."""
    found = [m for m in static_manifests() if m["kind"] == kind]
    found += [d for d in yaml.safe_load_all((MANIFESTS / "agent-rbac.yaml").read_text()) if d and d["kind"] == kind]
    return {d["metadata"]["name"]: d for d in found}


def _copy_of(name: str) -> list[dict[str, Any]]:
    """A copy of rule ``name`` with its scope (match constraints and conditions, parameter, binding)
    and one validation that always refuses, saying so: a request it refuses was evaluated by
    gpuslice's CEL beyond the match conditions, which are all gpuslice ever asks of others'."""
    rule = copy.deepcopy(_documents("ValidatingAdmissionPolicy")[name])
    rule["metadata"] = {"name": f"evaluated-{name}"}
    rule["spec"].pop("variables", None)
    rule["spec"]["validations"] = [{"expression": "false", "message": f"evaluated by a copy of {name}"}]
    binding = copy.deepcopy(_documents("ValidatingAdmissionPolicyBinding")[name])
    binding["metadata"] = {"name": f"evaluated-{name}"}
    binding["spec"]["policyName"] = f"evaluated-{name}"
    return [rule, binding]


def _path(doc: dict[str, Any]) -> str:
    kind = "validatingadmissionpolicies" if doc["kind"] == "ValidatingAdmissionPolicy" else (
        "validatingadmissionpolicybindings")
    return f"{ADMISSION_API}/{kind}/{doc['metadata']['name']}"


async def _message_of(attempt: Any) -> str:
    try:
        await attempt
    except KubeError as error:
        return error.message
    return ""


async def _allocate_gpuslice_device_by_hand(kube: KubeClient, namespace: str) -> str:
    """An allocation of one of gpuslice's devices written as the scheduler would (what the device-class
    and drain rules judge); the message it was refused with."""
    name = f"h-{uuid.uuid4().hex[:6]}"
    path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}"
    claim = await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", _claim(name, OTHER_DRIVER))
    claim["status"] = {"allocation": {"devices": {"results": [
        {"request": "a", "driver": "gpu.gpuslice.dev", "pool": NODE, "device": "gpu-0"}]}}}
    try:
        return await _message_of(kube.replace(f"{path}/status", claim))
    finally:
        with contextlib.suppress(KubeError):
            await kube.delete(path)


# For each rule that judges claims: where a gpuslice request it judges is made (its copy must refuse it).
JUDGES_CLAIMS = ("gpuslice-tenancy", "gpuslice-non-tenants", "gpuslice-device-classes", "gpuslice-drain")


async def test_other_drivers_claims_are_never_evaluated_by_gpuslices_rules(
        skube: KubeClient, installed: ControllerProcess, other_driver: str, tenant: str, stranger: str) -> None:
    """One rule at a time, with gpuslice's own bindings of those rules out of the way (so a refusal
    can only come from the copy): the copy refuses a gpuslice request it judges, and another
    driver's claims, made and allocated by the real scheduler in a tenant's namespace and in one no
    policy names, pass it."""
    await make_policy(skube, tenant)
    assert set(JUDGES_CLAIMS) <= set(_documents("ValidatingAdmissionPolicy")), "a rule was renamed"
    bindings = _documents("ValidatingAdmissionPolicyBinding")
    ours = {n: await skube.get(_path(bindings[n])) for n in JUDGES_CLAIMS}
    # The drain rule has parameters only while a node drains: one drain list, so its copy evaluates.
    draining = f"/api/v1/namespaces/gpuslice-system/configmaps/{DRAINING}{NODE}"
    await skube.apply(draining, {"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": f"{DRAINING}{NODE}", "namespace": "gpuslice-system",
                                              "labels": {DRAIN_LIST: "true"}},
                                 "data": {NODE: "gpu-9"}}, field_manager="gpuslice-tests")
    for binding in ours.values():
        await skube.delete(_path(binding))
    try:
        for name in JUDGES_CLAIMS:
            copies = _copy_of(name)
            for doc in copies:
                await skube.apply(_path(doc), doc, field_manager="gpuslice-tests")

            async def judged(name: str = name) -> bool:
                if name == "gpuslice-tenancy":
                    message = await _message_of(admitted_or_raise(skube, tenant, "scoped.gpuslice.dev"))
                elif name == "gpuslice-non-tenants":
                    message = await _message_of(admitted_or_raise(skube, stranger, "scoped.gpuslice.dev"))
                else:
                    message = await _allocate_gpuslice_device_by_hand(skube, tenant)
                return f"evaluated by a copy of {name}" in message

            try:
                await wait_for(judged, within=60, what=f"the copy of {name} to judge what its rule judges")
                for namespace in (tenant, stranger):
                    claim = await allocated_to_a_pod(skube, namespace, other_driver)
                    results = claim["status"]["allocation"]["devices"]["results"]
                    assert [r["driver"] for r in results] == [other_driver]
            finally:
                for doc in reversed(copies):
                    with contextlib.suppress(KubeError):
                        await skube.delete(_path(doc))
    finally:
        await skube.delete(draining)
        for name in JUDGES_CLAIMS:
            binding = {k: v for k, v in ours[name].items() if k != "status"}
            binding["metadata"] = {"name": name, "labels": ours[name]["metadata"].get("labels") or {}}
            await skube.apply(_path(binding), binding, field_manager="gpuslice-tests")
    # And with gpuslice's own rules back: the same, and the stranger refused gpuslice's class again.

    async def stranger_refused() -> bool:
        message = await _message_of(admitted_or_raise(skube, stranger, "scoped.gpuslice.dev"))
        return "is not a tenant of GpuSlicePolicy scoped" in message

    await wait_for(stranger_refused, within=30, what="gpuslice's own rules to be in force again")
    for namespace in (tenant, stranger):
        await allocated_to_a_pod(skube, namespace, other_driver)


async def admitted_or_raise(kube: KubeClient, namespace: str, device_class: str) -> None:
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
                      _claim(f"p-{uuid.uuid4().hex[:6]}", device_class), dryRun="All")


async def test_other_claims_keep_working_when_the_crd_is_deleted_under_the_controller(
        skube: KubeClient, installed: ControllerProcess, other_driver: str, tenant: str, stranger: str) -> None:
    await make_policy(skube, tenant)
    await skube.delete(CRD_PATH)

    # The controller deletes the policy as any deletion (its finalizer), and takes the tenancy label
    # off the namespaces only it named before it goes; then it waits for the CRD instead of exiting.
    await wait_for(lambda: crd_gone(skube), within=90, what="the CRD and its policies to be deleted")
    assert not await labelled(skube, tenant)
    await wait_for(lambda: _logged(installed, "is not served: waiting for it"), within=30,
                   what="the controller to say it waits for its CRD")
    assert installed.process is not None
    assert installed.process.poll() is None, "the controller exited when its CRD went"
    for namespace in (tenant, stranger):
        await allocated_to_a_pod(skube, namespace, other_driver)
        # gpuslice's own classes stay refused wherever no policy names the namespace.
        assert "is not a tenant of GpuSlicePolicy scoped" in await refused(skube, namespace, "scoped.gpuslice.dev")

    # The CRD back: the controller starts Kopf again, and the policy converges as new.
    await install_crd(skube)
    await make_policy(skube, tenant)
    assert await admitted(skube, tenant, other_driver)


async def test_a_controller_that_finds_no_crd_takes_the_tenancy_labels_off(
        scluster: DevCluster, skube: KubeClient, installed: ControllerProcess, other_driver: str, tenant: str,
        stranger: str) -> None:
    """The CRD deleted while the controller is away: its policies keep their finalizers and the CRD
    stays (terminating, still served), so the tenancy rule still judges and other claims pass. Only
    if someone then strips the finalizers does the CRD go with the label still on the tenant's
    namespace. An API server that starts without the CRD cannot configure the tenancy rule, which
    then refuses everything it matches: only in that labelled namespace, never elsewhere. The
    controller, once back, finds no CRD and takes the labels off."""
    await make_policy(skube, tenant)
    await installed.stop()
    await skube.delete(CRD_PATH)
    await wait_for(lambda: _terminating(skube), within=30, what="the CRD to be terminating")
    assert await admitted(skube, tenant, other_driver), "with its CRD terminating, gpuslice refused another driver"
    assert await labelled(skube, tenant)

    await skube.merge_patch(f"{POLICIES}/scoped", {"metadata": {"finalizers": None}})

    await wait_for(lambda: crd_gone(skube), within=60, what="the CRD to go once its policy's finalizer is stripped")
    await scluster.restart("kube-apiserver")
    # The rule with a parameter refuses all it matches, and it matches only the labelled namespace.
    await wait_for(lambda: _refused_for_configuration(skube, tenant), within=60,
                   what="the tenancy rule to refuse for want of its parameter kind")
    assert await admitted(skube, stranger, other_driver), "a namespace no policy names was refused"
    installed.start()
    await wait_for(lambda: admitted(skube, tenant, other_driver), within=60,
                   what="the controller to take the tenancy label off, and the other driver's claim admitted")
    assert not await labelled(skube, tenant)
    assert await labelled(skube, "gpuslice-system")
    await install_crd(skube)  # for whatever runs after


async def crd_gone(kube: KubeClient) -> bool:
    try:
        await kube.get(CRD_PATH)
    except NotFound:
        return True
    return False


async def _terminating(kube: KubeClient) -> bool:
    return bool((await kube.get(CRD_PATH))["metadata"].get("deletionTimestamp"))


async def _refused_for_configuration(kube: KubeClient, namespace: str) -> bool:
    try:
        message = await refused(kube, namespace, OTHER_DRIVER)
    except AssertionError:
        return False
    return "gpuslice-tenancy" in message and "failed to configure" in message


async def test_other_drivers_claims_never_wait_on_the_memory_webhook(
        skube: KubeClient, installed: ControllerProcess, other_driver: str) -> None:
    """The maxMemory webhook fails closed for what it judges, so it must judge nothing else: with its
    configuration pointing at a port where nobody answers (a webhook that is down), another driver's
    claims are made and allocated in a namespace labelled as a maxMemory tenant, while the control (the
    controller's probe, which reaches it) is refused for the failed call."""
    from gpuslice.devcluster.ports import free_port
    from gpuslice.planning.cluster.memory_rule import memory_webhook

    namespace = await create_namespace(skube, "scoped-memory")
    down = memory_webhook(url=f"https://127.0.0.1:{free_port()}/validate/maxmemory")
    await skube.apply(f"{ADMISSION_API}/validatingwebhookconfigurations/gpuslice-memory", down,
                      field_manager="gpuslice-tests")
    await skube.apply(f"{POLICIES}/scoped-memory", {
        "apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": "scoped-memory"},
        "spec": {"slicing": {"mode": "memory", "sliceSize": "10G"}, "claimTemplateName": "gpu-slice-m",
                 "tenants": [{"namespace": namespace, "maxMemory": "30Gi"}]}}, field_manager="gpuslice-tests")
    try:
        async def routed() -> bool:
            labels = (await skube.get(f"/api/v1/namespaces/{namespace}"))["metadata"].get("labels") or {}
            return labels.get("gpuslice.dev/memory-limit") == "judged"

        await wait_for(routed, within=60, what=f"{namespace} to be labelled as a maxMemory tenant")
        probe = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"generateName": "gpuslice-memory-probe-"},
                 "spec": {"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "probe.invalid"}}]}}}

        async def reaches_it() -> bool:
            message = await _message_of(skube.create(f"{RESOURCE}/namespaces/gpuslice-system/resourceclaims", probe,
                                                     dryRun="All"))
            return 'failed calling webhook "maxmemory.gpuslice.dev"' in message

        await wait_for(reaches_it, within=30, what="the webhook configuration to be in force (and down)")
        claim = await allocated_to_a_pod(skube, namespace, other_driver)
        assert [r["driver"] for r in claim["status"]["allocation"]["devices"]["results"]] == [other_driver]
    finally:
        with contextlib.suppress(KubeError):
            await skube.delete(f"{ADMISSION_API}/validatingwebhookconfigurations/gpuslice-memory")
        with contextlib.suppress(KubeError):
            await skube.delete(f"{POLICIES}/scoped-memory")
