"""``gpuslice demo``: a real control plane with fake GPU nodes and gpuslice on it.

Two fake nodes (eight H100s, four A100 40GB), each with a pod runner (the
kubelet's own plugin and DRA managers) and a node agent. It applies
``examples/policies/inference-memory.yaml`` (memory slices of the H100s) and
shows what the policy turned into, then ``shared-notebooks.yaml`` (shared
capacity of the A100s), starts tenant pods of both, shows them Running and
what each container received, and shows the apiserver denying a claim from a
namespace that is not a tenant. It doubles as a smoke test: it exits non-zero
when any step does not happen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from gpuslice.agent.gpus.fake_state import FakeState, FakeStateFile, admin_sets_mig_mode
from gpuslice.api.status import GpuSlicePolicyStatus
from gpuslice.coordinates import (
    NAMESPACES,
    NODES,
    POLICIES,
    claim_path,
    claim_template_path,
    claims_in,
    device_class_path,
    namespace_path,
    node_path,
    pod_path,
    pods_in,
    policy_path,
    quota_path,
)
from gpuslice.devcluster.cluster import ClusterSpec, DevCluster
from gpuslice.devcluster.recorded import find_recorded
from gpuslice.devcluster.state import StateDir, default_state_dir
from gpuslice.dra.policy_wire import admin_namespaces, tenant_namespaces
from gpuslice.errors import GpusliceError
from gpuslice.inspect.commands import print_map
from gpuslice.inventory.nodes import FAKE_COUNT, FAKE_MODEL
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.kube.discovery import served_resources

DRA_GROUP = "resource.k8s.io"
NEEDED = ("deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices")
EXAMPLE = "inference-memory.yaml"
SHARED_EXAMPLE = "shared-notebooks.yaml"
SHAPES = (("h100-80gb", 8), ("a100-40gb", 4))  # as kind/cluster.yaml
NOTEBOOK_NODE, NOTEBOOK_LABEL = "gpu-node-2", {"gpuslice.dev/pool": "notebooks"}


class DemoFailed(GpusliceError):
    pass


def demo_state_dir() -> Path:
    return default_state_dir().with_name("demo")


def example_policy(name: str = EXAMPLE) -> dict[str, Any]:
    for parent in Path(__file__).resolve().parents:
        path = parent / "examples" / "policies" / name
        if path.is_file():
            body: dict[str, Any] = yaml.safe_load(path.read_text())
            return body
    raise DemoFailed(f"examples/policies/{name} not found: run the demo from a gpuslice checkout")


async def _until(check: Callable[[], Awaitable[Any]], what: str, within: float = 60) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if result := await check():
            return result
        await asyncio.sleep(0.5)
    raise DemoFailed(f"timed out waiting for {what}")


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    return table


async def show_cluster(kube: KubeClient, cluster: DevCluster, console: Console) -> None:
    nodes = await kube.list(NODES)
    table = _table(f"Fake GPU nodes (Kubernetes {cluster.kubernetes_version})", "node", "ready", "fake GPUs", "cpu",
                   "memory", "pods")
    for node in nodes:
        labels, status = node["metadata"].get("labels", {}), node["status"]
        ready = next((c["status"] for c in status.get("conditions", []) if c["type"] == "Ready"), "?")
        alloc = status.get("allocatable", {})
        table.add_row(node["metadata"]["name"], ready, f"{labels.get(FAKE_COUNT, '?')} x {labels.get(FAKE_MODEL, '?')}",
                      alloc.get("cpu", ""), alloc.get("memory", ""), alloc.get("pods", ""))
    console.print(table)
    served = await served_resources(kube, DRA_GROUP)
    api = _table(f"Served {DRA_GROUP} API", "version", "resources")
    for version, resources in served.items():
        api.add_row(version, ", ".join(resources))
    console.print(api)
    assert cluster.features is not None
    missing = [r for r in NEEDED if r not in served.get("v1", [])]
    rules = cluster.features.taint_rule_version  # where the release serves DeviceTaintRule, if anywhere
    if rules is not None and "devicetaintrules" not in served.get(rules, []):
        missing.append("devicetaintrules")
    if missing or len(nodes) != len(cluster.node_names):
        raise DemoFailed(f"the cluster is not what gpuslice needs: missing {missing}, {len(nodes)} nodes")


async def show_policy(kube: KubeClient, console: Console) -> str:
    policy = example_policy()
    spec, tenants, admins = policy["spec"], tenant_namespaces(policy), admin_namespaces(policy)
    for ns in tenants + admins:
        await kube.create(NAMESPACES, {"metadata": {"name": ns}})
    await kube.create(POLICIES, policy)
    name = policy["metadata"]["name"]
    console.print(f"\nApplied examples/policies/{EXAMPLE} (GpuSlicePolicy [bold]{name}[/bold]); the controller made:")

    async def ready() -> dict[str, Any] | None:
        body = await kube.get(policy_path(name))
        ready = [c for c in (body.get("status") or {}).get("conditions", []) if c["type"] == "Ready"]
        return body if ready and ready[0]["status"] == "True" else None

    await _until(ready, "the policy to become Ready (node agents publish its slices)", within=90)

    async def settled() -> dict[str, Any] | None:
        # every agent has published once the count stops moving
        first = await kube.get(policy_path(name))
        await asyncio.sleep(3)
        second = await kube.get(policy_path(name))
        return second if first["status"]["slices"] == second["status"]["slices"] else None

    body = await _until(settled, "the published slices to settle", within=90)
    klass = body["status"]["deviceClassName"]
    made = _table("", "kind", "name", "where", "what")
    for entry in body["status"]["deviceClasses"]:
        device_class = await kube.get(device_class_path(entry["name"]))
        made.add_row("DeviceClass", entry["name"], "cluster",
                     f"the policy's {entry['kind']} devices ({entry['memoryBytes'] // 2**20} MiB each)"
                     + (f"; serves {device_class['spec']['extendedResourceName']}"
                        if device_class["spec"].get("extendedResourceName") else ""))
    for ns in tenants:
        template_path = claim_template_path(ns, spec["claimTemplateName"])
        template = await _until(_getter(kube, template_path), f"the template in {ns}")
        made.add_row("ResourceClaimTemplate", template["metadata"]["name"], ns, "one slice of the class")
        quota = await _until(_getter(kube, quota_path(ns, f"gpuslice-{name}")), f"the quota in {ns}")
        limits = ", ".join(f"{v} {k.split('.deviceclass.')[0]}" for k, v in quota["spec"]["hard"].items())
        made.add_row("ResourceQuota", quota["metadata"]["name"], ns, f"at most {limits}")
    made.add_row("ValidatingAdmissionPolicy", "gpuslice-tenancy (static, manifests/admission.yaml)", "cluster",
                 f"only {', '.join(tenants)} may claim or be allocated the classes")
    for ns in admins:
        labels = (await kube.get(namespace_path(ns)))["metadata"].get("labels", {})
        value = labels.get("resource.kubernetes.io/admin-access", "(missing)")
        made.add_row("Namespace label", "resource.kubernetes.io/admin-access", ns, value)
    console.print(made)

    status = _table(f"kubectl get gsp {name} -o yaml (status)", "condition", "status", "reason", "message")
    for c in body["status"]["conditions"]:
        status.add_row(c["type"], c["status"], c["reason"], c.get("message", ""))
    console.print(status)
    s = body["status"]
    def mib(value: int | None) -> str:
        return "-" if value is None else str(value // 2**20)

    use = GpuSlicePolicyStatus.model_validate(s).tenants
    console.print(f"nodes {s['nodes']}, GPUs {s['gpus']}, slices published {s['slices']['published']},"
                  f" allocated {s['slices']['allocated']}; tenants: "
                  + ", ".join(f"{t.namespace} {t.allocated}/{'-' if t.limit is None else t.limit} devices,"
                              f" {mib(t.allocated_bytes)}/{mib(t.limit_bytes)} MiB" for t in use))
    valid = next(c for c in s["conditions"] if c["type"] == "Valid")
    if valid["status"] != "True":
        raise DemoFailed(f"the example policy is not valid: {valid['message']}")
    return str(klass)


async def apply_shared(kube: KubeClient, cluster: DevCluster, console: Console) -> None:
    """The shared-capacity example on the A100 node, which opts in with its label. Its A100s come up in
    MIG mode (a node given to MIG), where no whole-GPU device can be used (planning.node.mig_mode): the demo
    plays the admin who switched MIG mode off first (``gpuslice fake-gpu mig-mode N off``)."""
    node_state = FakeStateFile(cluster.node_dir(NOTEBOOK_NODE) / "agent")
    def mig_off(state: FakeState) -> None:
        for gpu in range(dict(SHAPES)["a100-40gb"]):
            admin_sets_mig_mode(state, gpu, False)

    node_state.update(mig_off)
    await kube.merge_patch(node_path(NOTEBOOK_NODE), {"metadata": {"labels": NOTEBOOK_LABEL}})
    policy = example_policy(SHARED_EXAMPLE)
    for ns in tenant_namespaces(policy):
        await kube.create(NAMESPACES, {"metadata": {"name": ns}})
    await kube.create(POLICIES, policy)
    name = policy["metadata"]["name"]

    async def ready() -> dict[str, Any] | None:
        body = await kube.get(policy_path(name))
        ready = [c for c in (body.get("status") or {}).get("conditions", []) if c["type"] == "Ready"]
        return body if ready and ready[0]["status"] == "True" else None

    body = await _until(ready, f"policy {name} to become Ready", within=90)
    console.print(f"\nLabelled {NOTEBOOK_NODE} {NOTEBOOK_LABEL} and applied examples/policies/{SHARED_EXAMPLE}:"
                  f" GpuSlicePolicy [bold]{name}[/bold], mode shared, {body['status']['slices']['published']} devices"
                  f" (one per A100, memory claimed in {policy['spec']['slicing']['sliceSize']} steps).")


def _pod(name: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "model", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}]}}


async def show_tenant_pods(kube: KubeClient, cluster: DevCluster, console: Console) -> None:
    """Tenant pods of both policies: the scheduler allocates, the kubelet's DRA code calls gpuslice's
    plugin, and each container receives the GPUSLICE_* variables of its device."""
    memory, shared = example_policy(), example_policy(SHARED_EXAMPLE)
    pods = [(tenant_namespaces(memory)[0], f"inference-{i}", memory["spec"]["claimTemplateName"]) for i in range(3)]
    pods += [(tenant_namespaces(shared)[0], f"notebook-{i}", shared["spec"]["claimTemplateName"]) for i in range(2)]
    for ns, pod, template in pods:
        await kube.create(pods_in(ns), _pod(pod, template))

    async def running() -> bool:
        for ns, pod, _ in pods:
            body = await kube.get(pod_path(ns, pod))
            if (body.get("status") or {}).get("phase") != "Running":
                return False
        return True

    await _until(running, "the tenant pods to be Running on their slices", within=120)
    table = _table("Tenant pods: Running, and what each container received (gpuslice dev-cluster exec-env)",
                   "pod", "node", "mode", "device", "GPU", "slice", "memory limit")
    state = StateDir(cluster.state.root)
    shown: list[str] = []
    for ns, pod, _ in pods:
        body = await kube.get(pod_path(ns, pod))
        env = dict(line.split("=", 1) for line in find_recorded(state, f"{ns}/{pod}").env if "=" in line)
        if "GPUSLICE_DEVICE" not in env:
            raise DemoFailed(f"pod {ns}/{pod} is Running but its container received no GPUSLICE_* variables")
        table.add_row(f"{ns}/{pod}", body["spec"]["nodeName"], env["GPUSLICE_MODE"], env["GPUSLICE_DEVICE"],
                      env["GPUSLICE_GPU_UUID"][:12] + "…", env.get("GPUSLICE_SLICE_SIZE", ""),
                      env["GPUSLICE_MEMORY_LIMIT"])
        if not shown:
            shown = [line for line in find_recorded(state, f"{ns}/{pod}").env if line.startswith("GPUSLICE_")]
    console.print(table)
    console.print(f"[dim]$ gpuslice dev-cluster exec-env {pods[0][0]}/{pods[0][1]}[/dim]")
    for line in shown:
        console.print(f"  {line}")
    console.print("[dim]No container runs on a fake node: the pod runner records what each would receive"
                  " (CDI resolved as containerd does). Memory and shared slices are a scheduling boundary;"
                  " MIG instances are isolated by the hardware.[/dim]")


async def show_denial(kube: KubeClient, klass: str, console: Console) -> None:
    await kube.create(NAMESPACES, {"metadata": {"name": "intruder"}})
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "borrowed-gpu"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": klass}}]}}}

    async def denied() -> str | None:
        try:
            await kube.create(claims_in("intruder"), claim)
        except KubeError as error:
            return error.message
        await kube.delete(claim_path("intruder", "borrowed-gpu"))
        return None

    message = await _until(denied, "the apiserver to deny a claim from a non-tenant namespace", within=20)
    console.print(f"\nA claim from namespace [bold]intruder[/bold] is refused by the apiserver:\n"
                  f"  [red]{message}[/red]")


def _getter(kube: KubeClient, path: str) -> Callable[[], Awaitable[dict[str, Any] | None]]:
    async def get() -> dict[str, Any] | None:
        try:
            return await kube.get(path)
        except KubeError:
            return None

    return get


async def run_demo(spec: ClusterSpec, console: Console) -> bool:
    """Bring the cluster up, show it and gpuslice at work, stop it; True when all went as expected."""
    async with DevCluster(spec, report=lambda m: console.print(f"[dim]{m}[/dim]")) as cluster:
        async with await KubeClient.from_kubeconfig(cluster.kubeconfig) as kube:
            try:
                await show_cluster(kube, cluster, console)
                klass = await show_policy(kube, console)
                await apply_shared(kube, cluster, console)
                await show_tenant_pods(kube, cluster, console)
                await show_denial(kube, klass, console)
                console.print("\n[bold]gpuslice status[/bold] (kubectl gpuslice status): who holds which part of"
                              " which GPU")
                await print_map(kube, console, cluster.spec.state_dir / "occupancy.svg")
                console.print(f"[dim]The same map as an image: {cluster.spec.state_dir / 'occupancy.svg'}[/dim]")
            except (DemoFailed, KubeError) as error:
                console.print(f"[red]Demo failed:[/red] {error}")
                return False
        console.print(
            "\n[green]Done.[/green] Stopping the demo cluster; for one that stays up: `gpuslice dev-cluster up`."
        )
    return True
