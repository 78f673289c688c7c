"""Ask the API server what it serves, and judge it against what gpuslice needs (``dra.support``)."""

from __future__ import annotations

from typing import Any

from gpuslice.coordinates import SLICES, node_path
from gpuslice.dra.names import DRIVER
from gpuslice.dra.support import Verdict, dropped, judge_features, judge_server, probe_devices
from gpuslice.kube.client import AlreadyExists, KubeClient, KubeError
from gpuslice.kube.discovery import served_resources


async def check_server(kube: KubeClient) -> Verdict:
    """The server's version and the ``resource.k8s.io`` versions it serves."""
    version = await kube.get("/version")
    return judge_server(version, await served_resources(kube, "resource.k8s.io"))


def _probe_slice(node: str, suffix: str, uid: str, **content: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"gpuslice-{node}-{suffix}",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 0,
                                                                   "resourceSliceCount": 2}, **content}}


async def check_fields(kube: KubeClient, node: str, verdict: Verdict) -> Verdict:
    """Dry-run the node's own slices with every field gpuslice writes and see which the server drops
    (a feature gate that is off drops its fields without an error). Slice names the pool does not use
    (``-99``), which the agents' own-node rule allows; nothing is stored."""
    uid = str((await kube.get(node_path(node)))["metadata"].get("uid", ""))
    counters, devices = probe_devices()
    returned: list[dict[str, Any] | None] = []
    for suffix, content in (("counters-99", {"sharedCounters": counters}), ("devices-99", {"devices": devices})):
        try:
            returned.append(await kube.create(SLICES, _probe_slice(node, suffix, uid, **content), dryRun="All"))
        except AlreadyExists:
            returned.append(None)  # a pool with 99 slices is not ours to judge by; the other one says enough
        except KubeError as error:
            if error.transient:
                raise  # not an answer about the fields: asked again
            return judge_features(Verdict(verdict.version, (*verdict.problems, (
                f"the server refuses a dry-run ResourceSlice with the fields gpuslice writes: {error.message}"),),
                verdict.warnings), [])
    counter_slice, device_slice = returned
    if device_slice is None:
        return verdict
    return judge_features(verdict, dropped(counter_slice, device_slice))
