"""Stock Kubernetes, as a user's cluster runs it. The control plane is the upstream release, unchanged:
the version hack/kube pins (its module graph holds no fork), no ``--feature-gates``, no
``--runtime-config``, and the DRA gates and API versions as that release ships them. On it,
gpuslice makes every example policy Ready within 60 s, runs a tenant pod on a device of each
example's mode, and neither fails a reconcile nor asks for a kind the server does not serve (on a
stock 1.36 every converge listed DeviceTaintRules, which it does not serve, and failed).

`make test` runs this on 1.37; `make test-136` on a stock 1.36 (GPUSLICE_KUBE_VERSION=1.36)."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from typing import Any

from gpuslice.agent.gpus.fake_state import FakeState, FakeStateFile, admin_sets_mig_mode
from gpuslice.api.resource import GpuSlicePolicy
from gpuslice.demo import example_policy
from gpuslice.devcluster import binaries
from gpuslice.devcluster.cluster import DevCluster
from gpuslice.devcluster.recorded import find_recorded
from gpuslice.dra.support import RELEASES
from gpuslice.kube.client import KubeClient
from gpuslice.kube.discovery import served_resources
from tests.cluster.kubeutil import POLICIES, wait_for
from tests.cluster.observe import parse, scheduler_metrics, total

# What each release ships on (kubernetes_feature_enabled), read in k8s.io/kubernetes' pkg/features at
# v1.36.3 and v1.37.2: a binary built with other defaults, or run with gates set, is not stock.
DEFAULTS = {
    36: {"DRAPartitionableDevices": 1, "DRAConsumableCapacity": 1, "DRADeviceTaints": 1, "DRADeviceTaintRules": 0,
         "DRAExtendedResource": 1, "DRAAdminAccess": 1},
    37: {"DRAPartitionableDevices": 1, "DRAConsumableCapacity": 1, "DRADeviceTaints": 1, "DRADeviceTaintRules": 1,
         "DRAExtendedResource": 1, "DRAAdminAccess": 1},
}
EXAMPLES = ("inference-memory.yaml", "shared-notebooks.yaml", "training-mig.yaml")
NODE_POOLS = {"gpu-node-2": "notebooks", "gpu-node-3": "training"}  # the examples' nodeSelectors
READY_WITHIN = 60.0


async def _version_of(binary: str) -> str:
    process = await asyncio.create_subprocess_exec(binary, "--version", stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.STDOUT)
    out, _ = await process.communicate()
    return out.decode().strip()


async def _module(build: binaries.KubeBuild) -> dict[str, Any]:
    go = shutil.which("go")
    assert go is not None, "the control plane was built with Go: it is on PATH"
    process = await asyncio.create_subprocess_exec(go, "mod", "edit", "-json", build.modfile, cwd=build.source,
                                                   stdout=asyncio.subprocess.PIPE)
    out, _ = await process.communicate()
    found: dict[str, Any] = json.loads(out)
    return found


async def test_the_control_plane_is_the_stock_release(stock: DevCluster, stock_kube: KubeClient) -> None:
    build = await binaries.describe_build()
    wanted = binaries.requested_minor()
    version = await stock_kube.get("/version")
    assert version["gitVersion"] == build.kubernetes_version == stock.kubernetes_version
    assert version["gitTreeState"] == "clean"
    minor = int(version["minor"])
    if wanted is not None:
        assert f"1.{minor}" == wanted, f"the tier asked for {wanted}"
    for component in stock.components:
        if component.name.startswith("kube-"):
            assert await _version_of(component.argv[0]) == f"Kubernetes {build.kubernetes_version}", component.name
            assert not [a for a in component.argv if a.startswith(("--feature-gates", "--runtime-config"))], (
                f"{component.name} runs with gates or runtime-config: not stock ({component.argv})")
    # Built from the release's own modules: each staging module at the release's tag, no fork, no local path.
    module = await _module(build)
    staging = "v0." + build.kubernetes_version.removeprefix("v1.")
    for replace in module.get("Replace") or []:
        assert replace["New"]["Path"] == replace["Old"]["Path"], replace
        assert replace["New"].get("Version") == staging, replace
    assert "k8s.io/kubernetes" not in {r["Old"]["Path"] for r in module.get("Replace") or []}

    gates = {key: value for key, value in (await scheduler_metrics(stock)).items()
             if key.startswith("kubernetes_feature_enabled{")}
    for gate, enabled in DEFAULTS[minor].items():
        found = [value for key, value in gates.items() if f'name="{gate}"' in key]
        assert found == [enabled], (gate, found)
    served = await served_resources(stock_kube, "resource.k8s.io")
    assert {"deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"} <= set(served["v1"])
    rules = [v for v, resources in served.items() if "devicetaintrules" in resources]
    assert rules == ([] if minor == 36 else ["v1"]), served
    assert stock.features is not None
    assert stock.features.taint_rule_version == (rules[0] if rules else None)
    assert RELEASES[minor].supported


def _ready(body: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (body.get("status") or {}).get("conditions", []))


def _pod(name: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}]}}


async def test_every_example_is_ready_within_60s_and_runs_a_pod_of_its_mode_with_no_failed_reconcile(
        stock: DevCluster, stock_kube: KubeClient) -> None:
    kube = stock_kube

    def mig_off(state: FakeState) -> None:  # an admin gave the notebooks' A100s to whole-GPU use
        for gpu in range(4):
            admin_sets_mig_mode(state, gpu, False)

    FakeStateFile(stock.node_dir("gpu-node-2") / "agent").update(mig_off)
    for node, pool in NODE_POOLS.items():
        await kube.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {"gpuslice.dev/pool": pool}}})
    policies = [example_policy(name) for name in EXAMPLES]
    for body in policies:
        spec = body["spec"]
        for namespace in [t["namespace"] for t in spec["tenants"]] + spec.get("adminAccess", {}).get("namespaces", []):
            await kube.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    started = time.monotonic()
    for body in policies:
        await kube.create(POLICIES, body)

    async def all_ready() -> bool:
        bodies = [await kube.get(f"{POLICIES}/{b['metadata']['name']}") for b in policies]
        return all(_ready(b) for b in bodies)

    await wait_for(all_ready, within=READY_WITHIN, what="every example policy Ready", every=0.5)
    took = time.monotonic() - started

    # The training example starts under maintenance (a NoSchedule taint on its devices, which tenants may
    # not tolerate): the admin ends it, and the agent republishes its devices without the taint.
    await kube.merge_patch(f"{POLICIES}/training", {"spec": {"taints": None}})
    pods = []
    for body in policies:
        policy = GpuSlicePolicy.from_body(body)
        tenant = policy.spec.tenants[0].namespace
        name = f"{policy.name}-pod"
        await kube.create(f"/api/v1/namespaces/{tenant}/pods", _pod(name, policy.spec.claim_template_name))
        pods.append((tenant, name, policy.spec.slicing.mode))

    async def running() -> bool:
        phases = [(await kube.get(f"/api/v1/namespaces/{ns}/pods/{pod}")).get("status", {}).get("phase")
                  for ns, pod, _ in pods]
        return all(p == "Running" for p in phases)

    await wait_for(running, within=120, what="a tenant pod of each example Running", every=0.5)
    for ns, pod, mode in pods:
        env = dict(line.split("=", 1) for line in find_recorded(stock.state, f"{ns}/{pod}").env if "=" in line)
        assert env.get("GPUSLICE_MODE") == mode, (pod, env)

    log = (stock.state.logs / "gpuslice-controller.log").read_text(errors="replace")
    failed = [line for line in log.splitlines() if "reconcile failed" in line]
    assert failed == [], failed[:5]
    metrics = parse(str(await kube.request("GET", "/metrics", accept="text/plain")))
    unserved = total(metrics, "apiserver_request_total", code="404", group="resource.k8s.io", verb="LIST")
    assert unserved == 0, "gpuslice listed a kind of resource.k8s.io the server does not serve"
    assert took < READY_WITHIN
