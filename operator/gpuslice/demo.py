"""``gpuslice demo``: a real control plane with fake GPU nodes and gpuslice on it.

It applies ``examples/policies/inference-memory.yaml`` and shows what the
policy turned into, then shows the apiserver denying a claim from a namespace
that is not a tenant. It doubles as a smoke test: it exits non-zero when any
step does not happen.
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

from gpuslice.devcluster.cluster import ClusterSpec, DevCluster
from gpuslice.devcluster.state import default_state_dir
from gpuslice.inspect.commands import print_map
from gpuslice.inventory.nodes import FAKE_COUNT, FAKE_MODEL
from gpuslice.kube.client import KubeClient, KubeError
from gpuslice.kube.discovery import served_resources

DRA_GROUP = "resource.k8s.io"
NEEDED = ("deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices")
EXAMPLE = "inference-memory.yaml"
POLICIES = "/apis/gpuslice.dev/v1alpha1/gpuslicepolicies"


class DemoFailed(Exception):
    pass


def demo_state_dir() -> Path:
    return default_state_dir().with_name("demo")


def example_policy() -> dict[str, Any]:
    for parent in Path(__file__).resolve().parents:
        path = parent / "examples" / "policies" / EXAMPLE
        if path.is_file():
            body: dict[str, Any] = yaml.safe_load(path.read_text())
            return body
    raise DemoFailed(f"examples/policies/{EXAMPLE} not found: run the demo from a gpuslice checkout")


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
    nodes = await kube.list("/api/v1/nodes")
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
    if "devicetaintrules" not in served.get(cluster.features.taint_rule_version, []):
        missing.append("devicetaintrules")
    if missing or len(nodes) != cluster.spec.nodes:
        raise DemoFailed(f"the cluster is not what gpuslice needs: missing {missing}, {len(nodes)} nodes")


async def show_policy(kube: KubeClient, console: Console) -> str:
    policy = example_policy()
    spec = policy["spec"]
    namespaces = [t["namespace"] for t in spec["tenants"]] + spec["adminAccess"]["namespaces"]
    for ns in namespaces:
        await kube.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    await kube.create(POLICIES, policy)
    name = policy["metadata"]["name"]
    console.print(f"\nApplied examples/policies/{EXAMPLE} (GpuSlicePolicy [bold]{name}[/bold]); the controller made:")

    async def ready() -> dict[str, Any] | None:
        body = await kube.get(f"{POLICIES}/{name}")
        ready = [c for c in (body.get("status") or {}).get("conditions", []) if c["type"] == "Ready"]
        return body if ready and ready[0]["status"] == "True" else None

    await _until(ready, "the policy to become Ready (node agents publish its slices)", within=90)

    async def settled() -> dict[str, Any] | None:
        # every agent has published once the count stops moving
        first = await kube.get(f"{POLICIES}/{name}")
        await asyncio.sleep(3)
        second = await kube.get(f"{POLICIES}/{name}")
        return second if first["status"]["slices"] == second["status"]["slices"] else None

    body = await _until(settled, "the published slices to settle", within=90)
    klass = body["status"]["deviceClassName"]
    made = _table("", "kind", "name", "where", "what")
    for entry in body["status"]["deviceClasses"]:
        device_class = await kube.get(f"/apis/resource.k8s.io/v1/deviceclasses/{entry['name']}")
        made.add_row("DeviceClass", entry["name"], "cluster",
                     f"the policy's {entry['kind']} devices ({entry['memoryBytes'] // 2**20} MiB each)"
                     + (f"; serves {device_class['spec']['extendedResourceName']}"
                        if device_class["spec"].get("extendedResourceName") else ""))
    for tenant in spec["tenants"]:
        ns = tenant["namespace"]
        template_path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates/{spec['claimTemplateName']}"
        template = await _until(_getter(kube, template_path), f"the template in {ns}")
        made.add_row("ResourceClaimTemplate", template["metadata"]["name"], ns, "one slice of the class")
        quota_path = f"/api/v1/namespaces/{ns}/resourcequotas/gpuslice-{name}"
        quota = await _until(_getter(kube, quota_path), f"the quota in {ns}")
        limits = ", ".join(f"{v} {k.split('.deviceclass.')[0]}" for k, v in quota["spec"]["hard"].items())
        made.add_row("ResourceQuota", quota["metadata"]["name"], ns, f"at most {limits}")
    made.add_row("ValidatingAdmissionPolicy", "gpuslice-tenancy (static, manifests/admission.yaml)", "cluster",
                 f"only {', '.join(t['namespace'] for t in spec['tenants'])} may claim or be allocated the classes")
    for ns in spec["adminAccess"]["namespaces"]:
        labels = (await kube.get(f"/api/v1/namespaces/{ns}"))["metadata"].get("labels", {})
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

    console.print(f"nodes {s['nodes']}, GPUs {s['gpus']}, slices published {s['slices']['published']},"
                  f" allocated {s['slices']['allocated']}; tenants: "
                  + ", ".join(f"{t['namespace']} {t['allocated']}/{t.get('limit', '-')} devices,"
                              f" {mib(t['allocatedBytes'])}/{mib(t.get('limitBytes'))} MiB" for t in s["tenants"]))
    valid = next(c for c in s["conditions"] if c["type"] == "Valid")
    if valid["status"] != "True":
        raise DemoFailed(f"the example policy is not valid: {valid['message']}")
    return str(klass)


async def show_tenant_pods(kube: KubeClient, console: Console, count: int = 3) -> None:
    """Tenant pods that ask for a slice through the claim template, and what the scheduler gave them."""
    spec = example_policy()["spec"]
    ns, template = spec["tenants"][0]["namespace"], spec["claimTemplateName"]
    for i in range(count):
        await kube.create(f"/api/v1/namespaces/{ns}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"inference-{i}"},
            "spec": {"containers": [{"name": "model", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}]},
        })

    async def allocated() -> list[tuple[str, str, str]] | None:
        rows = []
        for i in range(count):
            pod = await kube.get(f"/api/v1/namespaces/{ns}/pods/inference-{i}")
            claims = (pod.get("status") or {}).get("resourceClaimStatuses") or []
            if not claims or not pod["spec"].get("nodeName"):
                return None
            claim = await kube.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/"
                                   f"{claims[0]['resourceClaimName']}")
            results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
            if not results:
                return None
            rows.append((pod["metadata"]["name"], pod["spec"]["nodeName"], results[0]["device"]))
        return rows

    rows = await _until(allocated, "the scheduler to allocate slices to the tenant pods")
    table = _table(f"Tenant pods in {ns}: the real kube-scheduler allocated a slice to each", "pod", "node", "device")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print("[dim]No kubelet runs on the fake nodes yet: the pods are bound and hold their slices,"
                  " but stay Pending.[/dim]")


async def show_denial(kube: KubeClient, klass: str, console: Console) -> None:
    await kube.create("/api/v1/namespaces", {"metadata": {"name": "intruder"}})
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "borrowed-gpu"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": klass}}]}}}

    async def denied() -> str | None:
        try:
            await kube.create("/apis/resource.k8s.io/v1/namespaces/intruder/resourceclaims", claim)
        except KubeError as error:
            return error.message
        await kube.delete("/apis/resource.k8s.io/v1/namespaces/intruder/resourceclaims/borrowed-gpu")
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
                await show_tenant_pods(kube, console)
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
