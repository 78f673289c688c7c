"""Hostile review, December (third round), P: what the `gpuslice-defrag` role may still do with the
one write the admission rule gpuslice-policy-status leaves it, a move added "as a request".

The fix for P (d7b3b54) confines every writer but the controller to adding a move (phase
Requested, nothing evicted) or removing one. It judges the move's form, not what it says: which
GPU (of this policy, or of another's), for which claim (of a tenant of this policy, waiting for a
pod, or any claim anywhere that no pod uses), which pods to evict (any movable pod holding a device
of the GPU, whether or not that frees room for anything), and until when (the controller's
--defrag-timeout is 300 s; a move by hand says its own `expires`). The controller carries out what
the record says. So an identity with only gpuslice-viewer and gpuslice-defrag can:

- evict a tenant's running pod for nothing, and keep its replacement off the GPU for as long as
  it likes (a move for a claim no pod uses is never allocated, so it ends only at `expires`);
- keep another policy's tenant off its own GPU (a move recorded in policy X that names a GPU of
  policy Y: the agent taints it, the tenancy rule refuses Y's claims there).

A promise test: docs/controller.md says the defrag role's one write is a move "for a waiting pod"
that the controller carries out; README: moves end by --defrag-timeout. It asserts no pod is
evicted and the tenant's pods run, so it fails while the hole is open.

Since the fix, the admission rule refuses both moves as first written (a claim outside the policy's
tenants, an expiry 70 years on, a GPU on a node policy X does not select). The attacker's next try
is kept: move 1 for an idle claim in the victim's own namespace, expiring in 5 minutes, which the
rule cannot tell from a real request; the controller must refuse it (no taint, no eviction, the
record gone as Failed with the reason, an Event on the policy).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import uuid
from pathlib import Path
from typing import Any

from gpuslice.api.status import DefragMove, ObjectRef
from gpuslice.controller.defrag.move import now_utc, stamp, start, update_defrag
from gpuslice.devcluster.cluster import DevCluster
from gpuslice.dra.wire import device_gpu
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import RESOURCE, pod_claim, wait_for
from tests.cluster.operator_fixtures import MANIFESTS, ControllerProcess, PolicyFactory, apply_manifests, bound_identity
from tests.cluster.plugin.defrag_fleet import APPS, app_pod, deployment, pods_of
from tests.cluster.plugin.plugin_nodes import PluginNodeFactory, pod_events
from tests.cluster.pools import SLICES, pool_devices

POLICIES = "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"
FAR = datetime.timedelta(days=365 * 70)  # the move's own `expires`: nothing capped it
SOON = datetime.timedelta(minutes=5)  # what the admission rule lets a request say


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


def _move(policy_gpu: tuple[str, str, str], bystander: dict[str, Any], evictions: list[ObjectRef],
          by: str, lasting: datetime.timedelta = FAR) -> DefragMove:
    node, uuid_, gpu_tag = policy_gpu
    now = now_utc()
    meta = bystander["metadata"]
    return DefragMove(
        id=f"d-{uuid.uuid4().hex[:10]}", node=node, gpu=uuid_, gpu_tag=gpu_tag, gpu_index=0,
        device="no-device-waits-here",  # every device of the GPU tainted
        claim=ObjectRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"]),
        pod=ObjectRef(namespace=meta["namespace"], name="nobody", uid=str(uuid.uuid4())),
        evictions=evictions, by=by, started=stamp(now), expires=stamp(now + lasting))


async def _record(client: KubeClient, policy: str, move: DefragMove) -> str | None:
    """What `gpuslice defrag --apply` does to request ``move``: None, or why it was not recorded."""
    try:
        return await start(client, policy, move, [])
    except KubeError as error:
        return error.message


async def _running_pod(kube: KubeClient, namespace: str, app: str) -> dict[str, Any] | None:
    found = [p for p in await pods_of(kube, namespace, app) if (p.get("status") or {}).get("phase") == "Running"]
    return found[0] if found else None


async def test_the_defrag_role_evicts_no_one_and_keeps_no_gpu_from_its_tenants_without_a_waiting_pod(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    plugin_node: PluginNodeFactory, namespace: str, namespaces: Any, unique: str, tmp_path: Path,
) -> None:
    victim = namespace
    bystanders = await namespaces("bys")
    node = await plugin_node("h100-80gb", 1)
    policy_y = str((await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                                       "slicing": {"mode": "memory", "sliceSize": "20G"},
                                       "tenants": [{"namespace": victim}]}))["metadata"]["name"])
    # Policy X: another team's, on no node at all; the defrag role can patch every policy's status.
    policy_x = str((await make_policy({"nodeSelector": {"matchLabels": {"gpuslice.dev/none": "none"}},
                                       "slicing": {"mode": "memory", "sliceSize": "20G"},
                                       "tenants": [{"namespace": bystanders}]}, suffix="-x"))["metadata"]["name"])

    async def template() -> bool:
        try:
            await kube.get(f"{RESOURCE}/namespaces/{victim}/resourceclaimtemplates/gpu-slice")
        except KubeError:
            return False
        return True

    await wait_for(template, within=60, what="the victim's template")
    await kube.create(f"{APPS}/namespaces/{victim}/deployments", deployment("web"))
    first = await app_pod(kube, victim, "web")
    pod = await kube.get(f"/api/v1/namespaces/{victim}/pods/{first}")
    held = await pod_claim(kube, victim, first)
    assert held is not None
    [result] = held["status"]["allocation"]["devices"]["results"]
    devices = await pool_devices(kube, node.name)
    gpu = device_gpu(devices[result["device"]])
    assert gpu is not None
    gpu_tag = "-".join(str(result["device"]).split("-")[:2])
    # A claim nobody waits for: another driver's, in a namespace of neither policy; no pod uses it, so it
    # is never allocated (readable with gpuslice-viewer, like every claim).
    bystander = await kube.create(f"{RESOURCE}/namespaces/{bystanders}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "idle"},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}]}}})
    victim_ref = ObjectRef(namespace=victim, name=first, uid=pod["metadata"]["uid"])
    # The attacker's second try: an idle claim the victim has (no pod uses it), in the victim's namespace.
    idle = await kube.create(f"{RESOURCE}/namespaces/{victim}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "idle"},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}]}}})
    by = f"gpuslice defrag (defrag-{unique})"

    async def tainted_now() -> list[str]:
        return [d["name"] for s in await kube.list(SLICES, fieldSelector=f"spec.nodeName={node.name}")
                for d in s["spec"].get("devices") or [] if any(t.get("key") == "gpuslice.dev/defrag"
                                                              for t in d.get("taints") or [])]

    async with await defrag_operator(cluster, kube, tmp_path, f"defrag-{unique}") as as_operator:
        # 0. The first try as the review wrote it: policy Y, evicting the victim's running pod, for the idle
        # claim of another namespace, for 70 years.
        m0 = _move((node.name, gpu, gpu_tag), bystander, [victim_ref], by)
        said0 = await _record(as_operator, policy_y, m0)
        print(f"P move 0 (policy Y, for {bystanders}/idle, expires {m0.expires}) recorded:", said0 or "admitted")
        # 1. The same in the victim's own namespace, expiring in 5 minutes: what the admission rule admits.
        m1 = _move((node.name, gpu, gpu_tag), idle, [victim_ref], by, SOON)
        said1 = await _record(as_operator, policy_y, m1)
        print("P move 1 (policy Y, evicts the victim's running pod, for an idle claim of the victim,"
              f" expires {m1.expires}) recorded:", said1 or "admitted")
        seen_tainted: list[str] = []
        for _ in range(10):  # the node agent follows policies within a second or two
            seen_tainted += await tainted_now()
            await asyncio.sleep(0.5)
        print("P devices tainted while move 1 was recorded:", sorted(set(seen_tainted)))

        async def y_moves() -> dict[str, Any]:
            return ((await kube.get(f"{POLICIES}/{policy_y}")).get("status") or {}).get("defragmentation") or {}

        async def judged() -> bool:
            return (((await y_moves()).get("last") or {}).get("id")) == m1.id

        with contextlib.suppress(AssertionError):
            await wait_for(judged, within=30, what="the controller to judge move 1")
        y_status = await y_moves()
        refused_events = [e.get("message") for e in await kube.list("/api/v1/namespaces/default/events")
                          if e.get("reason") == "DefragmentationRefused"
                          and (e.get("involvedObject") or {}).get("name") == policy_y]
        print("P policy Y's moves after:", [m["id"] for m in y_status.get("inFlight") or []], "| last:",
              y_status.get("last"), "| Events:", refused_events[:2])

        async def evicted() -> bool:
            return not any(p["metadata"]["uid"] == victim_ref.uid for p in await pods_of(kube, victim, "web"))

        with contextlib.suppress(AssertionError):
            await wait_for(evicted, within=60, what="the victim's pod evicted")
        was_evicted = await evicted()
        told = [e.get("message") for e in await pod_events(kube, victim, first)
                if "moved by gpuslice" in str(e.get("message"))]
        print("P victim's pod evicted:", was_evicted, "| told:", told)
        # 2. A move in policy X naming policy Y's GPU (no eviction), before move 1 goes: the GPU stays reserved.
        m2 = _move((node.name, gpu, gpu_tag), bystander, [], f"gpuslice defrag (defrag-{unique})")
        said2 = await _record(as_operator, policy_x, m2)
        print(f"P move 2 (recorded in policy {policy_x}, names GPU {gpu_tag} of policy {policy_y}'s node) recorded:",
              said2 or "admitted")
        removed = await update_defrag(as_operator, policy_y,
                                      lambda c: c.model_copy(update={"in_flight": [m for m in c.in_flight
                                                                                    if m.id != m1.id]}))
        print("P move 1 removed by the role:", removed or "yes (or gone already)")
        await asyncio.sleep(40)  # length: the window in which the replacement pod, free but for move 2, reaches its GPU
        running = await _running_pod(kube, victim, "web")
        tainted = [d["name"] for s in await kube.list(SLICES, fieldSelector=f"spec.nodeName={node.name}")
                   for d in s["spec"].get("devices") or [] if any(t.get("key") == "gpuslice.dev/defrag"
                                                                 for t in d.get("taints") or [])]
        pending = [p["metadata"]["name"] for p in await pods_of(kube, victim, "web")
                   if (p.get("status") or {}).get("phase") != "Running"]
        conditions = [c.get("message") for p in await pods_of(kube, victim, "web")
                      for c in (p.get("status") or {}).get("conditions") or [] if c.get("reason") == "Unschedulable"]
        x_status = (await kube.get(f"{POLICIES}/{policy_x}")).get("status") or {}
        print("P 40 s after move 1 went: victim's Deployment running:", running and running["metadata"]["name"],
              "| pending:", pending, "| scheduler said:", conditions[:1])
        print("P devices tainted gpuslice.dev/defrag on", node.name, ":", tainted)
        print(f"P policy {policy_x}'s moves:", [(m["id"], m["node"], m["gpuTag"], m["expires"], m["phase"])
                                              for m in (x_status.get("defragmentation") or {}).get("inFlight") or []])
        # Control: move 2 removed, the replacement runs.
        await update_defrag(as_operator, policy_x, lambda c: c.model_copy(update={"in_flight": []}))
    control = await app_pod(kube, victim, "web")
    print("P control: with move 2 removed, the victim's pod runs:", control)
    assert said0, "a move for another namespace's claim, for 70 years, was admitted"
    assert "gpuslice-policy-status" in said0, said0
    assert not said1, f"the role's first move was refused (the hole is closed another way): {said1}"
    assert said2, f"a move in policy {policy_x} naming a GPU on a node it does not select was admitted"
    assert "gpuslice-policy-status" in said2, said2
    assert not was_evicted, (f"an identity with only gpuslice-viewer and gpuslice-defrag had {victim}/{first}"
                             " evicted by recording a move for a claim no pod waits for")
    assert not seen_tainted, f"a move the controller did not judge tainted {sorted(set(seen_tainted))}"
    assert not y_status.get("inFlight"), "the controller removes a move it refuses"
    assert (y_status.get("last") or {}).get("id") == m1.id
    assert "was refused" in (y_status.get("last") or {}).get("message", ""), y_status.get("last")
    assert refused_events, "a DefragmentationRefused Event on the policy says why"
    assert running is not None, (f"a move recorded in policy {policy_x} (expires {m2.expires}) keeps tenant {victim}"
                                 f" of policy {policy_y} off its own GPU")
