"""Cluster objects as the API server holds them, made with the agent's own planner: the slices a
node publishes for some policies, claims that hold its devices, policies with a status."""

from __future__ import annotations

from functools import partial
from typing import Any

from gpuslice.agent.gpus.fake import FakeBackend, parse_fake_gpus
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.dra.resourceslice import resource_slice
from gpuslice.inventory.catalog import MODELS
from gpuslice.inventory.gpus import Gpu
from gpuslice.inventory.systems import SYSTEMS
from gpuslice.planning.devices import gpu_tag
from gpuslice.planning.node.node_pool import plan_node_pool
from gpuslice.planning.reads.occupancy import GpuMap
from gpuslice.planning.reads.status_report import Snapshot, status_report
from tests.builders import policy

Body = dict[str, Any]
# A policy the controller found valid and ready at its generation (the agent plans only those).
policy_body = partial(policy, generation=1, judged=True, ready=True)


def gpus(node: str, model: str, count: int = 1) -> list[Gpu]:
    """``count`` GPUs of catalog ``model``, or a whole system's (``dgx-h100``: inventory.systems)."""
    return FakeBackend(node, parse_fake_gpus(model) if model in SYSTEMS else [(model, count)]).discover()


def node_body(name: str, model: str, count: int, **labels: str) -> Body:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": {
        "kubernetes.io/hostname": name, "gpuslice.dev/gpu-backend": "fake", "gpuslice.dev/fake-gpu-model": model,
        "gpuslice.dev/fake-gpu-count": str(count), **labels}}}


def published(node: str, model: str, count: int, policies: list[Body], generation: int = 1) -> list[Body]:
    """The ResourceSlices the node's agent publishes for ``policies``."""
    parsed = [GpuSlicePolicy.from_body(p) for p in policies]
    plan = plan_node_pool({"kubernetes.io/hostname": node}, gpus(node, model, count), parsed)
    return [resource_slice(node, f"uid-{node}", s.suffix, generation, len(plan.slices),
                           shared_counters=list(s.shared_counters), devices=list(s.devices)) for s in plan.slices]


def devices_of(slices: list[Body]) -> list[Body]:
    return [d for s in slices for d in s["spec"].get("devices") or []]


def taint(slices: list[Body], names: set[str], key: str, value: str = "", effect: str = "NoSchedule") -> None:
    for device in devices_of(slices):
        if device["name"] in names:
            device.setdefault("taints", []).append({"key": key, **({"value": value} if value else {}),
                                                    "effect": effect})


def claim(namespace: str, name: str, devices: list[tuple[str, str]], pods: tuple[str, ...] = (),
          consumed: str | None = None, admin: bool = False, class_name: str = "") -> Body:
    """A claim allocated (pool, device) pairs, reserved for ``pods``."""
    results = [{"request": "gpu", "driver": "gpu.gpuslice.dev", "pool": pool, "device": device,
                **({"consumedCapacity": {"memory": consumed}} if consumed else {}),
                **({"adminAccess": True} if admin else {})} for pool, device in devices]
    return {"metadata": {"namespace": namespace, "name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class_name}}]}},
            "status": {"allocation": {"devices": {"results": results}},
                       "reservedFor": [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods]}}


H100 = MODELS["h100-80gb"].memory
INFERENCE = policy_body("inference", {"mode": "memory", "sliceSize": "10G", "allowFullGpu": True},
                        tenants=[{"namespace": "team-a", "maxSlices": 8, "maxFullGpus": 1},
                                 {"namespace": "team-b", "maxSlices": 4}])


def tag(node: str, model: str = "h100-80gb", index: int = 0) -> str:
    return gpu_tag(gpus(node, model, index + 1)[index].uuid)


def only_gpu(snapshot: Snapshot) -> GpuMap:
    [gpu] = status_report(snapshot).map.gpus
    return gpu


def overusing(body: dict[str, Any], message: str) -> dict[str, Any]:
    """The node agent's condition on the claim's device (agent/usage/actions.py)."""
    [result] = body["status"]["allocation"]["devices"]["results"]
    body["status"]["devices"] = [{"driver": "gpu.gpuslice.dev", "pool": result["pool"], "device": result["device"],
                                  "conditions": [{"type": "GpuMemoryOveruse", "status": "True",
                                                  "reason": "OverAllocation", "message": message}]}]
    return body
