"""One policy the API server refuses never breaks a node: the agent dry-runs a whole generation
before writing any of it, leaves out the refused policy's devices, and every other policy's
devices stay published, complete and allocatable, at a generation that does not move."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient, KubeError, NotFound
from tests.cluster.gpu_nodes import GpuNode, GpuNodeFactory
from tests.cluster.kubeutil import POLICIES, condition, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import create_pods, pool, published, settle, tenant_policy

VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


async def complete_pool(kube: KubeClient, node: str) -> tuple[int, dict[str, Any]] | None:
    """(generation, devices) when every slice of the pool is at one generation and all are there."""
    slices = await pool(kube, node)
    generations = {s["spec"]["pool"]["generation"] for s in slices}
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    if len(generations) != 1 or counts != {len(slices)}:
        return None
    return generations.pop(), {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


async def cycles(node: GpuNode) -> float:
    samples = await node.metrics()
    return sum(v for k, v in samples.items() if k.startswith("gpuslice_agent_publish_cycles_total"))


class Refusal:
    """A cluster's own admission rule (as a platform team's policy engine might have) that refuses
    slices of a node holding devices of a policy: a refusal gpuslice cannot foresee."""

    def __init__(self, kube: KubeClient, name: str) -> None:
        self.kube, self.name = kube, name

    async def install(self, node: str, policy: str) -> None:
        kube, name = self.kube, self.name
        await kube.create(VAP, {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {"failurePolicy": "Fail",
                     "matchConstraints": {"resourceRules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                                                             "operations": ["CREATE", "UPDATE"],
                                                             "resources": ["resourceslices"]}]},
                     "matchConditions": [{"name": "node", "expression": f"object.spec.nodeName == '{node}'"}],
                     "validations": [{
                         "expression": "!has(object.spec.devices) || !object.spec.devices.exists(d, has(d.attributes)"
                                       f" && 'gpuslice.dev/policy' in d.attributes && d.attributes['gpuslice.dev/policy'].string == '{policy}')",
                         "message": f"devices of {policy} are not allowed on {node} (test rule)"}]}})
        await kube.create(BINDINGS, {"apiVersion": "admissionregistration.k8s.io/v1",
                                     "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
                                     "spec": {"policyName": name, "validationActions": ["Deny"]}})

        probe = self.probe(node, policy)

        async def enforced() -> bool:
            try:
                await kube.create("/apis/resource.k8s.io/v1/resourceslices", probe, dryRun="All")
            except KubeError as error:
                return "test rule" in error.message
            return False

        await wait_for(enforced, within=30, what="the test's admission rule to be enforced")

    async def remove(self, node: str | None = None, policy: str | None = None) -> None:
        """Remove the rule; with ``node`` and ``policy``, wait until the apiserver no longer enforces it."""
        for path in (f"{BINDINGS}/{self.name}", f"{VAP}/{self.name}"):
            with contextlib.suppress(NotFound):
                await self.kube.delete(path)
        if node is not None and policy is not None:
            async def lifted() -> bool:
                try:
                    await self.kube.create("/apis/resource.k8s.io/v1/resourceslices", self.probe(node, policy),
                                           dryRun="All")
                except KubeError as error:
                    if "test rule" in error.message:
                        return False
                    raise
                return True

            await wait_for(lifted, within=30, what="the test's admission rule to be lifted")

    def probe(self, node: str, policy: str) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{self.name}-probe"},
                "spec": {"driver": "probe.example.com", "nodeName": node,
                         "pool": {"name": "probe", "generation": 1, "resourceSliceCount": 1},
                         "devices": [{"name": "d", "attributes": {"gpuslice.dev/policy": {"string": policy}}}]}}


@pytest.fixture
async def refusal(kube: KubeClient, unique: str) -> AsyncIterator[Refusal]:
    made = Refusal(kube, f"t-{unique}-refuse")
    yield made
    await made.remove()


async def test_a_refused_policy_leaves_the_others_published_and_allocatable(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, refusal: Refusal,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    good = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10G"}, "-good", "good")
    await published(kube, node.name, 8)
    bad_name = f"{good.removesuffix('-good')}-bad"
    await refusal.install(node.name, bad_name)

    bad = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "20G"}, "-bad", "bad")
    assert bad == bad_name

    async def valid() -> bool:
        body = await kube.get(f"{POLICIES}/{bad}")
        return condition(body, "Valid").get("status") == "True"

    await wait_for(valid, within=30, what="the controller to find the refused policy valid (it is: the cluster refuses it)")

    async def left_out() -> tuple[int, dict[str, Any]] | None:
        samples = await node.metrics()
        found = await complete_pool(kube, node.name)
        return found if samples.get("gpuslice_agent_refused_policies") == 1 and found else None

    generation, devices = await wait_for(left_out, within=30, what="the agent to leave the refused policy out")
    assert sorted(d["attributes"]["gpuslice.dev/policy"]["string"] for d in devices.values()) == [good] * 8

    # The good policy's devices are allocatable, and the pool's generation does not move while the
    # agent keeps running cycles (each woken by a change of its Node's labels: claims do not wake an
    # agent that waits for none).
    await create_pods(kube, namespace, "good", ["g0", "g1"])
    await settle(cluster, kube, namespace, ["g0", "g1"], 2)
    for value in ("a", "b"):
        before = await cycles(node)
        await kube.merge_patch(f"/api/v1/nodes/{node.name}", {"metadata": {"labels": {"probe": value}}})
        await wait_for(lambda before=before: _more(node, before, 1), within=60, what="one more publish cycle")
    assert await complete_pool(kube, node.name) == (generation, devices), "a refused generation writes nothing"
    log = node.agent.log_path.read_text()
    assert "devices refused by the API server" in log
    assert bad in log

    # Once the cluster no longer refuses them, its devices come (the agent tries a refused policy
    # again after a while, or at once when it changes).
    await refusal.remove(node.name, bad)
    await kube.merge_patch(f"{POLICIES}/{bad}", {"spec": {"slicing": {"sliceSize": "40G"}}})

    async def both() -> bool:
        found = await complete_pool(kube, node.name)
        names = set(found[1]) if found else set()
        return sum(1 for n in names if f"-{bad}-40g-" in n) == 2

    await wait_for(both, within=60, what="the edited policy's devices once the cluster accepts them")


async def _more(node: GpuNode, before: float, n: int) -> bool:
    return await cycles(node) >= before + n


async def test_a_shared_slice_with_no_room_for_a_second_is_invalid_and_never_half_written(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    """The API requires a consumable capacity's min + step to fit the capacity: a shared sliceSize over
    half a GPU is refused by the apiserver. The controller says so; nothing is written."""
    node = await gpu_node("h100-80gb", 1)
    name = await tenant_policy(make_policy, namespace, node.name, {"mode": "shared", "sliceSize": "50G"})

    async def invalid() -> dict[str, Any] | None:
        found = condition(await kube.get(f"{POLICIES}/{name}"), "Valid")
        return found if found.get("status") == "False" else None

    found = await wait_for(invalid, within=30, what="the controller to find a 50G shared slice invalid on an H100")
    assert found["reason"] == "SliceTooLargeToShare"
    assert "at most 40779Mi" in found["message"]
    assert await pool(kube, node.name) == [], "nothing is published, nothing half-written"
    assert (await node.metrics()).get('gpuslice_agent_publish_cycles_total{outcome="written"}') is None
