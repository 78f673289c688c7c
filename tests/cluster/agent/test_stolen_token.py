"""A stolen node-agent token against the other nodes' drains (H2 of the December hostile review):
one node's drain list cannot crowd out another's, and a drain that cannot progress backs off
instead of reading every claim in the cluster twice a second."""

from __future__ import annotations

import asyncio

import pytest

from gpuslice.kube.client import Forbidden, KubeClient
from tests.cluster.gpu_nodes import GpuNode, GpuNodeFactory
from tests.cluster.kubeutil import POLICIES, ClusterObjects, get_or_none, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import pool_devices, published, tenant_policy

CONFIGMAPS = "/api/v1/namespaces/gpuslice-system/configmaps"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
READS = 'gpuslice_agent_claim_reads_total{outcome="read"}'
MIB = 1024 * 1024


def drain_object(node: str, data: dict[str, str]) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"gpuslice-draining-{node}", "namespace": "gpuslice-system",
                         "labels": {"gpuslice.dev/drain-list": "true"}},
            "data": data}


async def drained_and_gone(kube: KubeClient, node: GpuNode, policy: str, within: float) -> None:
    async def gone() -> bool:
        return not await pool_devices(kube, node.name) and await get_or_none(kube, f"{POLICIES}/{policy}") is None

    await wait_for(gone, within=within, what=f"the devices of deleted {policy} to drain and go, and the policy")


async def test_a_stolen_agent_token_cannot_keep_other_nodes_from_draining(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str,
) -> None:
    """Before: one cluster-wide ConfigMap held every node's list, and one key of ~1 MiB written with a
    stolen token left no room for any other: a deleted policy's devices stayed published, tainted,
    and the policy never went. Now each node has its own object and writes only that."""
    rogue, victim = await gpu_node("l4", 1), await gpu_node("l4", 1)
    await rogue.agent.stop()  # its token is stolen
    name = await tenant_policy(make_policy, namespace, victim.name, {"mode": "memory", "sliceSize": "12G"})
    await published(kube, victim.name, 2)
    filler = " ".join(f"d{i:07d}" for i in range(MIB // 9 + 1))[: MIB - 64]
    async with await KubeClient.from_kubeconfig(rogue.kubeconfig) as as_rogue:
        # As much as a ConfigMap holds, in its own object: allowed, and harmless to everyone else.
        await as_rogue.apply(f"{CONFIGMAPS}/gpuslice-draining-{rogue.name}", drain_object(rogue.name, {rogue.name: filler}),
                             field_manager=f"gpuslice-agent-{rogue.name}")
        # Not in the victim's object, nor the victim's key in its own (which would count for nothing anyway).
        with pytest.raises(Forbidden, match="may write only its own drain object"):
            await as_rogue.apply(f"{CONFIGMAPS}/gpuslice-draining-{victim.name}",
                                 drain_object(victim.name, {victim.name: filler}),
                                 field_manager=f"gpuslice-agent-{rogue.name}")
        with pytest.raises(Forbidden, match="only its own node's devices"):
            await as_rogue.apply(f"{CONFIGMAPS}/gpuslice-draining-{rogue.name}",
                                 drain_object(rogue.name, {victim.name: "x", rogue.name: "y"}),
                                 field_manager=f"gpuslice-agent-{rogue.name}")
    try:
        await kube.delete(f"{POLICIES}/{name}")
        await drained_and_gone(kube, victim, name, within=30)
    finally:
        await kube.delete(f"{CONFIGMAPS}/gpuslice-draining-{rogue.name}")


def refuse_drain_writes_of(node: str) -> tuple[dict[str, object], dict[str, object]]:
    """An admission policy of the test's: the node's drain object cannot be written (as the 1 MiB
    limit refused it before, or a rule of the cluster's own might)."""
    name = f"test-refuse-drain-{node}"
    return ({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
             "metadata": {"name": name},
             "spec": {"failurePolicy": "Fail",
                      "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                              "operations": ["CREATE", "UPDATE"],
                                                              "resources": ["configmaps"]}]},
                      "matchConditions": [{"name": "its-drain-object",
                                           "expression": f"object.metadata.name == 'gpuslice-draining-{node}'"}],
                      "validations": [{"expression": "false", "message": "test: this drain object is refused",
                                       "reason": "Forbidden"}]}},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
             "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}})


async def test_a_drain_that_cannot_progress_backs_off_and_news_cuts_the_wait_short(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str, cluster_objects: ClusterObjects,
) -> None:
    """Before: a refused drain write made the agent run a cycle, and read every claim in the cluster,
    about once a second without end (33 times in 30 s). Now 0.5 s doubling to the resync, jittered."""
    node = await gpu_node("l4", 1)
    name = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "12G"})
    await published(kube, node.name, 2)
    policy, binding = refuse_drain_writes_of(node.name)
    await cluster_objects.create(f"{ADMISSION}/validatingadmissionpolicies", policy)
    await cluster_objects.create(f"{ADMISSION}/validatingadmissionpolicybindings", binding)

    async def in_force() -> bool:  # a dry run as the admin: the test's rule judges every writer
        try:
            await kube.apply(f"{CONFIGMAPS}/gpuslice-draining-{node.name}", drain_object(node.name, {}),
                             field_manager="test", dry_run=True)
        except Forbidden:
            return True
        return False

    await wait_for(in_force, within=30, what="the test's rule refusing the node's drain object")
    before = await node.metrics()
    await kube.delete(f"{POLICIES}/{name}")
    await asyncio.sleep(30)  # length: the observation's, not a wait for something
    after = await node.metrics()
    reads = after.get(READS, 0) - before.get(READS, 0)
    assert len(await pool_devices(kube, node.name)) == 2, "nothing drains while the list cannot be written"
    # 0.5 + 1 + 2 + 4 + 8 + 16 s (each give or take half) fit about seven cycles in 30 s, and the
    # deletion's own events a few more; every 0.5 s would be sixty.
    assert 1 <= reads <= 12, f"{reads} cluster-wide claim reads in 30 s"
    assert "the drain list could not be written" in (await asyncio.to_thread(node_log, node))

    await cluster_objects.delete_all()
    await wait_for(lambda: _not_refused(kube, node.name), within=30, what="the test's rule to be gone")
    # News (here an edit of the agent's own Node) starts a cycle at once, whatever the backoff.
    await kube.merge_patch(f"/api/v1/nodes/{node.name}", {"metadata": {"labels": {"test-wake": "now"}}})
    await drained_and_gone(kube, node, name, within=30)


async def _not_refused(kube: KubeClient, node: str) -> bool:
    try:
        await kube.apply(f"{CONFIGMAPS}/gpuslice-draining-{node}", drain_object(node, {}), field_manager="test",
                         dry_run=True)
    except Forbidden:
        return False
    return True


def node_log(node: GpuNode) -> str:
    path = node.agent.log_path
    return path.read_text(errors="replace")
