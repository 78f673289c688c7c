"""MIG layouts as a node publishes them: its devices by GPU, each GPU's layout, and a GPU taken out
of service."""

from __future__ import annotations

from typing import Any

from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import POLICIES, wait_for

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


async def degraded_as(kube: KubeClient, policy: str, reason: str, within: float = 60) -> dict[str, Any]:
    async def degraded() -> dict[str, Any] | None:
        conditions = (await kube.get(f"{POLICIES}/{policy}")).get("status", {}).get("conditions") or []
        found = next((c for c in conditions if c["type"] == "Degraded"), None)
        return found if found and found["reason"] == reason else None

    found: dict[str, Any] = await wait_for(degraded, within=within, what=f"the policy's Degraded reason {reason}")
    return found
