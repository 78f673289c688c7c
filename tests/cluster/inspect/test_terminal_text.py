"""What the inspecting commands print carries no escape sequence they did not make themselves.

Kubernetes' built-in ``edit`` and ``admin`` roles let a tenant create Events in its namespace, and an
Event's message and reason are free text; so are an owner reference's kind and name on a tenant's
pod, and the words of a node agent's overuse mark. ``gpuslice why`` quotes Warning Events about the
pod it explains, ``defrag`` names a pod's owner, and the map's SVG and HTML quote the overuse mark.
Each string read from the cluster is shown with its control characters escaped (``\\x1b``), in every
human output; ``-o json`` prints what was read, which ``json.dumps`` escapes itself."""

from __future__ import annotations

import datetime
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.devcluster.cluster import DevCluster
from gpuslice.kube.client import Invalid, KubeClient
from tests.cluster.cli import Cli, Result, impersonating, warning
from tests.cluster.gpu_nodes import GpuNodeFactory
from tests.cluster.kubeutil import RESOURCE, pod_claim, pod_with_claim, wait_for
from tests.cluster.operator_fixtures import ControllerProcess, PolicyFactory
from tests.cluster.pools import create_pods, published, settle

ESC = "\x1b"
PAYLOAD = (f"{ESC}]0;gpuslice: all clear{ESC}\\"          # window title
           f"{ESC}]52;c;a3ViZWN0bCBkZWxldGUgbnMgLS1hbGwK{ESC}\\"  # OSC 52: clipboard := 'kubectl delete ns --all'
           f"{ESC}[2J{ESC}[H"                              # clear the screen, cursor home
           "  Nothing gpuslice knows of blocks it."
           f"{ESC}[8m")                                     # and hide whatever gpuslice prints after
# C0 but newline and tab, DEL and C1: none may reach a terminal from the cluster.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(result: Result, what: str) -> str:
    assert result.rc in (0, 1), f"{what}: {result.stderr}"
    found = [line for line in (result.stdout + result.stderr).splitlines() if CONTROL.search(line)]
    assert not found, f"{what} wrote escape sequences read from the cluster to the terminal: {found!r}"
    return result.stdout


async def gpu_index(kube: KubeClient, node: str, namespace: str, pod: str) -> int:
    """The index of the GPU the pod's claim was allocated on, from the device's published attributes."""
    claim = await pod_claim(kube, namespace, pod)
    assert claim is not None
    [result] = claim["status"]["allocation"]["devices"]["results"]
    slices = await kube.get(f"{RESOURCE}/resourceslices", query={"fieldSelector": f"spec.nodeName={node}"})
    return next(int(d["attributes"]["gpuslice.dev/index"]["int"]) for s in slices["items"]
                for d in s["spec"].get("devices") or [] if d["name"] == result["device"])


async def post_as_tenant(cluster: DevCluster, kube: KubeClient, namespace: str, unique: str, tmp_path: Path,
                         pod: str, reason: str, message: str) -> None:
    """A Warning Event about ``pod``, posted by a tenant holding the events rule of the built-in edit role
    in its own namespace only."""
    user = f"tenant-{unique}"
    await kube.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles", {
        "metadata": {"name": "edit-events"},
        "rules": [{"apiGroups": ["", "events.k8s.io"], "resources": ["events"],
                   "verbs": ["create", "delete", "deletecollection", "patch", "update"]}]})
    await kube.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
        "metadata": {"name": "edit-events"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "edit-events"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}]})
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{pod}.{unique}", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": namespace},
        "type": "Warning", "reason": reason, "message": message,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1, "source": {"component": "default-scheduler"}}
    path = impersonating(cluster, tmp_path / "tenant.kubeconfig", user, namespace)
    async with await KubeClient.from_kubeconfig(path, context="as-user") as tenant:
        async def written() -> bool:
            try:
                await tenant.create(f"/api/v1/namespaces/{namespace}/events", event)
            except Exception as error:
                if "forbidden" in str(error).lower():
                    return False  # the authorizer's cache has not seen the binding yet
                raise
            return True

        await wait_for(written, within=30, what="the tenant to post its Event")


