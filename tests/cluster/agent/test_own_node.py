"""An agent's token writes only its own node's slices, under its own node's names: the
admission policy of manifests/agent-rbac.yaml, tried as a compromised agent would try it.
Node "a" must not take "gpuslice-a-b-devices-00", the name of node "a-b"'s slice."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuslice.devcluster import operator
from gpuslice.devcluster.cluster import DevCluster
from gpuslice.devcluster.nodes import fake_gpu_node
from gpuslice.kube.client import Forbidden, KubeClient, KubeError, NotFound
from tests.cluster.gpu_nodes import cluster_ca
from tests.cluster.kubeutil import wait_for

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def slice_body(name: str, node: str, generation: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": "gpu.gpuslice.dev", "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1}, "devices": []}}


@pytest.fixture
async def agents(cluster: DevCluster, kube: KubeClient, agent_rbac: None, unique: str,
                 tmp_path: Path) -> AsyncIterator[dict[str, KubeClient]]:
    """Clients with the agent tokens of node ``a`` and node ``a-b`` (no agent process runs)."""
    ca_pem = cluster_ca(cluster)
    names = {"a": f"t-{unique}-a", "a-b": f"t-{unique}-a-b"}
    clients = {}
    for key, node in names.items():
        await kube.create("/api/v1/nodes", fake_gpu_node(node, "l4", 1))
        path = await operator.agent_kubeconfig(kube, node, tmp_path, cluster.server, ca_pem)
        clients[key] = await KubeClient.from_kubeconfig(path)
    yield clients
    for key, node in names.items():
        await clients[key].close()
        for suffix in ("devices-00", "counters-00"):
            with contextlib.suppress(NotFound):
                await kube.delete(f"{SLICES}/gpuslice-{node}-{suffix}")
        await kube.delete(f"/api/v1/nodes/{node}")


async def test_an_agent_cannot_take_or_touch_another_nodes_slices(agents: dict[str, KubeClient],
                                                                   kube: KubeClient) -> None:
    a, ab = agents["a"], agents["a-b"]
    a_node, ab_node = await _node_of(a), await _node_of(ab)
    assert ab_node == f"{a_node}-b"
    squat = slice_body(f"gpuslice-{ab_node}-devices-00", a_node)  # a's own pool, a-b's name

    async def squatting_refused() -> KubeError | None:
        try:
            await a.create(SLICES, squat)
        except Forbidden as error:
            return error
        await kube.delete(f"{SLICES}/{squat['metadata']['name']}")  # the updated rule is not enforced yet
        return None

    refused = await wait_for(squatting_refused, within=30, what="the own-node rule to refuse another node's name")
    assert f"gpuslice agent on node {a_node} may name its ResourceSlices only gpuslice-{a_node}-counters-NN" \
        in refused.message
    assert squat["metadata"]["name"] in refused.message

    # a-b publishes under its name; a may neither change nor delete it, nor move it to its own node.
    theirs = await ab.create(SLICES, slice_body(f"gpuslice-{ab_node}-devices-00", ab_node))
    changed = {**theirs, "spec": {**theirs["spec"], "pool": {**theirs["spec"]["pool"], "generation": 2}}}
    with pytest.raises(Forbidden, match="may write only its own node's ResourceSlices"):
        await a.replace(f"{SLICES}/{theirs['metadata']['name']}", changed)
    with pytest.raises(Forbidden, match="may write only its own node's ResourceSlices"):
        await a.apply(f"{SLICES}/{theirs['metadata']['name']}", slice_body(theirs["metadata"]["name"], ab_node, 3),
                      field_manager="squatter")
    moved = {**theirs, "spec": {**theirs["spec"], "nodeName": a_node, "pool": {**theirs["spec"]["pool"], "name": a_node}}}
    with pytest.raises(KubeError) as move:  # immutable fields (422) or the rule on oldObject (403)
        await a.replace(f"{SLICES}/{theirs['metadata']['name']}", moved)
    assert move.value.status in (403, 422)
    with pytest.raises(Forbidden, match=f"not gpuslice-{ab_node}-devices-00"):
        await a.delete(f"{SLICES}/{theirs['metadata']['name']}")
    kept = await kube.get(f"{SLICES}/{theirs['metadata']['name']}")
    assert kept["spec"]["pool"] == theirs["spec"]["pool"]

    # Its own slices, under its own names, a writes, changes and deletes freely.
    mine = await a.create(SLICES, slice_body(f"gpuslice-{a_node}-devices-00", a_node))
    await a.apply(f"{SLICES}/{mine['metadata']['name']}", slice_body(mine["metadata"]["name"], a_node, 2),
                  field_manager="gpuslice-agent")
    await a.delete(f"{SLICES}/{mine['metadata']['name']}")
    with pytest.raises(Forbidden, match="may name its ResourceSlices only"):
        await a.create(SLICES, slice_body(f"gpuslice-{a_node}-other", a_node))
    # And a-b's own agent still owns its name: it updates and deletes its slice.
    await ab.apply(f"{SLICES}/{theirs['metadata']['name']}", slice_body(theirs["metadata"]["name"], ab_node, 4),
                   field_manager="gpuslice-agent")
    await ab.delete(f"{SLICES}/{theirs['metadata']['name']}")


async def _node_of(client: KubeClient) -> str:
    review = await client.create("/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                 {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return str(review["status"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"][0])


CONFIGMAPS = "/api/v1/namespaces/gpuslice-system/configmaps"


def drain_entry(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "gpuslice-system", "labels": {"gpuslice.dev/drain-list": "true"}},
            "data": data}


async def test_the_drain_list_refuses_allocations_and_each_agent_writes_only_its_own_object(
        agents: dict[str, KubeClient], kube: KubeClient, namespace: str) -> None:
    a, ab = agents["a"], agents["a-b"]
    a_node, ab_node = await _node_of(a), await _node_of(ab)
    mine, theirs = f"{CONFIGMAPS}/gpuslice-draining-{a_node}", f"{CONFIGMAPS}/gpuslice-draining-{ab_node}"
    await a.apply(mine, drain_entry(f"gpuslice-draining-{a_node}", {a_node: "dev-1 dev-2"}),
                  field_manager=f"gpuslice-agent-{a_node}")
    await ab.apply(theirs, drain_entry(f"gpuslice-draining-{ab_node}", {ab_node: "dev-9"}),
                   field_manager=f"gpuslice-agent-{ab_node}")

    async def foreign_object_refused() -> KubeError | None:  # a dry run: nothing changes while the rule loads
        try:
            await a.apply(theirs, drain_entry(f"gpuslice-draining-{ab_node}", {ab_node: ""}),
                          field_manager=f"gpuslice-agent-{a_node}", dry_run=True)
        except Forbidden as error:
            return error if "may write only its own drain object" in error.message else None
        return None

    # Its own admission policy (gpuslice-agent-own-drain-entry): in force a moment after it is applied.
    await wait_for(foreign_object_refused, within=30, what="the drain list's own-object rule to be in force")
    own_only = f"on node {a_node} may write only its own drain object, ConfigMap gpuslice-system/gpuslice-draining-{a_node}"
    with pytest.raises(Forbidden, match=own_only):
        await a.apply(theirs, drain_entry(f"gpuslice-draining-{ab_node}", {ab_node: ""}),
                      field_manager=f"gpuslice-agent-{a_node}")
    with pytest.raises(Forbidden, match=own_only):
        await a.merge_patch(theirs, {"data": {ab_node: None}})
    with pytest.raises(Forbidden, match=own_only):
        await a.delete(theirs)
    with pytest.raises(Forbidden, match=f"may list in gpuslice-draining-{a_node} only its own node's devices"):
        await a.apply(mine, drain_entry(f"gpuslice-draining-{a_node}", {a_node: "dev-1", ab_node: "dev-7"}),
                      field_manager=f"gpuslice-agent-{a_node}")
    assert (await kube.get(mine))["data"] == {a_node: "dev-1 dev-2"}
    assert (await kube.get(theirs))["data"] == {ab_node: "dev-9"}

    probe = {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "gpuslice-drain-probe", "namespace": "gpuslice-system"},
             "data": {"pool": a_node, "devices": "dev-1 dev-3"}}

    async def refused_probe() -> KubeError | None:
        try:
            await a.create(CONFIGMAPS, probe, dryRun="All")
        except Forbidden as error:
            return error if "gpuslice-drain: " in error.message else None
        return None

    error = await wait_for(refused_probe, within=30, what="the drain rule to refuse the probe for a listed device")
    assert f"gpuslice-drain: {a_node}/dev-1 are being changed" in error.message, "dev-3 is not listed"
    unlisted = {**probe, "data": {"pool": a_node, "devices": "dev-3"}}
    await a.create(CONFIGMAPS, unlisted, dryRun="All")  # admitted: nothing listed is named
    with pytest.raises(Forbidden, match="create others only as the drain probe's dry run, not gpuslice-drain-probe"):
        await a.create(CONFIGMAPS, unlisted)
    with pytest.raises(Forbidden, match="create others only as the drain probe's dry run, not other"):
        await a.create(CONFIGMAPS, {**probe, "metadata": {"name": "other", "namespace": "gpuslice-system"}},
                       dryRun="All")

    # The rule itself, as the scheduler meets it: allocating a listed device is refused, another is not.
    # A class named as gpuslice's are (no policy owns it): once a controller test has installed the
    # admission policies, gpuslice-device-classes refuses gpuslice devices through any other class,
    # and gpuslice-non-tenants every gpuslice class in a namespace no policy names. The drain rule
    # judges the namespaces labelled gpuslice.dev/tenancy=judged: gpuslice-system is one, always.
    claims = "/apis/resource.k8s.io/v1/namespaces/gpuslice-system/resourceclaims"
    name = f"drain-{namespace}"
    claim = await kube.create(claims, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "unowned.gpuslice.dev"}}]}}})

    def allocating(pool: str, device: str) -> dict[str, Any]:
        return {**claim, "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.gpuslice.dev", "pool": pool, "device": device}]}}}}

    status = f"{claims}/{name}/status"

    async def allocate(pool: str, device: str, dry_run: bool = True) -> None:
        await kube.request("PUT", status, allocating(pool, device), query={"dryRun": "All"} if dry_run else None)

    with pytest.raises(Forbidden, match=f"gpuslice-drain: {a_node}/dev-2 are being changed or removed"):
        await allocate(a_node, "dev-2")
    with pytest.raises(Forbidden, match=f"gpuslice-drain: {ab_node}/dev-9 are being changed or removed"):
        await allocate(ab_node, "dev-9")
    # An object counts only for the node it is named after: a key of another node in it (which only
    # an administrator could write) lists nothing, once the rule has loaded it (dev-5 of a refused).
    await kube.merge_patch(mine, {"data": {a_node: "dev-1 dev-2 dev-5", ab_node: "dev-5"}})
    probe5 = {**probe, "data": {"pool": a_node, "devices": "dev-5"}}

    async def loaded() -> bool:
        try:
            await a.create(CONFIGMAPS, probe5, dryRun="All")
        except Forbidden as error:
            return "gpuslice-drain: " in error.message
        return False

    await wait_for(loaded, within=30, what="the drain rule to load the edited object")
    await allocate(ab_node, "dev-5")
    await allocate(a_node, "dev-3", dry_run=False)

    # Each deletes its own object once nothing is listed; with none left, nothing is refused.
    await a.delete(mine)
    await ab.delete(theirs)

    async def admitted_without_params() -> bool:
        try:
            await a.create(CONFIGMAPS, probe, dryRun="All")
        except Forbidden:
            return False
        return True

    try:
        await wait_for(admitted_without_params, within=30, what="no drain object: the rule refuses nothing")
    finally:
        await kube.delete(f"{claims}/{name}")
