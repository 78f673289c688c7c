"""docs/tenants.md, applied: every example gets the device it says, every denial reads as the page says.

The page's names (policies inference, notebooks, training; namespaces team-a, team-b, team-c,
gpu-monitoring, data-science, ml-research; example.com/gpu-slice) become this test's own, the
example policies are pinned to this test's fake nodes, and nothing else of the page changes.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.kube.paths import collection
from tests.cluster.cli import Cli
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import RESOURCE, get_or_none, policy_ready, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import published

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "tenants.md"
MARKED = re.compile(r"<!-- (example|denial|why): ([a-z0-9-]+) -->\n```(?:yaml|text)\n(.*?)```", re.S)
EXAMPLES = {"memory-pod", "memory-deployment", "full-gpu-pod", "shared-template", "shared-deployment", "mig-pod",
            "extended-deployment", "budget-claim"}
DENIALS = {"not-a-tenant", "over-the-limit", "admin-access", "admin-access-label", "over-max-memory",
           "max-memory-too-large"}
# What kubectl adds to the API server's message: a prefix, or (for Invalid) its own wording of the object.
KUBECTL_PREFIX = re.compile(r'^(Error from server \(Forbidden\): (error when creating "claim.yaml": )?|The \w+ )')
INVALID = re.compile(r'^[\w.]+ ("[^"]+" is invalid: )')
Namespaces = Callable[..., Awaitable[str]]


def blocks(kind: str) -> dict[str, str]:
    return {name: body for k, name, body in MARKED.findall(GUIDE.read_text()) if k == kind}


def test_every_example_and_denial_of_the_guide_is_tested() -> None:
    assert set(blocks("example")) == EXAMPLES
    assert set(blocks("denial")) == DENIALS
    assert set(blocks("why")) == {"over-the-limit"}


class Names:
    """The page's names, and this test's."""

    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    def __call__(self, text: str) -> str:
        words = "|".join(re.escape(w) for w in sorted(self.mapping, key=len, reverse=True))
        return re.sub(rf"(?<!\w)({words})(?!\w)", lambda m: self.mapping[m.group(1)], text)


def example_policy(file: str, node: str, names: Names) -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples" / "policies" / file).read_text())
    spec = yaml.safe_load(names(yaml.safe_dump(body["spec"])))
    spec["nodeSelector"] = {"matchLabels": {"kubernetes.io/hostname": node}}
    spec.pop("taints", None)  # training-mig.yaml's maintenance taint would keep every device off
    return spec


async def apply_example(kube: KubeClient, namespace: str, name: str, names: Names) -> dict[str, Any]:
    body = yaml.safe_load(names(blocks("example")[name]))
    path = {"Pod": f"/api/v1/namespaces/{namespace}/pods",
            "Deployment": f"/apis/apps/v1/namespaces/{namespace}/deployments"}.get(body["kind"])
    return await kube.create(path or collection(body["apiVersion"], body["kind"], namespace), body)


async def pods_of(kube: KubeClient, namespace: str, created: dict[str, Any], replicas: int) -> list[dict[str, Any]]:
    """The example's pods: the pod itself, or the Deployment's (made by its ReplicaSet)."""
    if created["kind"] == "Pod":
        return [created]
    app = created["spec"]["selector"]["matchLabels"]["app"]

    async def made() -> list[dict[str, Any]] | None:
        pods = await kube.list(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"app={app}")
        return pods if len(pods) == replicas else None

    result: list[dict[str, Any]] = await wait_for(made, within=60, what=f"{replicas} pods of Deployment {app}")
    return result


async def device_of(kube: KubeClient, namespace: str, pod: str) -> dict[str, Any]:
    """The allocation result of the pod's claim (from a template, or the scheduler's for extended resources)."""
    async def allocated() -> dict[str, Any] | None:
        status = (await kube.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")).get("status") or {}
        names = [s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []]
        names.append((status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName"))
        for name in filter(None, names):
            claim = await get_or_none(kube, f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")
            results = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
            if results:
                return dict(results[0])
        return None

    result: dict[str, Any] = await wait_for(allocated, within=90, what=f"a device allocated to {namespace}/{pod}")
    return result


async def attributes(kube: KubeClient, node: str, device: str) -> dict[str, Any]:
    devices = {d["name"]: d for s in await kube.list(f"{RESOURCE}/resourceslices", fieldSelector=f"spec.nodeName={node}")
               for d in s["spec"].get("devices") or []}
    return {k.split("/")[-1]: next(iter(v.values())) for k, v in devices[device]["attributes"].items()}


async def test_memory_examples_get_slices_whole_gpus_and_the_extended_resource_way(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespaces: Namespaces, unique: str,
) -> None:
    node = await gpu_node("h100-80gb", 2)
    team_a = await namespaces("team-a")
    names = Names({"team-a": team_a, "team-b": await namespaces("team-b"),
                   "gpu-monitoring": await namespaces("mon"), "example.com/gpu-slice": f"example.com/guide-{unique}"})
    policy = await make_policy(example_policy("inference-memory.yaml", node.name, names), "-inf")
    names.mapping["inference"] = policy["metadata"]["name"]
    await published(kube, node.name, 18)
    await wait_for(lambda: get_or_none(kube, f"{RESOURCE}/namespaces/{team_a}/resourceclaimtemplates/gpu-slice-full"),
                   what="the templates")

    # The whole GPU first: it is whole only while no slice of it is in use.
    whole = await apply_example(kube, team_a, "full-gpu-pod", names)
    got = await device_of(kube, team_a, whole["metadata"]["name"])
    assert (await attributes(kube, node.name, got["device"]))["sliceSize"] == "full"
    for example, replicas in (("memory-pod", 1), ("memory-deployment", 2), ("extended-deployment", 1)):
        created = await apply_example(kube, team_a, example, names)
        for pod in await pods_of(kube, team_a, created, replicas):
            got = await device_of(kube, team_a, pod["metadata"]["name"])
            assert (await attributes(kube, node.name, got["device"]))["sliceSize"] == "10G", example


async def test_shared_and_mig_examples_get_their_capacity_and_profile(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespaces: Namespaces,
) -> None:
    shared_node, mig_node = await gpu_node("l4", 1), await gpu_node("a100-40gb", 1)
    data_science, ml = await namespaces("ds"), await namespaces("ml")
    names = Names({"data-science": data_science, "ml-research": ml})
    notebooks = await make_policy(example_policy("shared-notebooks.yaml", shared_node.name, names),
                                  "-nb")
    training = await make_policy(example_policy("training-mig.yaml", mig_node.name, names), "-tr")
    names.mapping.update({"notebooks": notebooks["metadata"]["name"], "training": training["metadata"]["name"]})
    await published(kube, shared_node.name, 1)
    await published(kube, mig_node.name, 7 + 2)  # every placement of 1g.5gb and of 3g.20gb
    await wait_for(lambda: get_or_none(kube, f"{RESOURCE}/namespaces/{ml}/resourceclaimtemplates/gpu-slice-3g.20gb"),
                   what="the MIG template")

    await apply_example(kube, data_science, "shared-template", names)
    created = await apply_example(kube, data_science, "shared-deployment", names)
    for pod in await pods_of(kube, data_science, created, 2):
        got = await device_of(kube, data_science, pod["metadata"]["name"])
        assert got["consumedCapacity"] == {"memory": "10Gi"}
    trainer = await apply_example(kube, ml, "mig-pod", names)
    got = await device_of(kube, ml, trainer["metadata"]["name"])
    assert (await attributes(kube, mig_node.name, got["device"]))["profile"] == "3g.20gb"


def denial(name: str, names: Names) -> str:
    """The page's denial, one line as the API server sends it (the page wraps it to fit)."""
    return " ".join(names(blocks("denial")[name]).split("\n")).strip()