async def test_why_prints_no_escape_sequence_a_tenant_wrote(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    namespace: str, unique: str, gpuslice: Cli, tmp_path: Path,
) -> None:
    await make_policy({"nodeSelector": {"matchLabels": {"gpuslice.dev/no-such-node": unique}},
                       "slicing": {"mode": "memory", "sliceSize": "10G"}, "tenants": [{"namespace": namespace}]})

    async def template() -> bool:
        try:
            await kube.get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates/gpu-slice")
        except Exception:
            return False
        return True

    await wait_for(template, within=60, what="the tenant's claim template")
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pod_with_claim("job", "gpu-slice"))
    await post_as_tenant(cluster, kube, namespace, unique, tmp_path, "job", "FailedScheduling", PAYLOAD)

    result = await gpuslice("why", f"{namespace}/job")
    print("gpuslice why stdout:", repr(result.stdout))
    injected = [line for line in result.stdout.splitlines() if ESC in line]
    assert not injected, f"gpuslice why wrote a tenant's escape sequences to the terminal: {injected!r}"
    assert "FailedScheduling: \\x1b]0;gpuslice: all clear\\x1b\\\\x1b]52;c;" in " ".join(result.stdout.split()), \
        "the tenant's words are shown, their controls escaped"
    for listing in (("why", "-n", namespace), ("why", "-A")):
        assert "\\x1b]52;c;" in clean(await gpuslice(*listing), " ".join(listing))
    raw = json.loads((await gpuslice("why", f"{namespace}/job", "-o", "json")).stdout)
    assert any(PAYLOAD in f["message"] for f in raw["findings"]), "-o json says what was read"


