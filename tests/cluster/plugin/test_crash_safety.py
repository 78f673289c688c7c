"""The node agent killed at the worst moments (SIGKILL, through its test-only kill points), the kubelet
restarted, both away long enough for the kubelet to wipe the slices: the node comes back clean and
consistent, and no pod loses its device."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import pod_claim, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.plugin.plugin_nodes import PluginNodeFactory, exec_env, gone, killed_at, running, until
from tests.cluster.pools import create_pods, pool_devices, published, tenant_policy

GPU_BACKENDS = ("fake", "nvml")  # each test on the fake backend and on the mock NVML library


async def device_of(kube: KubeClient, namespace: str, pod: str) -> str:
    claim = await pod_claim(kube, namespace, pod)
    assert claim is not None
    return str(claim["status"]["allocation"]["devices"]["results"][0]["device"])


@pytest.mark.parametrize("point", ["prepare-started", "prepare-cdi-written"])
# No MIG instance, so nothing of the GPU backend's: on the fake backend only (the CI's time).
@pytest.mark.gpu_backends("fake")
async def test_killed_between_the_checkpoint_phases_the_agent_restarts_clean(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, point: str, cluster: Any,
) -> None:
    node = await plugin_node("h100-80gb", 1)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "20G"})
    await published(kube, node.name, 4)
    await node.agent.stop()
    await node.start_agent(kill_at=point)
    await create_pods(kube, namespace, "gpu-slice", ["w"])
    await killed_at(node, point)
    [checkpoint] = node.checkpoints()
    assert checkpoint["phase"] == "started", "killed before the checkpoint said completed"
    assert len(node.cdi_specs()) == (1 if point == "prepare-cdi-written" else 0)

    await node.start_agent()  # no kill point: a plain restart
    await running(kube, namespace, ["w"], within=90)
    assert "recovered from an unclean stop" in node.agent_log
    [checkpoint] = node.checkpoints()
    assert checkpoint["phase"] == "completed"
    assert node.cdi_specs() == [f"gpuslice.dev-gpu_{checkpoint['uid']}.json"]
    assert exec_env(cluster, namespace, "w")["GPUSLICE_DEVICE"] == await device_of(kube, namespace, "w")

    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/w")
    await gone(kube, namespace, ["w"])
    assert node.checkpoints() == []
    assert node.cdi_specs() == []


async def test_killed_between_mig_creation_and_the_checkpoint_the_instance_is_not_leaked(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    node = await plugin_node("a100-40gb", 1)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "mig", "mig": {"profiles": ["3g.20gb"]}})
    await published(kube, node.name, 2)
    await node.agent.stop()
    await node.start_agent(kill_at="prepare-mig-created")
    await create_pods(kube, namespace, "gpu-slice", ["m"])
    await killed_at(node, "prepare-mig-created")
    [made] = node.mig_instances()
    assert made[0] == "3g.20gb"
    assert node.checkpoints()[0]["phase"] == "started"

    await node.start_agent()
    await running(kube, namespace, ["m"], within=90)
    assert "mig_instances_destroyed" in node.agent_log or "unfinished_prepares_undone" in node.agent_log
    assert len(node.mig_instances()) == 1, "the instance of the killed prepare was destroyed, not leaked"
    [checkpoint] = node.checkpoints()
    assert checkpoint["phase"] == "completed"
    assert node.mig_instances() == [(checkpoint["devices"][0]["mig"]["profile"],
                                     checkpoint["devices"][0]["mig"]["start"])]

    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/m")
    await gone(kube, namespace, ["m"])
    await until(lambda: node.mig_instances() == [], what="the instance to be destroyed on unprepare")


# No MIG instance, so nothing of the GPU backend's: on the fake backend only (the CI's time).
@pytest.mark.gpu_backends("fake")
async def test_kubelet_and_agent_away_past_the_wipe_pods_keep_their_devices(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str, cluster: Any,
) -> None:
    """The kubelet wipes a driver's slices 30 s after its plugin went away, and all of a node's slices
    when it starts. The agent then publishes again, and a device a claim holds in its old shape (a
    resize is pending) comes back exactly as it was, although nothing live remembers it."""
    node = await plugin_node("h100-80gb", 1)
    policy = await tenant_policy(make_policy, namespace, node.name, {"mode": "memory", "sliceSize": "10G"})
    await published(kube, node.name, 8)
    await create_pods(kube, namespace, "gpu-slice", ["keep"])
    await running(kube, namespace, ["keep"])
    held = await device_of(kube, namespace, "keep")
    before = (await pool_devices(kube, node.name))[held]
    env_before = exec_env(cluster, namespace, "keep")

    await kube.merge_patch(f"/apis/gpuslice.dev/v1alpha1/gpuslicepolicies/{policy}",
                           {"spec": {"slicing": {"sliceSize": "20G"}}})

    async def resized() -> bool:
        devices = await pool_devices(kube, node.name)
        return held in devices and sum("-20g-" in n for n in devices) == 4 and len(devices) == 5

    # Four 20G slices next to the held 10G one, under the GPU's one counter set.
    await wait_for(resized, within=60, what="the resize to apply around the held 10G slice")

    await node.kill_agent()

    async def wiped() -> bool:
        return not await pool_devices(kube, node.name)

    await wait_for(wiped, within=75, what="the kubelet to wipe the slices of the plugin that went away")
    await node.runner.stop()  # and the kubelet restarts, away for a while too
    await asyncio.sleep(1)  # length: the kubelet's absence
    await node.runner.start()
    await node.runner.wait_healthy()
    await node.start_agent()

    async def back() -> dict[str, Any] | None:
        devices = await pool_devices(kube, node.name)
        return devices if held in devices and len(devices) == 5 else None

    after = await wait_for(back, within=60, what="the agent to publish the pool again, the held device included")
    assert after[held]["consumesCounters"] == before["consumesCounters"], "an allocated device never changes"
    assert after[held]["attributes"] == before["attributes"]
    assert [t["key"] for t in after[held].get("taints") or []] == ["gpuslice.dev/pending-change"]
    assert await device_of(kube, namespace, "keep") == held
    await running(kube, namespace, ["keep"])
    assert exec_env(cluster, namespace, "keep") == env_before

    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/keep")
    await gone(kube, namespace, ["keep"])

    async def applied() -> bool:
        devices = await pool_devices(kube, node.name)
        return len(devices) == 4 and all("-20g-" in n for n in devices)

    await wait_for(applied, within=60, what="the held change to apply once the claim is gone")


async def test_concurrent_dynamic_mig_pods_never_share_a_placement(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    a100, h100 = await plugin_node("a100-40gb", 1), await plugin_node("h100-80gb", 1)
    await tenant_policy(make_policy, namespace, a100.name, {"mode": "mig", "mig": {"profiles": ["1g.5gb"]}},
                        "-a", "a100")
    await tenant_policy(make_policy, namespace, h100.name, {"mode": "mig", "mig": {"profiles": ["1g.10gb"]}},
                        "-h", "h100")
    await published(kube, a100.name, 7)
    await published(kube, h100.name, 7)
    small, large = [f"a{i}" for i in range(7)], [f"h{i}" for i in range(7)]
    await asyncio.gather(create_pods(kube, namespace, "a100", small), create_pods(kube, namespace, "h100", large))
    await running(kube, namespace, small + large, within=180)
    for node, profile in ((a100, "1g.5gb"), (h100, "1g.10gb")):
        instances = node.mig_instances()
        assert instances == [(profile, start) for start in range(7)], "seven instances, each at its own placement"
        assert len({c["devices"][0]["mig"]["start"] for c in node.checkpoints()}) == 7

    for pod in small + large:
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    await gone(kube, namespace, small + large, within=120)
    await until(lambda: a100.mig_instances() == [] and h100.mig_instances() == [],
                what="every instance to be destroyed after its pod went")


async def test_what_no_one_will_unprepare_is_cleaned_up_by_the_agent_itself(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    """The kubelet lost its own record (its state directory) while the agent was down after a kill
    mid-prepare, and the pods were force-deleted: no one will call unprepare. At restart the agent
    undoes the unfinished prepare (its MIG instance and checkpoint) and unprepares the completed claim
    whose ResourceClaim is gone."""
    node = await plugin_node("a100-40gb", 1)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "mig", "mig": {"profiles": ["3g.20gb"]}})
    await published(kube, node.name, 2)
    await create_pods(kube, namespace, "gpu-slice", ["done"])
    await running(kube, namespace, ["done"])
    await node.agent.stop()
    await node.start_agent(kill_at="prepare-mig-created")
    await create_pods(kube, namespace, "gpu-slice", ["half"])
    await killed_at(node, "prepare-mig-created")
    assert len(node.mig_instances()) == 2
    assert sorted(c["phase"] for c in node.checkpoints()) == ["completed", "started"]

    await node.runner.stop()
    import shutil

    shutil.rmtree(node.root / "dra-state")
    for pod in ("done", "half"):
        await kube.delete(f"/api/v1/namespaces/{namespace}/pods/{pod}", gracePeriodSeconds=0)

    async def claims_gone() -> bool:
        return not await kube.list(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims")

    await wait_for(claims_gone, within=60, what="the resourceclaim controller to delete the pods' claims")
    await node.runner.start()
    await node.runner.wait_healthy()
    await node.start_agent()
    await until(lambda: node.mig_instances() == [] and node.checkpoints() == [] and node.cdi_specs() == [],
                what="the agent to undo the unfinished prepare and unprepare the claim that is gone")


async def test_killed_after_destroying_the_instance_at_unprepare_the_retry_finishes(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    node = await plugin_node("a100-40gb", 1)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "mig", "mig": {"profiles": ["3g.20gb"]}})
    await published(kube, node.name, 2)
    await node.agent.stop()
    await node.start_agent(kill_at="unprepare-mig-destroyed")
    await create_pods(kube, namespace, "gpu-slice", ["u"])
    await running(kube, namespace, ["u"])
    assert len(node.mig_instances()) == 1
    await kube.delete(f"/api/v1/namespaces/{namespace}/pods/u")
    await killed_at(node, "unprepare-mig-destroyed")
    assert node.mig_instances() == []
    assert [c["phase"] for c in node.checkpoints()] == ["completed"], "killed before the checkpoint went"

    await node.start_agent()
    await gone(kube, namespace, ["u"], within=90)  # the kubelet retries unprepare, which now finishes
    assert node.checkpoints() == []
    assert node.cdi_specs() == []
    assert node.mig_instances() == []


async def test_checkpoints_from_before_a_reboot_are_undone_not_answered_from(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, plugin_node: PluginNodeFactory,
    namespace: str,
) -> None:
    """A node booted again (its kernel's boot ID changed): the dynamic MIG instance and CDI spec a
    completed checkpoint records did not survive on a real GPU, so recovery undoes the checkpoint
    (the fake GPU's instance, which did survive, is destroyed) rather than let the kubelet's next
    prepare be answered from it."""
    node = await plugin_node("a100-40gb", 1)
    await tenant_policy(make_policy, namespace, node.name, {"mode": "mig", "mig": {"profiles": ["3g.20gb"]}})
    await published(kube, node.name, 2)
    await node.agent.stop()
    await node.start_agent(boot_id="boot-before")
    await create_pods(kube, namespace, "gpu-slice", ["m"])
    await running(kube, namespace, ["m"], within=90)
    [checkpoint] = node.checkpoints()
    assert (checkpoint["version"], checkpoint["phase"], checkpoint["boot_id"]) == (2, "completed", "boot-before")
    assert len(node.mig_instances()) == 1
    assert len(node.cdi_specs()) == 1

    await node.agent.stop()
    await node.start_agent(boot_id="boot-after")
    # Healthy is the agent's loops running; its kubelet plugin recovers beside them.
    async def recovered() -> bool:
        return "the node booted since these claims were prepared" in node.agent_log
    await wait_for(recovered, within=60, what="recovery to undo the checkpoints of the earlier boot")
    assert node.checkpoints() == []
    assert node.cdi_specs() == []
    assert node.mig_instances() == [], "what the checkpoint recorded is undone"
