"""MIG layouts as a node publishes them: its devices by GPU, each GPU's layout, a GPU taken out of
service, and a node whose GPUs settled on the layouts wanted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import POLICIES, wait_for
from tests.cluster.plugin.plugin_nodes import PluginNode
from tests.cluster.pools import pool_devices

RECONFIGURING = "gpuslice.dev/reconfiguring"


def by_gpu(devices: dict[str, dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    found: dict[int, list[dict[str, Any]]] = {}
    for device in devices.values():
        found.setdefault(device["attributes"]["gpuslice.dev/index"]["int"], []).append(device)
    return found


def layout_of(devices: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return sorted((d["attributes"]["gpuslice.dev/profile"]["string"], d["attributes"]["gpuslice.dev/placementStart"]["int"])
                  for d in devices)


def taint_keys(devices: list[dict[str, Any]]) -> set[str]:
    return {t["key"] for d in devices for t in d.get("taints") or []}


async def degraded_as(kube: KubeClient, policy: str, reason: str, within: float = 60,
                      saying: Callable[[str], bool] = lambda message: True) -> dict[str, Any]:
    """The policy's Degraded condition once it has ``reason`` and a message ``saying`` holds of (a
    status is refreshed on the controller's timer: an older message may stand a few seconds)."""
    async def degraded() -> dict[str, Any] | None:
        conditions = (await kube.get(f"{POLICIES}/{policy}")).get("status", {}).get("conditions") or []
        found = next((c for c in conditions if c["type"] == "Degraded"), None)
        return found if found and found["reason"] == reason and saying(found["message"]) else None

    found: dict[str, Any] = await wait_for(degraded, within=within, what=f"the policy's Degraded reason {reason}")
    return found


async def settled(kube: KubeClient, node: PluginNode, gpus: dict[int, list[tuple[str, int]]], within: float = 90) -> None:
    """Every GPU publishes exactly the wanted instances, untainted, and really has them."""
    async def check() -> bool:
        published = by_gpu(await pool_devices(kube, node.name))
        return all(layout_of(published.get(i, [])) == want and not taint_keys(published.get(i, []))
                   and node.mig_instances(i) == want for i, want in gpus.items())

    await wait_for(check, within=within, what=f"the GPUs to have and publish {gpus}")