async def test_every_command_escapes_what_tenants_and_nodes_wrote(
    cluster: DevCluster, kube: KubeClient, controller: ControllerProcess, make_policy: PolicyFactory,
    gpu_node: GpuNodeFactory, namespace: str, unique: str, gpuslice: Cli, tmp_path: Path,
) -> None:
    """A hostile owner on a tenant's pod (free text: the API server checks only that its fields are not
    empty), a hostile Event about the tenant's waiting pod, and a node's overuse mark with hostile
    words: ``status`` (text, SVG, HTML), ``why``, ``defrag`` and ``plan --cluster`` all print clean."""
    node = await gpu_node("h100-80gb", 2)
    spec = {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node.name}},
            "slicing": {"mode": "memory", "sliceSize": "10G", "allowFullGpu": True}, "tenants": [{"namespace": namespace}]}
    policy = await make_policy(spec)
    name = policy["metadata"]["name"]
    await published(kube, node.name, 18)
    owned = pod_with_claim("small", "gpu-slice")
    owned["metadata"]["annotations"] = {"team.example/note": PAYLOAD}  # free text too; shown nowhere
    owned["metadata"]["ownerReferences"] = [{  # a kind no API serves: the garbage collector leaves the pod be
        "apiVersion": "example.com/v1", "kind": f"Job{PAYLOAD}", "name": f"trainer{PAYLOAD}",
        "uid": "0f3a7c4e-0000-4c2a-9a51-000000000000", "controller": True}]
    await wait_for(lambda: kube.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates/gpu-slice"),
                   what="the tenant's claim template")
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", owned)
    await settle(cluster, kube, namespace, ["small"], 1)
    # A pod on the other GPU (its claim selects it), so that a whole GPU is free only if a pod moves, and
    # defragmentation plans, naming what blocks each GPU: on the first, the hostile owner.
    other = 1 - await gpu_index(kube, node.name, namespace, "small")
    await kube.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "pinned"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": f"{name}.gpuslice.dev",
            "selectors": [{"cel": {"expression": f'device.attributes["gpuslice.dev"].index == {other}'}}]}}]}}})
    pinned = pod_with_claim("other", "gpu-slice")
    pinned["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "pinned"}]
    await kube.create(f"/api/v1/namespaces/{namespace}/pods", pinned)
    await settle(cluster, kube, namespace, ["small", "other"], 2)
    await create_pods(kube, namespace, "gpu-slice-full", ["whole"])
    await warning(kube, namespace, "whole", "FailedScheduling")
    await post_as_tenant(cluster, kube, namespace, unique, tmp_path, "whole", f"Failed{PAYLOAD}", PAYLOAD)

    # The node's own agent identity, the one that may mark this claim: a mark whose words are hostile.
    claim = await pod_claim(kube, namespace, "small")
    assert claim is not None
    [result] = claim["status"]["allocation"]["devices"]["results"]
    uid = (await kube.get(f"/api/v1/namespaces/{namespace}/pods/small"))["metadata"]["uid"]
    mark = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": claim["metadata"]["name"], "namespace": namespace},
            "status": {"devices": [{
                "driver": result["driver"], "pool": result["pool"], "device": result["device"],
                "conditions": [{"type": "GpuMemoryOveruse", "status": "True", "reason": "OverAllocation",
                                "message": f"pod {namespace}/small uses{PAYLOAD}",
                                "lastTransitionTime": "2026-12-01T10:00:00Z"}],
                "data": {"overusingPods": [{"uid": uid, "name": "small", "since": "2026-12-01T10:00:00Z",
                                            "message": PAYLOAD, "evict": False}]}}]}}
    async with await KubeClient.from_kubeconfig(node.kubeconfig) as as_node:
        await as_node.apply(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim['metadata']['name']}/status",
                            mark, field_manager=f"gpuslice-agent-{node.name}")
    assert (await kube.get(f"/api/v1/namespaces/{namespace}/pods/small"))["metadata"].get("ownerReferences"), \
        "the pod and its owner are still there"

    # A label's value may hold no control character (the API server refuses it): names and labels are safe.
    with pytest.raises(Invalid):
        await kube.merge_patch(f"/api/v1/nodes/{node.name}", {"metadata": {"labels": {"team.example/x": f"a{ESC}b"}}})

    status = clean(await gpuslice("status"), "status")
    assert f"over their allocation: {namespace}/small" in " ".join(status.split()), "the mark was read"
    image = clean(await gpuslice("status", "-o", "svg"), "status -o svg")
    titles = " ".join(t.text or "" for t in ET.fromstring(image).iter("{http://www.w3.org/2000/svg}title"))
    assert f"over its allocation: pod {namespace}/small uses\\x1b]0;gpuslice: all clear" in titles
    assert "\\x1b]52;c;" in clean(await gpuslice("status", "-o", "html"), "status -o html")

    why = " ".join(clean(await gpuslice("why", f"{namespace}/whole"), "why").split())
    assert "Failed\\x1b]0;gpuslice: all clear" in why, "the Event's reason and message, escaped"
    assert "belongs to Job\\x1b]0;gpuslice: all clear" in why, "the defragmentation finding names the owner"
    assert "\\x1b]52;c;" in clean(await gpuslice("why", "-A"), "why -A")
    defrag = clean(await gpuslice("defrag"), "defrag")
    assert "belongs to Job\\x1b]0;gpuslice: all clear" in " ".join(defrag.split()), defrag

    # plan --cluster quotes names only (DNS labels) today: run over the same cluster, so that a change that
    # lets it quote free text is caught.
    edit = tmp_path / "edit.yaml"
    edit.write_text(yaml.safe_dump({"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy",
                                    "metadata": {"name": name},
                                    "spec": {**spec, "slicing": {"mode": "memory", "sliceSize": "20G"}}}))
    assert f"hold {result['device']} as it is until {namespace}/small" in " ".join(
        clean(await gpuslice("plan", "--cluster", "-f", str(edit)), "plan --cluster").split())
