"""What the API server serves, read from discovery the way kubectl does."""

from __future__ import annotations

from gpuslice.coordinates import APIS, group_version_path
from gpuslice.kube.client import KubeClient


async def served_resources(kube: KubeClient, group: str) -> dict[str, list[str]]:
    """``{version: [resource, ...]}`` for ``group``; subresources left out."""
    groups = await kube.get(APIS)
    versions = next(
        ([v["version"] for v in g.get("versions", [])] for g in groups.get("groups", [])
         if g["name"] == group),
        [],
    )
    served: dict[str, list[str]] = {}
    for version in versions:
        listing = await kube.get(group_version_path(f"{group}/{version}"))
        served[version] = sorted(
            r["name"] for r in listing.get("resources", []) if "/" not in r["name"]
        )
    return served
