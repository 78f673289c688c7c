"""A policy's status is the controller's: anyone else, the `gpuslice-defrag` role included, may only
record or remove defragmentation moves there (gpuslice-policy-status, manifests/admission.yaml).

The role grants `patch` on `gpuslicepolicies/status`, which `gpuslice defrag --apply` needs for its
one write. Before the second December review it also let its holder rewrite `classesInForce`, the
record a shared request is judged against: a `maxSlices: 1` (10G) tenant was allocated 80G."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from pathlib import Path
from typing import Any

from gpuslice.api.status import DefragMove, DefragOutcome, ObjectRef
from gpuslice.controller.defrag.move import now_utc, stamp, start, update_defrag
from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.claims import allocation, claim, pod_using, refused, request
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import POLICIES, RESOURCE, wait_for
from tests.cluster.observe import scheduler_settled
from tests.cluster.operator_fixtures import MANIFESTS, ControllerProcess, PolicyFactory, apply_manifests, bound_identity
from tests.cluster.pools import published
from tests.cluster.tenancy import ready_tenant

GUARD = "gpuslice-policy-status"


async def shared_tenant(kube: KubeClient, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
                        namespace: str) -> str:
    """A shared 10G policy on one fake H100, whose one tenant may hold one slice (10G)."""
    node = await gpu_node("h100-80gb", 1)
    name = str((await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                                   "slicing": {"mode": "shared", "sliceSize": "10G"},
                                   "tenants": [{"namespace": namespace, "maxSlices": 1}]}))["metadata"]["name"])
    await published(kube, node.name, 1)
    await ready_tenant(kube, name, namespace)
    return name


async def defrag_operator(cluster: DevCluster, kube: KubeClient, directory: Path, name: str) -> KubeClient:
    """A client of an identity bound to gpuslice-viewer and gpuslice-defrag only (what `gpuslice defrag
    --apply` needs), once the authorizer lets it patch a policy's status."""
    await apply_manifests(kube, (MANIFESTS / "viewer-rbac.yaml").read_text())
    path = await bound_identity(cluster, kube, directory, name, ("gpuslice-viewer", "gpuslice-defrag"))
    user = f"system:serviceaccount:default:{name}"

    async def allowed() -> bool:
        review = await kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": ["system:serviceaccounts"], "resourceAttributes": {
                "group": "gpuslice.dev", "resource": "gpuslicepolicies", "subresource": "status", "verb": "patch"}}})
        return bool(review["status"].get("allowed"))

    await wait_for(allowed, within=30, what=f"{user} to be bound to gpuslice-defrag")
    return await KubeClient.from_kubeconfig(path)


async def write(client: KubeClient, policy: str, status: dict[str, Any]) -> str:
    """A merge patch of the policy's status; what it was refused with ('' when admitted)."""
    try:
        await client.merge_patch(f"{POLICIES}/{policy}/status", {"status": status})
    except KubeError as error:
        return error.message
    return ""


async def test_the_defrag_role_cannot_loosen_a_tenants_limit(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, unique: str, tmp_path: Path,
) -> None:
    """The review's P1: the defrag role rewrites the shared class's record from 10G to 80G, and the
    maxSlices: 1 tenant makes an 80G claim and a pod. The write is refused, and the claim is never
    allocated."""
    name = await shared_tenant(kube, make_policy, gpu_node, namespace)
    klass = f"{name}.gpuslice.dev"
    big = claim("big", request(klass, capacity={"requests": {"memory": "80G"}}))
    await refused(kube, namespace, big, "of a shared device one sliceSize")  # control: maxSlices 1 = 10G
    status = (await kube.get(f"{POLICIES}/{name}"))["status"]
    forged: list[dict[str, Any]] = [{**c, "memory": "80G"} if c["name"] == klass else c
                                    for c in status["classesInForce"]]
    async with await defrag_operator(cluster, kube, tmp_path, f"defrag-{unique}") as as_operator:
        said = await write(as_operator, name, {"classesInForce": forged})
    print("the defrag role's rewrite of classesInForce was told:", said or "admitted")
    made: bool | str = False
    for _ in range(20):
        try:
            await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", big)
            made = True
            break
        except KubeError as error:
            made = error.message
            await asyncio.sleep(0.5)
    got = None
    if made is True:
        await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_using("big", "big"))
        await scheduler_settled(cluster)  # the pod was tried since: bound, or parked unschedulable
        got = await allocation(kube, namespace, "big")
    print("80G claim made:", made, "| allocation:", got and got["devices"]["results"])
    with contextlib.suppress(KubeError):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/big", gracePeriodSeconds=0)
    assert got is None, (f"a maxSlices: 1 (10G) tenant holds {got['devices']['results'][0].get('consumedCapacity')}"
                         " after an identity with only gpuslice-viewer and gpuslice-defrag rewrote classesInForce")
    assert GUARD in said, said
    assert "status.classesInForce" in said, said
    assert (await kube.get(f"{POLICIES}/{name}"))["status"]["classesInForce"] == status["classesInForce"]


