"""``gpuslice plan --cluster``: what an edit would do, said before it is applied, and then done by the agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient
from tests.cluster.cli import Cli
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import POLICIES, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import create_pods, pool, pool_devices, published, settle

PENDING = "gpuslice.dev/pending-change"


async def test_a_resize_is_previewed_without_a_write_and_the_agent_then_does_exactly_that(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, gpuslice: Cli, tmp_path: Path,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    spec = {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
            "slicing": {"mode": "memory", "sliceSize": "10G"}, "tenants": [{"namespace": namespace}]}
    policy = await make_policy(spec)
    name = policy["metadata"]["name"]
    before = await published(kube, node.name, 8)
    await create_pods(kube, namespace, "gpu-slice", ["keep-0", "keep-1"])
    results = await settle(cluster, kube, namespace, ["keep-0", "keep-1"], 2)
    allocated = sorted(r["device"] for r in results)

    edit = tmp_path / "edit.yaml"
    edit.write_text(yaml.safe_dump({"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
                                    "metadata": {"name": name},
                                    "spec": {**spec, "slicing": {"mode": "memory", "sliceSize": "20G"}}}))
    versions = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in await pool(kube, node.name)}
    # The policy's spec and generation, not its resourceVersion: the controller may write its status
    # meanwhile (it counts the two allocations when its status check comes round).
    old = await kube.get(f"{POLICIES}/{name}")
    [plan] = (await gpuslice("plan", "--cluster", "-f", str(edit), "-o", "json")).json()
    text = await gpuslice("plan", "--cluster", "-f", str(edit))
    assert text.rc == 0, text.stderr

    [change] = [n for n in plan["nodes"] if n["node"] == node.name]
    assert sorted(h["name"] for h in change["held"]) == allocated
    assert sorted(h["holders"][0]["who"] for h in change["held"]) == [f"{namespace}/keep-0", f"{namespace}/keep-1"]
    assert sorted(change["drainRemove"]) == sorted(set(before) - set(allocated))
    added = sorted(change["added"])
    # 85.5 G holds four 20 G slices; all are published next to the held ones (one counter set guards the sum).
    assert len(added) == 4
    assert all("-20g-" in d for d in added)
    assert f"hold {allocated[0]} as it is until {namespace}/keep-" in text.stdout
    assert {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in await pool(kube, node.name)} == \
        versions, "a plan writes nothing"
    now = await kube.get(f"{POLICIES}/{name}")
    assert (now["metadata"]["generation"], now["spec"]) == (old["metadata"]["generation"], old["spec"])

    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"slicing": {"sliceSize": "20G"}}})

    async def done() -> dict[str, dict[str, Any]] | None:
        devices = await pool_devices(kube, node.name)
        return devices if set(devices) == set(added) | set(allocated) else None

    devices = await wait_for(done, within=90, what="the agent to publish what the plan said")
    assert sorted(n for n, d in devices.items() if any(t["key"] == PENDING for t in d.get("taints") or [])) == \
        allocated

    async def held_on_the_map() -> list[dict[str, Any]] | None:
        status = (await gpuslice("status", "-o", "json")).json()
        [gpu] = next(n for n in status["map"]["nodes"] if n["name"] == node.name)["gpus"]
        held = [s for s in gpu["segments"] if s["state"] == "held"]
        return held if len(held) == 2 else None

    held = await wait_for(held_on_the_map, within=30, what="the map to show the two held slices")
    assert sorted(s["holder"]["who"] for s in held) == [f"{namespace}/keep-0", f"{namespace}/keep-1"]


async def test_a_new_policy_that_conflicts_is_refused_in_the_plan(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory, gpu_node: GpuNodeFactory,
    namespace: str, gpuslice: Cli, tmp_path: Path, unique: str,
) -> None:
    node = await gpu_node("h100-80gb", 1)
    selector = {"matchLabels": {"kubernetes.io/hostname": node.name}}
    await make_policy({"nodeSelector": selector, "slicing": {"mode": "memory", "sliceSize": "10G"},
                       "tenants": [{"namespace": namespace}]})
    await published(kube, node.name, 8)
    newcomer = tmp_path / "new.yaml"
    newcomer.write_text(yaml.safe_dump({"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
                                        "metadata": {"name": f"new-{unique}"},
                                        "spec": {"nodeSelector": selector, "slicing": {"mode": "shared",
                                                                                       "sliceSize": "10G"}}}))
    [plan] = (await gpuslice("plan", "--cluster", "-f", str(newcomer), "-o", "json")).json()
    assert plan["new"] is True
    assert [p["reason"] for p in plan["problems"]] == ["ConflictingPolicy"]
    text = await gpuslice("plan", "--cluster", "-f", str(newcomer))
    assert "ConflictingPolicy" in text.stdout
