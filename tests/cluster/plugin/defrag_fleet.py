"""A fragmented fake node for the defragmentation tests: three H100s cut in 20G slices (four a GPU),
Deployments (one replica each) and bare pods placed GPU by GPU by the real scheduler, which takes
the first free device, with filler pods holding the rest until the layout is made."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import PAUSE_IMAGE, pod_claim, pod_with_claim, wait_for
from tests.cluster.operator_fixtures import PolicyFactory
from tests.cluster.plugin.plugin_nodes import PluginNode, gone, running
from tests.cluster.pools import SLICES, tag

GPUS = 3
SLICING = {"mode": "memory", "sliceSize": "20G", "allowFullGpu": True}
APPS = "/apis/apps/v1"
Entry = tuple[str, str]  # ("dep" | "bare", name)


def deployment(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name, **(labels or {})}}, "spec": {
                         "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "work", "image": PAUSE_IMAGE,
                                         "resources": {"claims": [{"name": "gpu"}]}}],
                         "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu-slice"}]}}}}


async def pods_of(kube: KubeClient, namespace: str, app: str) -> list[dict[str, Any]]:
    return [p for p in await kube.list(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"app={app}")
            if not p["metadata"].get("deletionTimestamp")]


async def app_pod(kube: KubeClient, namespace: str, app: str) -> str:
    """The Running pod of Deployment ``app``, once there is one."""
    async def check() -> str | None:
        found = [p for p in await pods_of(kube, namespace, app) if (p.get("status") or {}).get("phase") == "Running"]
        return str(found[0]["metadata"]["name"]) if len(found) == 1 else None

    name: str = await wait_for(check, within=90, what=f"the pod of Deployment {namespace}/{app} to run")
    return name


@dataclass
class Fragmented:
    kube: KubeClient
    cluster: DevCluster
    node: PluginNode
    policy: str
    placed: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # name -> (namespace, pod, GPU)

    async def gpu_of(self, namespace: str, pod: str) -> int:
        claim = await pod_claim(self.kube, namespace, pod)
        assert claim is not None
        [result] = claim["status"]["allocation"]["devices"]["results"]
        tags = {tag(self.node.name, index=i): i for i in range(GPUS)}
        return tags[str(result["device"]).split("-")[0] + "-" + str(result["device"]).split("-")[1]]

    async def lay_out(self, layout: Sequence[Sequence[tuple[str, str, str]]]) -> None:
        """GPU by GPU (in the scheduler's order of devices, not of indexes), each entry ("dep" or "bare",
        name, namespace) in turn, the GPU's other slices held by fillers while the next GPUs fill; then
        the fillers go."""
        fillers: list[tuple[str, str]] = []
        for index, entries in enumerate(layout):
            for kind, name, namespace in entries:
                if kind == "dep":
                    await self.kube.create(f"{APPS}/namespaces/{namespace}/deployments", deployment(name))
                    pod = await app_pod(self.kube, namespace, name)
                else:
                    await self.kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim(name, "gpu-slice"))
                    await running(self.kube, namespace, [name], within=90)
                    pod = name
                self.placed[name] = (namespace, pod, await self.gpu_of(namespace, pod))
            namespace = entries[0][2] if entries else next(iter(self.placed.values()))[0]
            for k in range(4 - len(entries)):
                filler = f"filler-{index}-{k}"
                await self.kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim(filler, "gpu-slice"))
                await running(self.kube, namespace, [filler], within=90)
                fillers.append((namespace, filler))
        for namespace, filler in fillers:
            await self.kube.delete(f"/api/v1/namespaces/{namespace}/pods/{filler}")
        for namespace, filler in fillers:
            await gone(self.kube, namespace, [filler], within=90)
        groups = [{self.placed[name][2] for _, name, _ in entries} for entries in layout]
        assert all(len(g) == 1 for g in groups), self.placed  # the scheduler takes the GPUs in device order
        assert len(set.union(*groups)) == len(layout), self.placed

    def gpu(self, name: str) -> int:
        """The index of the GPU that the layout put ``name`` on."""
        return self.placed[name][2]

    async def uids(self, namespaces: Sequence[str]) -> dict[str, str]:
        """Every live pod of ``namespaces``, name -> UID."""
        found = {}
        for namespace in namespaces:
            for pod in await self.kube.list(f"/api/v1/namespaces/{namespace}/pods"):
                if not pod["metadata"].get("deletionTimestamp"):
                    found[f"{namespace}/{pod['metadata']['name']}"] = pod["metadata"]["uid"]
        return found

    async def defrag_tainted(self) -> list[str]:
        return [d["name"] for s in await self.kube.list(SLICES, fieldSelector=f"spec.nodeName={self.node.name}")
                for d in s["spec"].get("devices") or []
                if any(t.get("key") == "gpuslice.dev/defrag" for t in d.get("taints") or [])]

    async def deployments_ready(self, namespace: str, names: Sequence[str]) -> None:
        async def check() -> bool:
            for name in names:
                status = (await self.kube.get(f"{APPS}/namespaces/{namespace}/deployments/{name}")).get("status") or {}
                if status.get("availableReplicas") != 1 or status.get("replicas") != 1:
                    return False
            return True

        await wait_for(check, within=120, what=f"Deployments {', '.join(names)} back at their replicas")

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpuslice", "defrag", "--kubeconfig", str(self.cluster.kubeconfig),
                               *args], capture_output=True, text=True, check=False, timeout=timeout)

    def plan_json(self, *args: str) -> list[dict[str, Any]]:
        done = self.cli("-o", "json", *args)
        assert done.returncode == 0, done.stderr
        plans: list[dict[str, Any]] = json.loads(done.stdout)["plans"]
        return plans

    async def ended(self) -> dict[str, Any] | None:
        """status.defragmentation once a move has ended there (its outcome in ``last``)."""
        found = (await self.policy_status()).get("defragmentation") or {}
        return dict(found) if found.get("last") else None

    async def policy_status(self) -> dict[str, Any]:
        from tests.cluster.kubeutil import POLICIES

        return dict((await self.kube.get(f"{POLICIES}/{self.policy}")).get("status") or {})


async def make_fragmented(kube: KubeClient, cluster: DevCluster, node: PluginNode, make_policy: PolicyFactory,
                          tenants: Sequence[str], spec: dict[str, Any] | None = None, gpus: int = GPUS) -> Fragmented:
    body = await make_policy({"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
                              "slicing": SLICING, "tenants": [{"namespace": t} for t in tenants], **(spec or {})})

    async def templates() -> bool:
        for namespace in tenants:
            try:
                await kube.get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates/gpu-slice-full")
            except KubeError:
                return False
        return True

    await wait_for(templates, within=60, what="the claim templates")

    async def published() -> bool:
        devices = [d for s in await kube.list(SLICES, fieldSelector=f"spec.nodeName={node.name}")
                   for d in s["spec"].get("devices") or []]
        return len(devices) == gpus * 5

    await wait_for(published, within=60, what="H100s in 20G slices and whole GPUs published")
    return Fragmented(kube, cluster, node, str(body["metadata"]["name"]))
