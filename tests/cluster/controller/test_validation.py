"""Semantic validation against the fake GPU nodes (H100 80GB): Valid=False with a reason,
an Event, and nothing already created changes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import POLICIES, condition, get_or_none, template_path, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.tenancy import valid_condition

NODE_1 = {"matchLabels": {"kubernetes.io/hostname": "gpu-node-1"}}
NODE_2 = {"matchLabels": {"kubernetes.io/hostname": "gpu-node-2"}}


async def events_for(kube: KubeClient, name: str) -> list[dict[str, Any]]:
    return [e for e in await kube.list("/api/v1/namespaces/default/events") if e["involvedObject"]["name"] == name]


async def warnings_once_posted(kube: KubeClient, name: str) -> list[dict[str, Any]]:
    """The policy's Warning events, once there is one (the controller posts after the status patch)."""
    async def posted() -> list[dict[str, Any]]:
        return [e for e in await events_for(kube, name) if e["type"] == "Warning"]

    found: list[dict[str, Any]] = await wait_for(posted, what=f"a Warning event on {name}")
    return found


async def test_invalid_edit_is_reported_and_changes_nothing(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespaces: Callable[..., Awaitable[str]],
) -> None:
    a, b = await namespaces("a"), await namespaces("b")
    name = (await make_policy({"nodeSelector": NODE_1, "slicing": {"mode": "memory", "sliceSize": "10Gi"},
                               "tenants": [{"namespace": a}]}))["metadata"]["name"]
    await valid_condition(kube, name, "True")
    body = await kube.get(f"{POLICIES}/{name}")
    assert (body["status"]["nodes"], body["status"]["gpus"]) == (1, 8)
    template = await wait_for(lambda: get_or_none(kube, template_path(a)), what="template in a")

    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"slicing": {"sliceSize": "100Gi"},
                                                          "tenants": [{"namespace": b}]}})
    invalid = await valid_condition(kube, name, "False")
    assert invalid["reason"] == "SliceLargerThanGpu"
    assert "sliceSize 100Gi is larger than NVIDIA H100 80GB HBM3 on" in invalid["message"]
    assert "(81559Mi), which the policy selects" in invalid["message"]
    assert "at most 81559Mi" in invalid["message"]
    body = await kube.get(f"{POLICIES}/{name}")
    assert condition(body, "Ready")["reason"] == "InvalidSpec"

    still = await get_or_none(kube, template_path(a))
    assert still is not None
    assert still["metadata"]["resourceVersion"] == template["metadata"]["resourceVersion"]
    assert await get_or_none(kube, template_path(b)) is None, "an invalid spec creates nothing"
    warnings = await warnings_once_posted(kube, name)
    assert [(e["reason"], e["count"]) for e in warnings] == [("SliceLargerThanGpu", 1)]

    await kube.merge_patch(f"{POLICIES}/{name}", {"spec": {"slicing": {"sliceSize": "20Gi"}}})
    await valid_condition(kube, name, "True")
    await wait_for(lambda: get_or_none(kube, template_path(b)), what="template in b once valid again")


async def test_mig_profile_the_gpu_does_not_have(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
) -> None:
    name = (await make_policy({"nodeSelector": NODE_1,
                               "slicing": {"mode": "mig", "mig": {"profiles": ["1g.10gb", "1g.5gb"]}}}))["metadata"]["name"]
    invalid = await valid_condition(kube, name, "False")
    assert invalid["reason"] == "UnknownMigProfile"
    assert "MIG profile 1g.5gb does not exist on NVIDIA H100 80GB HBM3" in invalid["message"]
    assert "1g.10gb" in invalid["message"].split("offers", 1)[1]
    assert await get_or_none(kube, f"/apis/resource.k8s.io/v1/deviceclasses/{name}.gpuslice.dev") is None


async def test_newer_policy_conflicting_on_the_same_gpus_yields(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
) -> None:
    older = (await make_policy({"nodeSelector": NODE_2, "slicing": {"mode": "memory", "sliceSize": "10Gi"}},
                               suffix="-old"))["metadata"]["name"]
    await valid_condition(kube, older, "True")
    await asyncio.sleep(1.1)  # length: creation times have one-second resolution: make "older" older by the clock
    newer = (await make_policy({"nodeSelector": NODE_2, "slicing": {"mode": "shared", "sliceSize": "10Gi"}},
                               suffix="-new"))["metadata"]["name"]
    invalid = await valid_condition(kube, newer, "False")
    assert invalid["reason"] == "ConflictingPolicy"
    assert f"older GpuSlicePolicy {older} (memory mode) select the same GPUs (e.g. on gpu-node-2)" in invalid["message"]
    assert (await valid_condition(kube, older, "True"))["reason"] == "SpecValid"
    assert [e["reason"] for e in await warnings_once_posted(kube, newer)] == ["ConflictingPolicy"]


async def test_two_memory_policies_share_gpus(
    kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
) -> None:
    first = (await make_policy({"nodeSelector": NODE_2, "slicing": {"mode": "memory", "sliceSize": "10Gi"}},
                               suffix="-10"))["metadata"]["name"]
    second = (await make_policy({"nodeSelector": NODE_2, "slicing": {"mode": "memory", "sliceSize": "20Gi"}},
                                suffix="-20"))["metadata"]["name"]
    await valid_condition(kube, first, "True")
    await valid_condition(kube, second, "True")
