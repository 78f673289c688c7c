"""Small helpers for cluster tests: polling, clean-up, and hand-written DRA objects."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from gpuslice.devcluster import binaries
from gpuslice.devcluster.cluster import ClusterSpec, DevCluster
from gpuslice.dra.support import taint_rule_api
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.kube.discovery import served_resources

RESOURCE = "/apis/resource.k8s.io/v1"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


def short_dir() -> Path:
    """A directory for a fake node's kubelet plugin sockets, removed at exit. Unix socket paths are
    limited to 107 bytes, and pytest's temporary paths are deep enough to pass that."""
    path = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
    atexit.register(shutil.rmtree, path, True)
    return path


# Answers that say "not now" rather than "no" (the typed errors with ``transient``, e.g. 429, 5xx,
# no answer at all): a poll tries again instead of failing on them.
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})


async def wait_for(
    check: Callable[[], Awaitable[Any]], *, within: float = 30, what: str = "condition", every: float = 0.2
) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` (and the last transient error)."""
    last_error: BaseException | None = None
    deadline = asyncio.timeout(within)
    try:
        async with deadline:
            while True:
                try:
                    if result := await check():
                        return result
                except KubeError as error:
                    if not error.transient and error.status not in TRANSIENT_STATUS:
                        raise
                    last_error = error
                except (aiohttp.ClientError, ConnectionError) as error:  # e.g. a keep-alive the server closed
                    last_error = error
                await asyncio.sleep(every)
    except TimeoutError:
        if not deadline.expired():
            raise  # a timeout inside ``check`` itself, not ours
        also = f" (last error: {last_error})" if last_error else ""
        raise AssertionError(f"timed out after {within} s waiting for {what}{also}") from None


async def create_namespace(kube: KubeClient, name: str, labels: dict[str, str] | None = None,
                           within: float = 30) -> str:
    """A namespace whose default ServiceAccount exists (pods are admitted only then)."""
    await kube.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": labels or {}}})

    async def has_default_sa() -> bool:
        items = await kube.list(f"/api/v1/namespaces/{name}/serviceaccounts")
        return any(sa["metadata"]["name"] == "default" for sa in items)

    await wait_for(has_default_sa, within=within, what=f"default ServiceAccount in {name}")
    return name


async def delete_namespace(kube: KubeClient, name: str) -> None:
    # No kubelet confirms container shutdown, so pods are removed at once (grace 0),
    # as a kubelet would after its containers stopped.
    with contextlib.suppress(KubeError):
        for pod in await kube.list(f"/api/v1/namespaces/{name}/pods"):
            await kube.delete(f"/api/v1/namespaces/{name}/pods/{pod['metadata']['name']}", gracePeriodSeconds=0)
        await kube.delete(f"/api/v1/namespaces/{name}")


async def taint_rules(kube: KubeClient, **query: str) -> list[dict[str, Any]]:
    """The DeviceTaintRules the server holds, where it serves them (``resource.k8s.io/v1`` on 1.37);
    none where it serves none (a stock 1.36), which is no 404."""
    api = taint_rule_api(await served_resources(kube, "resource.k8s.io"))
    return await kube.list(f"/apis/{api}/devicetaintrules", **query) if api else []


def _slice(name: str, driver: str, node: str, slices: int, **content: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": slices},
            **content,
        },
    }


def counter_slice(name: str, driver: str, node: str, counters: dict[str, str], slices: int = 2) -> dict[str, Any]:
    """The counter half of a 1.35+ partitionable pool: one shared counter set per GPU."""
    counter_set = {"name": "gpu-0", "counters": {k: {"value": v} for k, v in counters.items()}}
    return _slice(name, driver, node, slices, sharedCounters=[counter_set])


def partition(name: str, memory: str) -> dict[str, Any]:
    """A device that takes ``memory`` from GPU 0's counter set."""
    return {
        "name": name,
        "attributes": {"size": {"string": memory}},
        "capacity": {"memory": {"value": memory}},
        "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": memory}}}],
    }


def device_slice(name: str, driver: str, node: str, devices: list[dict[str, Any]], slices: int = 2) -> dict[str, Any]:
    return _slice(name, driver, node, slices, devices=devices)


def device_class(name: str, driver: str, selector: str = "") -> dict[str, Any]:
    expression = f'device.driver == "{driver}"' + (f" && {selector}" if selector else "")
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def claim_template(name: str, device_class_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": device_class_name}}
        ]}}},
    }


def pod_with_claim(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "work", "image": PAUSE_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        },
    }


async def pod_claim(kube: KubeClient, namespace: str, pod: str) -> dict[str, Any] | None:
    """The claim the resourceclaim controller generated for the pod, once it exists."""
    status = (await kube.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")).get("status", {})
    for entry in status.get("resourceClaimStatuses", []):
        if entry.get("resourceClaimName"):
            return await kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{entry['resourceClaimName']}")
    return None


def policy_devices(pool: str, node: str, policy: str, count: int, memory: str = "10Gi") -> list[dict[str, Any]]:
    """A pool as gpuslice's node agent publishes it: a counter slice and devices labelled with their policy."""
    devices = []
    for i in range(count):
        device = partition(f"gpu-0-{memory.lower()}-{i}", memory)
        device["attributes"] = {"gpuslice.dev/policy": {"string": policy}, "gpuslice.dev/mode": {"string": "memory"},
                                "gpuslice.dev/sliceSize": {"string": memory}}
        devices.append(device)
    counters = counter_slice(f"{pool}-counters", "gpu.gpuslice.dev", node, {"memory": "80Gi"})
    slices = [counters, device_slice(f"{pool}-devices", "gpu.gpuslice.dev", node, devices)]
    for item in slices:
        item["spec"]["pool"]["name"] = pool
    return slices


@contextlib.asynccontextmanager
async def dev_cluster(spec: ClusterSpec) -> AsyncIterator[DevCluster]:
    """A dev cluster from the cached control-plane binaries (``make kube-bin`` built them; a test
    never builds Kubernetes), stopped when the block ends."""
    found = await binaries.resolve(build_if_missing=False)
    async with DevCluster(spec, binaries=found) as cluster:
        yield cluster


class ClusterObjects:
    """Creates cluster-scoped objects and deletes them after the test."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube
        self._paths: list[str] = []

    async def create(self, collection: str, body: dict[str, Any]) -> dict[str, Any]:
        created = await self._kube.create(collection, body)
        self._paths.append(f"{collection}/{created['metadata']['name']}")
        return created

    async def delete_all(self) -> None:
        for path in reversed(self._paths):
            with contextlib.suppress(KubeError):
                await self._kube.delete(path)


POLICIES = "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"
NO_NODES = {"matchLabels": {"gpuslice.dev/test-selects": "nothing"}}


async def get_or_none(kube: KubeClient, path: str) -> dict[str, Any] | None:
    try:
        return await kube.get(path)
    except KubeError as error:
        if error.status == 404:
            return None
        raise


def condition(policy: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (policy.get("status") or {}).get("conditions", []) if c["type"] == kind), {})


def template_path(ns: str, name: str = "gpu-slice") -> str:
    return f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates/{name}"


def on(node: str) -> dict[str, Any]:
    """A nodeSelector of the one node ``node`` (a policy's, or a pod's)."""
    return {"matchLabels": {"kubernetes.io/hostname": node}}


async def policy_ready(kube: KubeClient, name: str, within: float = 60) -> dict[str, Any]:
    """The policy once its status says Ready=True: the controller refreshes a status on its timer
    (--status-interval), not at each node's publish, so a policy whose devices are out can still say
    AwaitingNodeAgents for a few seconds."""
    async def check() -> dict[str, Any] | None:
        body = await kube.get(f"{POLICIES}/{name}")
        return body if condition(body, "Ready").get("status") == "True" else None

    found: dict[str, Any] = await wait_for(check, within=within, what=f"{name} to be Ready")
    return found
