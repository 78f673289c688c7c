"""One node's pool for fast tests of the agent's publish cycle and the kubelet plugin: the node, its
fake GPUs, what the agent keeps between cycles, and the drain rule as the API server enforces it,
all against the fake API server (tests.fakeapi)."""

from __future__ import annotations

import json
from collections.abc import Callable, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuslice.agent.drain import DRAINING, MARKER, PROBE, Drains
from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.agent.kubeletplugin.cdi import CdiDirectory
from gpuslice.agent.kubeletplugin.prepare import Preparer
from gpuslice.agent.mig_manager import APPLIED_FILE
from gpuslice.agent.mps.daemons import MpsDaemons
from gpuslice.agent.node_state.checkpoint import Checkpoints, ClaimCheckpoint, PreparedDevice
from gpuslice.agent.node_state.gpuops import GpuOps
from gpuslice.agent.pool import NodePool, Observed
from gpuslice.agent.pool_state import PoolState
from gpuslice.agent.published import PublishedRecord
from gpuslice.agent.publisher import PublishResult
from gpuslice.api.agent_view import VIEWS, view_of
from gpuslice.dra.names import CONTROLLER_NAMESPACE as NAMESPACE
from gpuslice.dra.names import DRIVER
from gpuslice.inventory.gpus import Gpu
from gpuslice.kube.client import KubeClient
from tests import builders
from tests.fakeapi import FakeApi, Refusal, Request

ATTR_POLICY = "gpuslice.dev/policy"
PENDING = "gpuslice.dev/pending-change"


@dataclass
class DrainRule:
    """ValidatingAdmissionPolicy ``gpuslice-drain`` (manifests/agent-rbac.yaml) as the API server
    enforces it: a drain probe naming a device that a drain object lists is refused, with the
    devices in the message. ``in_force`` False: the server has not loaded the new parameters yet."""

    api: FakeApi
    in_force: bool = True

    def __call__(self, request: Request, obj: dict[str, Any] | None) -> Refusal | None:
        if not (self.in_force and request.method == "POST" and obj is not None
                and request.path == f"/api/v1/namespaces/{NAMESPACE}/configmaps"
                and obj["metadata"]["name"] == PROBE):
            return None
        pool, asked = obj["data"]["pool"], obj["data"]["devices"].split()
        params = self.api.items(f"/api/v1/namespaces/{NAMESPACE}/configmaps")
        listed = {d for p in params if p["metadata"]["name"] == DRAINING + pool
                  for d in (p.get("data") or {}).get(pool, "").split()}
        draining = [f"{pool}/{d}" for d in asked if d in listed]
        if not draining:
            return None
        return Refusal(403, f'configmaps "{PROBE}" is forbidden: ValidatingAdmissionPolicy \'gpuslice-drain\' with'
                            f" binding 'gpuslice-drain' denied request: {MARKER}{' '.join(draining)} are being changed"
                            " or removed by gpuslice; the scheduler will choose other devices")