def page_says(name: str, names: Names) -> str:
    return INVALID.sub(r"\1", KUBECTL_PREFIX.sub("", denial(name, names)))


async def refused(call: Awaitable[Any]) -> str:
    """The API server's message, with an Invalid object's kind left out as kubectl words it differently."""
    with pytest.raises(KubeError) as error:
        await call
    return INVALID.sub(r"\1", error.value.message)


async def test_each_denial_reads_as_the_guide_says(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespaces: Namespaces, gpuslice: Cli, unique: str,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    team_a, team_b, team_c = await namespaces("team-a"), await namespaces("team-b"), await namespaces("team-c")
    names = Names({"team-a": team_a, "team-b": team_b, "team-c": team_c, "gpu-monitoring": await namespaces("mon"),
                   "example.com/gpu-slice": f"example.com/denied-{unique}"})
    policy = await make_policy(example_policy("inference-memory.yaml", node.name, names), "-inf")
    name = policy["metadata"]["name"]
    names.mapping["inference"] = name
    await published(kube, node.name, 9)
    await policy_ready(kube, name)  # the guide's why is of a Ready policy (its status follows on a timer)
    klass = f"{name}.gpuslice.dev"

    def claim(claim_name: str, **request: Any) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": claim_name},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": klass, **request}}]}}}

    async def make(namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", body)

    async def admitted() -> bool:
        try:
            await make(team_b, claim("held-0"))
        except KubeError as error:
            if "has not put its quota in place" in error.message:
                return False
            raise
        return True

    await wait_for(admitted, within=60, what=f"{team_b} to be admitted")
    for i in range(1, 4):
        await make(team_b, claim(f"held-{i}"))
    for i in range(4):  # team-b's pods hold its 4 slices
        await kube.create(f"/api/v1/namespaces/{team_b}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"web-{i}"},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": f"held-{i}"}]}})

    async def holding() -> bool:
        claims = await kube.list(f"{RESOURCE}/namespaces/{team_b}/resourceclaims")
        return sum(bool((c.get("status") or {}).get("allocation")) for c in claims) == 4

    await wait_for(holding, within=90, what=f"the 4 claims of {team_b} to be allocated")

    assert await refused(make(team_c, claim("one-more"))) == page_says("not-a-tenant", names)

    async def counted() -> bool:
        quota = await kube.get(f"/api/v1/namespaces/{team_b}/resourcequotas/gpuslice-{name}")
        return bool(((quota.get("status") or {}).get("used") or {}).get(f"{klass}.deviceclass.resource.k8s.io/devices")
                    == "4")

    await wait_for(counted, within=60, what="the quota to count the 4 claims")
    assert await refused(make(team_b, claim("one-more"))) == page_says("over-the-limit", names)
    assert await refused(make(team_a, claim("debug", adminAccess=True))) == page_says("admin-access", names)
    label = {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}}
    assert await refused(kube.merge_patch(f"/api/v1/namespaces/{team_a}", label)) == \
        page_says("admin-access-label", names)

    # The guide's `why` of a pod over the limit: the same findings, in the same order.
    await kube.create(f"/api/v1/namespaces/{team_b}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-4"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"claims": [{"name": "gpu"}]}}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu-slice"}]}})

    async def explained() -> str | None:
        result = await gpuslice("why", f"{team_b}/web-4")
        return result.stdout if "AdmissionDenied" in result.stdout else None

    said = await wait_for(explained, within=60, what="why to see the refused claim")
    page = names(blocks("why")["over-the-limit"])
    assert re.findall(r"✗ (\w+):", said) == re.findall(r"✗ (\w+):", page)
    over = next(line for line in page.splitlines() if "✗ OverLimit" in line).strip().removeprefix("✗ OverLimit: ")
    result = (await gpuslice("why", f"{team_b}/web-4", "-o", "json")).json()
    assert result["findings"][0] == {"code": "OverLimit", "message": over, "blocking": True}


