"""Helpers for the tests of each pod's GPU use on fake nodes (tests/cluster/plugin/test_usage.py and
its neighbours): a process put on a fake GPU in a pod, as the agent's --host-proc sees it, the agent's
metrics waited for, and the overuse mark read from a claim."""

from __future__ import annotations

from typing import Any

from gpuslice.kube.client import KubeClient
from tests.cluster.kubeutil import PAUSE_IMAGE, RESOURCE, pod_claim, wait_for
from tests.cluster.plugin.plugin_nodes import PluginNode

FAST = ["--usage-interval=1", "--overuse-grace=2"]


async def pod_uid(kube: KubeClient, namespace: str, pod: str) -> str:
    return str((await kube.get(f"/api/v1/namespaces/{namespace}/pods/{pod}"))["metadata"]["uid"])


def in_pod(node: PluginNode, pid: int, uid: str | None) -> None:
    """Make ``pid`` a process of the pod with ``uid`` as the agent sees it (None: a host process): its
    cgroup, in the systemd driver's form, where the agent's --host-proc reads it."""
    proc = node.root / "proc" / str(pid)
    proc.mkdir(parents=True, exist_ok=True)
    path = ("/system.slice/containerd.service" if uid is None else
            f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid.replace('-', '_')}.slice"
            f"/cri-containerd-{pid:064x}.scope")
    (proc / "cgroup").write_text(f"0::{path}\n")


async def use(node: PluginNode, kube: KubeClient, namespace: str, pod: str, pid: int, memory: str,
              sm: float = 0) -> None:
    in_pod(node, pid, await pod_uid(kube, namespace, pod))
    node.fake_gpu("use", "0", "--pid", str(pid), "--memory", memory, "--sm", str(sm))


async def metric_is(node: PluginNode, name: str, labels: dict[str, str], value: float | None,
                    within: float = 30) -> None:
    async def check() -> bool:
        return await node.metric(name, labels) == value

    await wait_for(check, within=within, what=f"{name}{labels} to be {value}")


async def overuse_entry(kube: KubeClient, namespace: str, pod: str) -> dict[str, Any] | None:
    """The device entry of the pod's claim that carries the agent's overuse mark."""
    claim = await pod_claim(kube, namespace, pod)
    for device in ((claim or {}).get("status") or {}).get("devices") or []:
        if any(c["type"] == "GpuMemoryOveruse" for c in device.get("conditions") or []):
            return dict(device)
    return None


async def claim_condition(kube: KubeClient, namespace: str, pod: str) -> dict[str, Any] | None:
    entry = await overuse_entry(kube, namespace, pod)
    return next(c for c in entry["conditions"] if c["type"] == "GpuMemoryOveruse") if entry else None


async def claim_mark(kube: KubeClient, namespace: str, claim: str) -> dict[str, Any] | None:
    """The device entry of a claim named in its pods' spec (no template: several pods share it) that
    carries the agent's overuse mark."""
    body = await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim}")
    for device in (body.get("status") or {}).get("devices") or []:
        if any(c["type"] == "GpuMemoryOveruse" for c in device.get("conditions") or []):
            return dict(device)
    return None


def shared_claim(name: str, device_class: str) -> dict[str, Any]:
    """A claim made on its own, for pods to name in their spec: all of them share its one allocation."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}}


def pod_sharing(name: str, claim: str) -> dict[str, Any]:
    """A pod whose container ``c`` uses the claim ``claim`` (made on its own, shared with other pods)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]}}