@dataclass
class Pool:
    """Node ``builders.NODE`` with ``count`` fake GPUs of ``model`` (in memory), published by
    :meth:`publish` as the agent's loop does, its ``NodePool`` (``agent``) keeping its drains,
    refusals and record between cycles."""

    api: FakeApi
    kube: KubeClient
    state: Path
    rule: DrainRule  # the drain rule as the API server enforces it
    model: str = "h100-80gb"
    count: int = 1

    @classmethod
    def on(cls, api: FakeApi, kube: KubeClient, state: Path, model: str = "h100-80gb", count: int = 1) -> Pool:
        """A new node on ``api``, whose API server enforces the drain rule."""
        rule = DrainRule(api)
        api.admit(rule)
        return cls(api, kube, state, rule, model, count)

    def __post_init__(self) -> None:
        self.backend = FakeBackend(builders.NODE, [(self.model, self.count)])
        # What the kubelet plugin has prepared is on disk (its checkpoints); no MIG manager here.
        self.agent = NodePool(builders.NODE, self.kube, GpuOps(self.backend, self.backend.discover()),
                              PoolState(record=PublishedRecord(self.state), checkpoints=Checkpoints(self.state, "boot-1")))
        if self.api.get(f"/api/v1/nodes/{builders.NODE}") is None:
            self.api.put(builders.node(builders.NODE, self.model, self.count))

    @property
    def gpus(self) -> list[Gpu]:
        return self.agent.gpus

    @gpus.setter
    def gpus(self, gpus: list[Gpu]) -> None:
        self.agent.gpus = gpus

    @property
    def drains(self) -> Drains:
        return self.agent.state.drains

    @property
    def record(self) -> PublishedRecord:
        assert self.agent.state.record is not None
        return self.agent.state.record

    def restarted(self) -> Pool:
        """The same node after its agent restarted: what it kept in memory is gone, what is on disk is not."""
        return Pool(self.api, self.kube, self.state, self.rule, self.model, self.count)

    def hold(self, device: str) -> None:
        """The kubelet plugin has started preparing ``device`` (its checkpoint says so), before the
        claim's status says it is allocated."""
        assert self.agent.state.checkpoints is not None
        uid = f"uid-holding-{device}"
        self.agent.state.checkpoints.write(ClaimCheckpoint(uid=uid, namespace="tenant", name=uid, phase="started", devices=[
            PreparedDevice(request="gpu", pool=builders.NODE, device=device, mode="memory", gpu_uuid="unknown")]))

    def controller_views(self) -> None:
        """The controller's part: each policy's agent view (what the agent plans from), as it writes them."""
        policies = {p["metadata"]["name"]: p for p in self.api.items(builders.POLICIES)}
        for view in self.api.items(VIEWS):
            if view["metadata"]["name"] not in policies:
                self.api.remove(f"{VIEWS}/{view['metadata']['name']}")
        for policy in policies.values():
            self.api.put(view_of(policy))

    async def read(self) -> Observed:
        self.controller_views()
        return await self.agent.read()

    async def publish(self) -> PublishResult:
        self.controller_views()
        async with self.agent.lock:
            return await self.agent.publish()

    async def settle(self, cycles: int = 6) -> PublishResult:
        """Publish until a cycle writes nothing (as the agent's loop, woken by its own writes, does)."""
        for _ in range(cycles):
            result = await self.publish()
            if not result.changed:
                return result
        raise AssertionError(f"the pool did not settle in {cycles} cycles")

    def preparer(self, boot_id: str = "boot-1", static: Set[str] = frozenset()) -> Preparer:
        """The node's kubelet plugin (a new process each call: its checkpoints and CDI specs are the
        node's, on disk, and its GPUs are the pool's); ``static``: GPUs a static MIG layout owns (in
        the MIG manager's record of applied layouts, as it writes it)."""
        if static:
            layouts = {uuid: {"policy": "static", "instances": []} for uuid in sorted(static)}
            (self.state / APPLIED_FILE).write_text(json.dumps(layouts))
        ops = GpuOps(self.backend, self.gpus)
        pool = NodePool(builders.NODE, self.kube, ops, PoolState.kept_in(self.state, builders.NODE, ops, boot_id=boot_id))
        mps = MpsDaemons(builders.NODE, self.backend, self.state / "mps", self.state / "shm")
        return Preparer(pool, CdiDirectory(self.state / "cdi"), mps)

    def slices(self) -> list[dict[str, Any]]:
        return [s for s in self.api.items(builders.SLICES)
                if s["spec"]["driver"] == DRIVER and s["spec"]["pool"]["name"] == builders.NODE]

    def devices(self) -> dict[str, dict[str, Any]]:
        """The devices the pool's newest generation publishes, by name."""
        slices = self.slices()
        newest = max((s["spec"]["pool"]["generation"] for s in slices), default=0)
        return {d["name"]: d for s in slices if s["spec"]["pool"]["generation"] == newest
                for d in s["spec"].get("devices") or []}

    def generation(self) -> int:
        return max((s["spec"]["pool"]["generation"] for s in self.slices()), default=0)

    def of(self, policy: str) -> dict[str, dict[str, Any]]:
        return {n: d for n, d in self.devices().items() if d["attributes"][ATTR_POLICY]["string"] == policy}

    def instances(self) -> list[tuple[str, int, str]]:
        """(profile, start, uuid) of every MIG instance on the node's GPUs."""
        return sorted((i.profile, i.start, i.uuid) for g in self.gpus for i in self.backend.mig_instances(g))

    def listed(self) -> set[str]:
        """The devices this node's drain object lists."""
        found = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{DRAINING}{builders.NODE}")
        return set(((found or {}).get("data") or {}).get(builders.NODE, "").split())

    def set_policy(self, name: str, slicing: dict[str, Any], **spec: Any) -> None:
        """Create or change a policy as its owner would, judged valid by the controller."""
        live = self.api.get(f"{builders.POLICIES}/{name}")
        generation = live["metadata"]["generation"] + 1 if live else 1
        options = {"uid": f"u-{name}", "node": builders.NODE, "tenants": [builders.TENANT], "judged": True, **spec}
        self.api.put(builders.policy(name, slicing, generation=generation, **options))

    def allocate(self, claim: str, *devices: str, **more: Any) -> None:
        """Claim ``claim`` of the tenant allocated ``devices`` (``more``: see builders.claim)."""
        self.api.put(builders.claim(claim, list(devices), **more))


def without_taints(device: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in device.items() if k != "taints"}


def taint_keys(device: dict[str, Any]) -> list[str]:
    return [t["key"] for t in device.get("taints") or []]


TEN = {"mode": "memory", "sliceSize": "10G"}
TWENTY = {"mode": "memory", "sliceSize": "20G"}


def refusing(policy: str, code: int) -> Callable[[Request, dict[str, Any] | None], Refusal | None]:
    """The API server refuses slices with ``policy``'s devices: its own validation naming their fields
    (422), or an admission rule of the cluster naming none (403)."""
    def rule(request: Request, obj: dict[str, Any] | None) -> Refusal | None:
        if obj is None or obj.get("kind") != "ResourceSlice":
            return None
        named = [i for i, d in enumerate(obj["spec"].get("devices") or []) if d["attributes"][ATTR_POLICY]["string"]
                 == policy]
        if not named:
            return None
        if code == 422:
            return Refusal(422, f"ResourceSlice.resource.k8s.io \"{obj['metadata']['name']}\" is invalid:"
                                f" spec.devices[{named[0]}].attributes: Too many: must have at most 32 items",
                           causes=tuple({"field": f"spec.devices[{i}].attributes", "reason": "FieldValueTooMany"}
                                        for i in named))
        return Refusal(403, f"resourceslices \"{obj['metadata']['name']}\" is forbidden: ValidatingAdmissionPolicy"
                            f" 'site-rule' with binding 'site-rule' denied request: no devices of {policy} here")
    return rule