async def test_a_memory_budget_reads_as_the_guide_says(
    kube: KubeClient, controller: ControllerProcess, memory_webhook: Any, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespaces: Namespaces,
) -> None:
    """notebooks with data-science given maxMemory 20Gi: the page's claim of 15Gi is allocated, a
    second of 10Gi is refused at allocation and one of 25Gi when it is made, as the page says."""
    from tests.cluster.claims import allocation, pod_using
    from tests.cluster.webhook.budgets import admits, memory_in_force, refused_at_allocation

    node = await gpu_node("h100-80gb", 1)  # room for the two notebooks: only the budget stops the second
    data_science = await namespaces("ds")
    names = Names({"data-science": data_science})
    spec = example_policy("shared-notebooks.yaml", node.name, names)
    spec["tenants"] = [{"namespace": data_science, "maxMemory": "20Gi"}]
    policy = (await make_policy(spec, "-nb"))["metadata"]["name"]
    names.mapping["notebooks"] = policy
    await published(kube, node.name, 1)
    await memory_in_force(kube, policy, data_science, "20Gi")
    await admits(kube, data_science, f"{policy}.gpuslice.dev")
    claims = f"{RESOURCE}/namespaces/{data_science}/resourceclaims"
    big = await apply_example(kube, data_science, "budget-claim", names)
    await kube.create(f"/api/v1/namespaces/{data_science}/pods", pod_using("big", big["metadata"]["name"]))
    await wait_for(lambda: allocation(kube, data_science, "big-notebook"), within=60, what="the 15Gi notebook")

    def notebook(name: str, memory: str) -> dict[str, Any]:
        body = yaml.safe_load(names(blocks("example")["budget-claim"]))
        body["metadata"]["name"] = name
        body["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = memory
        return body

    await kube.create(claims, notebook("second-notebook", "10Gi"))
    await kube.create(f"/api/v1/namespaces/{data_science}/pods", pod_using("second", "second-notebook"))
    said = await refused_at_allocation(kube, data_science, "second", "maxMemory")
    assert said == denial("over-max-memory", names)
    assert await refused(kube.create(claims, notebook("huge-notebook", "25Gi"))) == page_says(
        "max-memory-too-large", names)