async def test_the_defrag_role_records_and_removes_a_move_and_writes_nothing_else(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, unique: str, tmp_path: Path,
) -> None:
    """`gpuslice defrag --apply`'s writes (start: add a move; remove one) pass as the defrag role. What
    else that role (or a cluster admin: the rule spares only the controller) might write is refused:
    a move already recorded changed (its phase, whom it evicts), a move added half-way through, one
    on a node the policy does not select, for a claim or evicting pods outside its tenants, or for
    longer than an hour, the Auto eviction budget, the last outcome, and the records of tenants and
    nodes."""
    name = await shared_tenant(kube, make_policy, gpu_node, namespace)
    waiting = await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
                                claim("waiting", request(f"{name}.gpuslice.dev")))
    now = now_utc()
    victim = ObjectRef(namespace=namespace, name="someone", uid="0b3c1f0e-0000-4000-8000-000000000001")
    [node] = (await kube.get(f"{POLICIES}/{name}"))["status"]["selectedNodes"]
    move = DefragMove(id=f"d-{unique}", node=node, gpu="GPU-unused", gpu_tag="gpu-00000000", device="x",
                      claim=ObjectRef(namespace=namespace, name="waiting", uid=waiting["metadata"]["uid"]),
                      pod=ObjectRef(namespace=namespace, name="big", uid="0b3c1f0e-0000-4000-8000-000000000002"),
                      evictions=[victim], by=f"gpuslice defrag (defrag-{unique})",
                      started=stamp(now), expires=stamp(now + datetime.timedelta(minutes=5)))
    # Frozen while the role writes: it would judge the move (no pod waits for its claim) and remove it.
    controller.pause()
    try:
        await _writes_of_the_role(cluster, kube, tmp_path, unique, name, move, victim)
    finally:
        controller.resume()
    assert not ((await kube.get(f"{POLICIES}/{name}"))["status"]["defragmentation"].get("inFlight"))


async def _writes_of_the_role(cluster: DevCluster, kube: KubeClient, tmp_path: Path, unique: str, name: str,
                              move: DefragMove, victim: ObjectRef) -> None:
    now = now_utc()
    async with await defrag_operator(cluster, kube, tmp_path, f"defrag-{unique}") as as_operator:
        assert await start(as_operator, name, move, []) is None, "gpuslice defrag --apply records its move"
        recorded = (await kube.get(f"{POLICIES}/{name}"))["status"]
        assert [m["id"] for m in recorded["defragmentation"]["inFlight"]] == [move.id]

        async def change(client: KubeClient, update: dict[str, Any]) -> str:
            try:
                await update_defrag(client, name, lambda c: c.model_copy(update=update))
            except KubeError as error:
                return error.message
            return ""

        escalated = move.model_copy(update={"phase": "Evicting", "evicted": [victim.uid]})
        another = move.model_copy(update={"id": f"e-{unique}", "gpu": "GPU-other", "phase": "Evicting"})
        attempts = {
            "a recorded move made to evict": lambda c: change(c, {"in_flight": [escalated]}),
            "a recorded move given another victim": lambda c: change(c, {"in_flight": [move.model_copy(
                update={"evictions": [victim.model_copy(update={"name": "other"})]})]}),
            "a move added as evicting already": lambda c: change(c, {"in_flight": [move, another]}),
            "a move requested on a node the policy does not select": lambda c: change(c, {"in_flight": [
                move, move.model_copy(update={"id": f"n-{unique}", "node": "no-such-node"})]}),
            "a move requested for another namespace's claim": lambda c: change(c, {"in_flight": [
                move, move.model_copy(update={"id": f"c-{unique}", "claim": ObjectRef(
                    namespace="kube-system", name="x", uid="u"), "pod": ObjectRef(namespace="kube-system", name="x")})]}),
            "a move requested to evict outside the tenants": lambda c: change(c, {"in_flight": [
                move, move.model_copy(update={"id": f"v-{unique}", "evictions": [ObjectRef(
                    namespace="kube-system", name="coredns", uid="u")]})]}),
            "a move requested for 70 years": lambda c: change(c, {"in_flight": [
                move, move.model_copy(update={"id": f"t-{unique}", "expires": stamp(
                    now + datetime.timedelta(days=365 * 70))})]}),
            "the eviction budget emptied": lambda c: write(c, name, {"defragmentation": {
                "evictions": [stamp(now)] * 3}}),
            "an outcome written": lambda c: change(c, {"last": DefragOutcome(
                id=move.id, time=stamp(now), outcome="Freed", message="forged")}),
            "a tenant's record": lambda c: write(c, name, {"admittedTenants": []}),
            "the nodes' record": lambda c: write(c, name, {"selectedNodes": ["elsewhere"]}),
        }
        for what, attempt in attempts.items():
            said = await attempt(as_operator)
            assert GUARD in said, f"{what}, by the defrag role: {said or 'admitted'}"
        said = await write(kube, name, {"classesInForce": []})
        assert GUARD in said, f"a cluster admin: {said or 'admitted'}"
        after = (await kube.get(f"{POLICIES}/{name}"))["status"]
        for field in ("classesInForce", "admittedTenants", "selectedNodes"):
            assert after.get(field) == recorded.get(field), field
        [kept] = after["defragmentation"]["inFlight"]
        assert kept["evictions"] == [victim.model_dump(by_alias=True)], kept
        assert not kept.get("evicted"), kept
        assert await change(as_operator, {"in_flight": []}) == "", "gpuslice defrag removes a move nobody carried out"
