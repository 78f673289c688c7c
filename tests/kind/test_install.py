"""gpuslice installed on kind as the README says, used as a tenant would, upgraded, uninstalled.

The tests run in this order on one cluster: the demo's pods and what they received, the kubelet's
registration of the plugin, tenancy and limits as a hostile tenant tries them, the devices'
accounting under an attempt to overbook a GPU, MPS and each pod's GPU use with overuse caught, an
upgrade under running pods, and the uninstall.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import threading
import time
from collections import defaultdict
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.dra.quantity import parse_quantity
from tests.kind.checks import (
    DRIVER,
    claim_of,
    environment,
    gpuslice_pods,
    leftovers,
    load_upgrade_image,
    nothing_left_on_the_nodes,
    ready,
    restarts,
    results,
)
from tests.kind.kindutil import REPO, Kind

TENANT_PODS = {  # namespace/pod -> (policy, mode)
    "team-a/inference": ("inference", "memory"),
    "data-science/notebook": ("notebooks", "shared"),
    "ml-research/training": ("training", "mig"),
}


@pytest.fixture(scope="module")
def demo(deployed: Kind) -> str:
    """`make kind-demo`, as the README has users run it: its output, or "" if it failed (the
    first test reports that). The tests that need no running tenant pod go on either way: the
    namespaces and policies it applies are applied again here (idempotent)."""
    try:
        output = deployed.make("kind-demo")
    except AssertionError as failure:
        DEMO_FAILURE.append(str(failure))
        output = ""
    deployed.kubectl("apply", "-f", "examples/tenants/namespaces.yaml", "-f", "examples/policies/")
    deployed.kubectl("wait", "gsp", "--all", "--for=condition=Ready", "--timeout=300s")
    return output


DEMO_FAILURE: list[str] = []


def needs_running_tenants(demo: str) -> None:
    assert demo, "make kind-demo failed, so its tenant pods are not running:\n" + "".join(DEMO_FAILURE)[-3000:]


def over_allocation(kind: Kind) -> list[str]:
    """Every way a GPU could be over-allocated, judged from what the apiserver holds: shared
    counters (memory slices and MIG placements of one GPU) consumed beyond their capacity, a
    shared device's capacity consumed beyond its size, an exclusive device allocated twice."""
    devices: dict[tuple[str, str], dict[str, Any]] = {}
    capacity: dict[tuple[str, str, str], Fraction] = {}
    for slice_ in kind.items("resourceslices", "--field-selector", f"spec.driver={DRIVER}"):
        pool = slice_["spec"]["pool"]["name"]
        for device in slice_["spec"].get("devices") or []:
            devices[(pool, device["name"])] = device
        for counter_set in slice_["spec"].get("sharedCounters") or []:
            for counter, value in counter_set["counters"].items():
                capacity[(pool, counter_set["name"], counter)] = parse_quantity(value["value"])
    consumed: dict[tuple[str, str, str], Fraction] = defaultdict(Fraction)
    shared: dict[tuple[str, str, str], Fraction] = defaultdict(Fraction)
    exclusive: dict[tuple[str, str], int] = defaultdict(int)
    problems = []
    for claim in kind.items("resourceclaims", "-A"):
        for result in results(claim):
            if result.get("adminAccess"):
                continue  # admin access observes a device, it does not consume it
            key = (result["pool"], result["device"])
            device = devices.get(key)
            if device is None:
                problems.append(f"{claim['metadata']['name']} holds {key}, which no slice publishes")
                continue
            for consumption in device.get("consumesCounters") or []:
                for counter, value in consumption["counters"].items():
                    consumed[(key[0], consumption["counterSet"], counter)] += parse_quantity(value["value"])
            if device.get("allowMultipleAllocations"):
                for name, value in (result.get("consumedCapacity") or {}).items():
                    shared[(*key, name)] += parse_quantity(value)
            else:
                exclusive[key] += 1
    problems += [f"counter {k} consumed {v} > {capacity.get(k, 0)}" for k, v in consumed.items()
                 if v > capacity.get(k, 0)]
    for (pool, name, cap), used in shared.items():
        size = parse_quantity(devices[(pool, name)]["capacity"][cap]["value"])
        if used > size:
            problems.append(f"shared device {pool}/{name}: {cap} consumed {used} > {size}")
    problems += [f"device {k} allocated {n} times" for k, n in exclusive.items() if n > 1]
    return problems


def test_each_node_has_its_own_pod_subnet_and_pods_reach_other_nodes(deployed: Kind) -> None:
    # hack/kind/podnet in place of kindnetd: a bridge config from each node's podCIDR, routes to the others'.
    cidrs = {n["metadata"]["name"]: ipaddress.ip_network(n["spec"]["podCIDR"]) for n in deployed.items("nodes")}
    assert len(set(cidrs.values())) == len(cidrs), cidrs
    pods = [p for p in deployed.items("pods", "-n", "gpuslice-system") if not p["spec"].get("hostNetwork")]
    for pod in pods:
        address = ipaddress.ip_address(pod["status"]["podIP"])
        assert address in cidrs[pod["spec"]["nodeName"]], f"{pod['metadata']['name']} {address}"
    controller = next(p for p in pods if p["metadata"]["labels"]["app.kubernetes.io/component"] == "controller")
    remote = [p for p in pods if p["spec"]["nodeName"] != controller["spec"]["nodeName"]]
    assert remote, "no agent on another node than the controller's"
    for agent in remote:  # from the controller's pod to an agent's metrics port on another node
        url = f"http://{agent['status']['podIP']}:8080/metrics"
        fetched = deployed.kubectl("-n", "gpuslice-system", "exec", controller["metadata"]["name"], "--",
                                   "python3", "-c", f"import urllib.request; print(urllib.request.urlopen({url!r},"
                                   " timeout=10).status)")
        assert fetched.strip() == "200", fetched


def test_the_readme_demo_runs_a_tenant_pod_of_each_mode(demo: str) -> None:
    needs_running_tenants(demo)
    for pod in TENANT_PODS:
        assert f"-- {pod}:" in demo
    assert "GPUSLICE_DEVICE=" in demo
    assert "denied" in demo.lower() or "forbidden" in demo.lower(), demo[-2000:]


@pytest.mark.parametrize("pod", TENANT_PODS)
def test_each_tenant_got_its_slice_through_cdi(deployed: Kind, demo: str, pod: str) -> None:
    needs_running_tenants(demo)
    namespace, name = pod.split("/")
    policy, mode = TENANT_PODS[pod]
    spec = deployed.json("-n", namespace, "get", "pod", name)
    assert spec["status"]["phase"] == "Running"
    assert not any(c.get("env") for c in spec["spec"]["containers"]), "the pod itself sets no environment"
    claim = claim_of(deployed, namespace, name)
    (result,) = results(claim)
    env = environment(deployed, namespace, name)
    # Nothing in the pod spec sets these: containerd put them in, from the CDI spec our plugin wrote.
    assert env.get("GPUSLICE_DEVICE") == result["device"], env
    assert env.get("GPUSLICE_CLAIM") == f"{namespace}/{claim['metadata']['name']}", env
    assert env.get("GPUSLICE_POLICY") == policy, env
    assert env.get("GPUSLICE_MODE") == mode, env
    node = spec["spec"]["nodeName"]
    assert node == result["pool"], "the pod runs on the node whose pool the device is from"
    specs = deployed.node_exec(node, "sh", "-c", "cat /var/run/cdi/*")
    assert claim["metadata"]["uid"] in specs, "the node holds the claim's CDI spec"


def test_the_kubelet_registered_the_plugin_on_every_gpu_node(deployed: Kind, demo: str) -> None:
    # The kubelet's plugin manager counts what it registered (its actual state of the world).
    for node in deployed.workers:
        metrics = deployed.kubectl("get", "--raw", f"/api/v1/nodes/{node}/proxy/metrics")
        registered = [line for line in metrics.splitlines() if line.startswith("plugin_manager_total_plugins{")
                      and "gpuslice" in line and 'state="actual_state_of_world"' in line]
        assert registered, f"{node}: the kubelet has not registered gpuslice's plugin"
        assert all(line.endswith(" 1") for line in registered), registered
        socket = re.search(r'socket_path="([^"]+)"', registered[0]).group(1)  # type: ignore[union-attr]
        assert socket.startswith("/var/lib/kubelet/plugins_registry/"), socket


def test_no_gpu_is_over_allocated_after_the_demo(deployed: Kind, demo: str) -> None:
    assert over_allocation(deployed) == []


def test_a_namespace_that_is_not_a_tenant_is_denied(deployed: Kind, demo: str) -> None:
    deployed.kubectl("create", "namespace", "outsider")
    try:
        for policy in ("inference", "notebooks", "training"):
            claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                     "metadata": {"name": f"take-{policy}", "namespace": "outsider"},
                     "spec": {"devices": {"requests": [
                         {"name": "gpu", "exactly": {"deviceClassName": f"{policy}.gpuslice.dev"}}]}}}
            refused = deployed.kubectl("create", "-f", "-", input=json.dumps(claim), check=False)
            assert "denied" in refused or "forbidden" in refused.lower(), refused
            assert "outsider" in refused, refused
        assert deployed.items("resourceclaims", "-n", "outsider") == []
    finally:
        deployed.kubectl("delete", "namespace", "outsider", "--wait=false")


OWN_NODE_PROBE = """
import json, os, ssl, sys, urllib.request
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
secrets = "/var/run/secrets/kubernetes.io/serviceaccount"
token = open(secrets + "/token").read()
context = ssl.create_default_context(cafile=secrets + "/ca.crt")
method, path, body = sys.argv[1], sys.argv[2], sys.argv[3].encode() if len(sys.argv) > 3 else None
request = urllib.request.Request(f"https://{host}:{port}{path}", data=body, method=method, headers={
    "Authorization": "Bearer " + token, "Content-Type": "application/json"})
try:
    print(urllib.request.urlopen(request, context=context, timeout=30).status)
except urllib.error.HTTPError as error:
    print(error.code, json.loads(error.read()).get("message", ""))
"""


def agents_by_node(kind: Kind) -> list[dict[str, Any]]:
    return sorted(kind.items("pods", "-n", "gpuslice-system", "-l", "app.kubernetes.io/component=agent"),
                  key=lambda p: p["spec"]["nodeName"])


def as_agent(kind: Kind, agent: dict[str, Any], method: str, url: str, body: dict[str, Any] | None = None) -> str:
    """A request with the agent's own token (node-bound, as the kubelet projects it for a DaemonSet pod),
    from inside its pod: the status code, and the message of a refusal."""
    args = ["-n", "gpuslice-system", "exec", agent["metadata"]["name"], "--", "python3", "-c", OWN_NODE_PROBE,
            method, url]
    return kind.kubectl(*args, *([json.dumps(body)] if body is not None else [])).strip()


def test_an_agent_cannot_write_another_nodes_slices(deployed: Kind, demo: str) -> None:
    # The own-node admission policy refuses a slice of another node's pool, under that node's name, and
    # the deletion of that node's slices.
    agents = agents_by_node(deployed)
    assert len(agents) >= 2, [a["metadata"]["name"] for a in agents]
    thief, victim = agents[0], agents[1]["spec"]["nodeName"]
    path = "/apis/resource.k8s.io/v1/resourceslices"

    stolen = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
              "metadata": {"name": f"gpuslice-{victim}-devices-99"},
              "spec": {"driver": DRIVER, "nodeName": victim,
                       "pool": {"name": victim, "generation": 1, "resourceSliceCount": 1},
                       "devices": [{"name": "stolen"}]}}
    created = as_agent(deployed, thief, "POST", path, stolen)
    assert created.startswith("403"), created
    assert "may write only its own node" in created, created
    theirs = [s["metadata"]["name"] for s in deployed.items("resourceslices", "--field-selector",
                                                            f"spec.driver={DRIVER},spec.nodeName={victim}")]
    assert theirs, f"{victim} publishes no slice"
    deleted = as_agent(deployed, thief, "DELETE", f"{path}/{theirs[0]}")
    assert deleted.startswith("403"), deleted
    assert theirs[0] in deployed.kubectl("get", "resourceslices", "-o", "name")


def test_an_agent_can_evict_no_pod_nor_post_an_event_on_one(deployed: Kind, demo: str) -> None:
    # Not even a pod on its own node: evictions and Events on pods are the controller's (a stolen agent
    # token hurts one node); the agent may create Events in default only.
    needs_running_tenants(demo)
    pod = deployed.json("-n", "team-a", "get", "pod", "inference")
    [agent] = [a for a in agents_by_node(deployed) if a["spec"]["nodeName"] == pod["spec"]["nodeName"]]
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": "inference", "namespace": "team-a"}}
    evicted = as_agent(deployed, agent, "POST", "/api/v1/namespaces/team-a/pods/inference/eviction", eviction)
    assert evicted.startswith("403"), evicted
    assert "pods/eviction" in evicted, evicted
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "forged.0", "namespace": "team-a"},
             "involvedObject": {"kind": "Pod", "name": "inference", "namespace": "team-a",
                                "uid": pod["metadata"]["uid"]}, "reason": "Forged", "message": "forged"}
    posted = as_agent(deployed, agent, "POST", "/api/v1/namespaces/team-a/events", event)
    assert posted.startswith("403"), posted
    assert deployed.json("-n", "team-a", "get", "pod", "inference")["status"]["phase"] == "Running"


def test_a_tenant_cannot_take_admin_access_nor_pass_its_limit(deployed: Kind, demo: str) -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "watch-all", "namespace": "team-b"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": "inference.gpuslice.dev", "adminAccess": True}}]}}}
    refused = deployed.kubectl("create", "-f", "-", input=json.dumps(claim), check=False)
    assert "watch-all" not in deployed.kubectl("-n", "team-b", "get", "resourceclaims", "-o", "name")
    assert "admin" in refused.lower(), refused
    # team-b may hold 4 slices of the inference policy: the fifth claim is refused at admission.
    template = deployed.json("-n", "team-b", "get", "resourceclaimtemplate", "gpu-slice")["spec"]
    created: list[str] = []
    refusals: list[str] = []
    for index in range(5):
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": f"quota-{index}", "namespace": "team-b"}, "spec": template["spec"]}
        out = deployed.kubectl("create", "-f", "-", input=json.dumps(body), check=False)
        (refusals if "exceeded quota" in out else created).append(out)
    deployed.kubectl("-n", "team-b", "delete", "resourceclaims", "--all", "--wait=false")
    assert len(created) == 4, created
    assert len(refusals) == 1, refusals


def test_an_attempt_to_overbook_a_shared_gpu_leaves_the_extra_pod_pending(deployed: Kind, demo: str) -> None:
    # The notebooks policy shares each L40S by memory. Ask for the largest step that fits an
    # empty GPU, one pod more than the GPUs' free memory holds.
    slices = deployed.items("resourceslices", "--field-selector", f"spec.driver={DRIVER}")
    shared = [d for s in slices for d in s["spec"].get("devices") or []
              if d.get("allowMultipleAllocations") and d["attributes"]["gpuslice.dev/policy"]["string"] == "notebooks"]
    assert shared, "no shared device published for the notebooks policy"
    size = parse_quantity(shared[0]["capacity"]["memory"]["value"])
    step = parse_quantity(shared[0]["capacity"]["memory"]["requestPolicy"]["validRange"]["step"])
    request = size // step * step
    used: dict[str, Fraction] = defaultdict(Fraction)
    for claim in deployed.items("resourceclaims", "-A"):
        for result in results(claim):
            used[result["device"]] += sum((parse_quantity(v) for v in (result.get("consumedCapacity") or {}).values()),
                                          Fraction(0))
    fits = sum(int((size - used[d["name"]]) // request) for d in shared)
    gib = request / 2**30
    names = [f"big-{i}" for i in range(fits + 1)]
    documents = []
    for name in names:
        documents += [
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": "data-science"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": "notebooks.gpuslice.dev",
                 "capacity": {"requests": {"memory": f"{int(gib)}Gi"}}}}]}}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "data-science",
                                                            "labels": {"gpuslice-test": "overbook"}},
             "spec": {"containers": [{"name": "c", "image": "gpuslice-tenant:0.1.0",
                                      "resources": {"claims": [{"name": "gpu"}]}}],
                      "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]}},
        ]
    deployed.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))
    try:
        def settled() -> bool:
            claims = [deployed.json("-n", "data-science", "get", "resourceclaim", n) for n in names]
            allocated = [c for c in claims if results(c)]
            unschedulable = [n for n in names if any(
                c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
                for c in deployed.json("-n", "data-science", "get", "pod", n)["status"].get("conditions", []))]
            return len(allocated) == fits and len(unschedulable) == 1

        deployed.wait_until(f"{fits} of {len(names)} pods of {gib}Gi to be allocated and one to be unschedulable",
                            settled)
        assert over_allocation(deployed) == []
    finally:
        deployed.kubectl("-n", "data-science", "delete", "pods,resourceclaims", *names, "--wait=true")


def agent_on(kind: Kind, node: str) -> str:
    [agent] = [p["metadata"]["name"] for p in kind.items("pods", "-n", "gpuslice-system", "-l",
                                                          "app.kubernetes.io/component=agent")
               if p["spec"].get("nodeName") == node]
    return agent  # type: ignore[no-any-return]


def agent_metrics(kind: Kind, node: str) -> list[tuple[str, dict[str, str], float]]:
    text = kind.kubectl("get", "--raw", f"/api/v1/namespaces/gpuslice-system/pods/{agent_on(kind, node)}:8080/proxy/metrics")
    return [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def metric(kind: Kind, where: str, name: str, **labels: str) -> float | None:
    """A sample of the agent on node ``where``."""
    return next((v for n, ls, v in agent_metrics(kind, where) if n == name
                 and all(ls.get(k) == x for k, x in labels.items())), None)


def host_pid(kind: Kind, namespace: str, pod: str) -> tuple[str, int]:
    """The node of the pod and the pid of its container's process in the node's PID namespace (as NVML
    would number it), found by the container ID its cgroup names."""
    body = kind.json("-n", namespace, "get", "pod", pod)
    node = body["spec"]["nodeName"]
    container = body["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    found = kind.node_exec(node, "sh", "-c", f"grep -l {container} /proc/[0-9]*/cgroup | head -1").strip()
    return node, int(found.split("/")[2])


def gpu_index(kind: Kind, namespace: str, pod: str) -> int:
    [result] = results(claim_of(kind, namespace, pod))
    for slice_ in kind.items("resourceslices", "--field-selector", f"spec.nodeName={result['pool']}"):
        for device in slice_["spec"].get("devices") or []:
            if device["name"] == result["device"]:
                return int(device["attributes"]["gpuslice.dev/index"]["int"])
    raise AssertionError(f"{result['device']} is not published")


def fake_use(kind: Kind, namespace: str, pod: str, memory: str) -> None:
    """A process of the pod's container uses ``memory`` of its GPU, as NVML would say (the fake backend's)."""
    node, pid = host_pid(kind, namespace, pod)
    kind.kubectl("-n", "gpuslice-system", "exec", agent_on(kind, node), "--", "gpuslice", "fake-gpu", "--state-dir",
                 f"/var/lib/kubelet/plugins/{DRIVER}", "use", str(gpu_index(kind, namespace, pod)), "--pid", str(pid),
                 "--memory", memory)


def tenant_pods(kind: Kind, namespace: str, template: str, names: list[str]) -> None:
    pod = next(yaml.safe_load_all((REPO / "examples/tenants/pods.yaml").read_text()))
    documents = []
    for name in names:
        body = json.loads(json.dumps(pod))
        body["metadata"].update(name=name, namespace=namespace, labels={"gpuslice-test": "use"})
        body["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = template
        documents.append(body)
    kind.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))
    for name in names:
        kind.kubectl("-n", namespace, "wait", f"pod/{name}", "--for=condition=Ready", "--timeout=300s")


def test_an_mps_notebook_reaches_its_gpus_daemon_through_containerd(deployed: Kind, demo: str) -> None:
    """examples/policies/shared-notebooks.yaml has isolation: MPS: the notebook's container is an MPS client
    of its GPU's control daemon (the fake backend's stand-in, run by the agent), with its share as its limit."""
    needs_running_tenants(demo)
    env = dict(line.split("=", 1) for line in deployed.kubectl("-n", "data-science", "exec", "notebook", "--",
                                                               "env").splitlines() if "=" in line)
    [result] = results(claim_of(deployed, "data-science", "notebook"))
    share = parse_quantity(result["consumedCapacity"]["memory"])
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={int(share) // 2**20}M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert int(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) >= 1
    assert "control" in deployed.kubectl("-n", "data-science", "exec", "notebook", "--", "ls", "/tmp/nvidia-mps")
    node = deployed.json("-n", "data-science", "get", "pod", "notebook")["spec"]["nodeName"]
    records = deployed.node_exec(node, "sh", "-c", f"cat /var/lib/kubelet/plugins/{DRIVER}/mps/*/*/daemon.json")
    pid = json.loads(records.splitlines()[0])["pid"]
    agent = agent_on(deployed, node)
    assert "gpuslice.agent.mps.standin" in deployed.kubectl(
        "-n", "gpuslice-system", "exec", agent, "--", "cat", f"/proc/{pid}/cmdline")
    assert metric(deployed, node, "gpuslice_agent_mps_daemons", node=node) == 1


def test_overuse_is_reported_summed_per_tenant_and_evicted_where_asked(deployed: Kind, demo: str) -> None:
    """The real kubelet's PodResources API and the pods' real cgroups: a process of a tenant pod over its
    slice gets the agent's mark on its claim and a metric, and the controller's Event; Evict evicts
    through the controller, once the pod's PodDisruptionBudget allows; the tenant's use is the sum of
    its pods'."""
    needs_running_tenants(demo)
    tenant_pods(deployed, "team-a", "gpu-slice", ["use-a", "use-b"])
    tenant_pods(deployed, "data-science", "notebook-gpu", ["greedy"])
    try:
        fake_use(deployed, "team-a", "use-a", "12Gi")  # a 10G slice: over
        fake_use(deployed, "team-a", "use-b", "3Gi")
        node = deployed.json("-n", "team-a", "get", "pod", "use-a")["spec"]["nodeName"]
        # hostPID: each agent shares its kind node's PID namespace, where NVML would number the pods' processes.
        assert not deployed.items("events", "-n", "default", "--field-selector", "reason=GpuProcessesNotVisible")

        def reported() -> bool:
            events = deployed.items("events", "-n", "team-a", "--field-selector",
                                    "involvedObject.name=use-a,reason=GpuMemoryOveruse")
            return bool(events) and metric(deployed, node, "gpuslice_pod_gpu_overuse", pod="use-a") == 1

        deployed.wait_until("the overuse of use-a to be reported (Event and metric)", reported, within=180)
        [event] = deployed.items("events", "-n", "team-a", "--field-selector",
                                 "involvedObject.name=use-a,reason=GpuMemoryOveruse")
        assert event["source"]["component"] == "gpuslice-controller", "the agent marks; the controller posts"
        claim = claim_of(deployed, "team-a", "use-a")
        named = [p["uid"] for d in claim["status"]["devices"] for p in (d.get("data") or {}).get("overusingPods", [])]
        assert named == [deployed.json("-n", "team-a", "get", "pod", "use-a")["metadata"]["uid"]]
        assert deployed.json("-n", "team-a", "get", "pod", "use-a")["status"]["phase"] == "Running", "Report only"
        others = sum(v for n, ls, v in agent_metrics(deployed, node) if n == "gpuslice_pod_gpu_memory_used_bytes"
                     and ls["namespace"] == "team-a" and ls["pod"] not in ("use-a", "use-b"))
        assert metric(deployed, node, "gpuslice_tenant_used_bytes", namespace="team-a",
                      policy="inference") == 15 * 2**30 + others, "the tenant's use is its pods' sum"

        # Evict: the controller's eviction, held first by the greedy pod's PodDisruptionBudget.
        deployed.kubectl("patch", "gsp", "notebooks", "--type=merge", "-p", '{"spec": {"onOveruse": "Evict"}}')
        deployed.kubectl("apply", "-f", "-", input=json.dumps(GREEDY_BUDGET))
        deployed.wait_until("the budget to count the greedy pod", lambda: (deployed.json(
            "-n", "data-science", "get", "pdb", "keep-greedy").get("status") or {}).get("currentHealthy") == 1)
        fake_use(deployed, "data-science", "greedy", "9Gi")  # a 5Gi share: over

        def blocked() -> bool:
            return bool(deployed.items("events", "-n", "data-science", "--field-selector",
                                       "involvedObject.name=greedy,reason=GpuMemoryOveruseEvictionBlocked"))

        deployed.wait_until("the budget to hold the greedy notebook's eviction", blocked, within=180)
        assert deployed.json("-n", "data-science", "get", "pod", "greedy")["status"]["phase"] == "Running"
        deployed.kubectl("-n", "data-science", "delete", "pdb", "keep-greedy")

        def evicted() -> bool:
            return not deployed.items("pods", "-n", "data-science", "--field-selector", "metadata.name=greedy")

        deployed.wait_until("the greedy notebook to be evicted", evicted, within=180)
        assert deployed.json("-n", "data-science", "get", "pod", "notebook")["status"]["phase"] == "Running"
    finally:
        deployed.kubectl("patch", "gsp", "notebooks", "--type=merge", "-p", '{"spec": {"onOveruse": "Report"}}')
        deployed.kubectl("-n", "data-science", "delete", "pdb", "keep-greedy", "--ignore-not-found")
        deployed.kubectl("delete", "pods", "-A", "-l", "gpuslice-test=use", "--wait=true", "--ignore-not-found")


GREEDY_BUDGET = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                 "metadata": {"name": "keep-greedy", "namespace": "data-science"},
                 "spec": {"minAvailable": 1, "selector": {"matchLabels": {"gpuslice-test": "use"}}}}


def lease_holder(kind: Kind) -> str:
    """The controller pod that holds the Lease (its identity is `<hostname>-<random>`, the hostname its pod's)."""
    holder = kind.json("-n", "gpuslice-system", "get", "lease", "gpuslice-controller")["spec"].get("holderIdentity")
    return str(holder or "").rpartition("-")[0]


def lease_identity(kind: Kind) -> str:
    return str(kind.json("-n", "gpuslice-system", "get", "lease", "gpuslice-controller")["spec"].get("holderIdentity"))


def failover_facts(kind: Kind, standby: str) -> str:
    """What a failed failover needs explained: the Lease, each controller pod's state, the standby's log."""
    lease = kind.json("-n", "gpuslice-system", "get", "lease", "gpuslice-controller")["spec"]
    pods = [f"{p['metadata']['name']}: {p['status'].get('phase')}, ready {ready(p)}, restarts {restarts(p)},"
            f" containers {[c.get('state') for c in p['status'].get('containerStatuses', [])]}"
            for p in gpuslice_pods(kind, "controller")]
    log = kind.kubectl("-n", "gpuslice-system", "logs", standby, "-c", "controller", "--tail", "30", check=False)
    return f"Lease {lease}\npods:\n  " + "\n  ".join(pods) + f"\nthe standby's log (last 30 lines):\n{log}"


def container_pid(kind: Kind, pod: dict[str, Any], container: str) -> tuple[str, int]:
    """The node, and the pid there, of one of the pod's containers (as containerd runs it)."""
    node = pod["spec"]["nodeName"]
    ids = kind.node_exec(node, "crictl", "ps", "-q", "--name", f"^{container}$", "--label",
                         f"io.kubernetes.pod.name={pod['metadata']['name']}").split()
    assert len(ids) == 1, f"{pod['metadata']['name']}: containers {ids}"
    info = json.loads(kind.node_exec(node, "crictl", "inspect", ids[0]))
    return node, int(info["info"]["pid"])


def peak_rss_mib(kind: Kind, pod: dict[str, Any], container: str) -> float:
    node, pid = container_pid(kind, pod, container)
    status = kind.node_exec(node, "cat", f"/proc/{pid}/status")
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE).group(1)) / 1024  # type: ignore[union-attr]


def test_probes_hold_on_every_copy_and_the_requests_cover_what_each_uses(deployed: Kind, demo: str) -> None:
    # Two controller copies (one leads, one waits) and an agent per GPU node, all Ready on their probes
    # and never restarted by them, after the demo's policies and pods ran (the standby for minutes).
    controllers, agents = gpuslice_pods(deployed, "controller"), gpuslice_pods(deployed, "agent")
    assert len(controllers) == 2, [p["metadata"]["name"] for p in controllers]
    assert len({p["spec"]["nodeName"] for p in controllers}) == 2, "both copies on one node"
    assert len(agents) == len(deployed.workers)
    for pod in controllers + agents:
        assert ready(pod), f"{pod['metadata']['name']} is not Ready: {pod['status'].get('conditions')}"
        assert restarts(pod) == 0, f"{pod['metadata']['name']} restarted {restarts(pod)} times"
    assert lease_holder(deployed) in {p["metadata"]["name"] for p in controllers}
    # What each process has used at most so far, against the requests the manifests give (docs/install.md,
    # "Installing on a cluster": figures from bench/README.md at 1,000 nodes).
    template = {d["kind"]: d for d in yaml.safe_load_all((REPO / "install.yaml").read_text()) if d}
    figures = {}
    for kind_, pods, container in (("Deployment", controllers, "controller"), ("DaemonSet", agents, "agent")):
        request = parse_quantity(template[kind_]["spec"]["template"]["spec"]["containers"][0]["resources"]
                                 ["requests"]["memory"]) / 2**20
        peaks = [peak_rss_mib(deployed, pod, container) for pod in pods]
        figures[container] = f"peak RSS {max(peaks):.0f} MiB (request {float(request):.0f} MiB)"
        assert max(peaks) < request, f"{container}: {figures[container]}"
    print(f"\nkind tier, measured: {figures}")


def test_the_standby_takes_over_when_the_leader_dies_and_converges_an_edit(deployed: Kind, demo: str) -> None:
    leader = lease_holder(deployed)
    [dying] = [p for p in gpuslice_pods(deployed, "controller") if p["metadata"]["name"] == leader]
    [standby] = [p["metadata"]["name"] for p in gpuslice_pods(deployed, "controller") if p["metadata"]["name"] != leader]
    node, pid = container_pid(deployed, dying, "controller")
    started = time.monotonic()
    dead_identity = lease_identity(deployed)
    # The leader dies without a chance to give the Lease up. Frozen first (SIGSTOP), it renews
    # nothing and is not restarted, so the standby is the only copy left to take the Lease. A
    # SIGKILL alone would race the standby against the kubelet's restart of the same pod, which
    # observes the Lease a second after the kill and runs out its duration barely later than the
    # standby does (a coin toss that CI once lost): that proves a failover, not the standby's.
    deployed.node_exec(node, "kill", "-STOP", str(pid))
    try:
        try:
            # Within the liveness probe's 40-60 s, after which the kubelet restarts the frozen copy.
            deployed.wait_until("the standby to take the Lease", lambda: lease_identity(deployed) != dead_identity,
                                within=38, every=1)
            assert lease_holder(deployed) == standby, f"{lease_holder(deployed)} took the Lease, not the standby {standby}"
        except AssertionError as error:
            raise AssertionError(f"{error}\n{failover_facts(deployed, standby)}") from None
    finally:
        deployed.node_exec(node, "kill", "-9", str(pid))  # and now dead: the kubelet restarts it
    took = time.monotonic() - started
    # The new leader acts: a tenant added to a policy gets its claim template and the status says so.
    deployed.kubectl("create", "namespace", "failover")
    try:
        deployed.kubectl("patch", "gsp", "inference", "--type=json", "-p", json.dumps(
            [{"op": "add", "path": "/spec/tenants/-", "value": {"namespace": "failover", "maxSlices": 1}}]))

        def converged() -> bool:
            policy = deployed.json("get", "gsp", "inference")
            templates = deployed.kubectl("-n", "failover", "get", "resourceclaimtemplates", "-o", "name")
            return (policy["status"].get("observedGeneration") == policy["metadata"]["generation"]
                    and "gpu-slice" in templates)

        deployed.wait_until("the new leader to converge the edited policy", converged, within=120)
        assert lease_holder(deployed) == standby, "the Lease moved again"
    finally:
        deployed.kubectl("patch", "gsp", "inference", "--type=json", "-p", json.dumps(
            [{"op": "test", "path": "/spec/tenants/2/namespace", "value": "failover"},
             {"op": "remove", "path": "/spec/tenants/2"}]), check=False)
        deployed.kubectl("delete", "namespace", "failover", "--wait=false")
    # The dead copy is restarted in place and waits, Ready on its probes.
    def back() -> bool:
        pod = deployed.json("-n", "gpuslice-system", "get", "pod", leader)
        return ready(pod) and restarts(pod) == 1

    deployed.wait_until("the dead copy to come back as the standby", back, within=180)
    print(f"\nkind tier: the standby took over {took:.0f} s after the leader died")


class RolloutWatch:
    """Looks at gpuslice's agents every second while a rollout runs: how many GPU nodes had no ready
    agent at once, and whether old and new agents served side by side (both ready at one moment)."""

    def __init__(self, kind: Kind) -> None:
        self.kind, self.most_unready_agents, self.mixed_agents = kind, 0, False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def __enter__(self) -> RolloutWatch:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()

    def watch(self) -> None:
        workers = len(self.kind.workers)
        while not self.stop.is_set():
            agents = [p for p in gpuslice_pods(self.kind, "agent") if not p["metadata"].get("deletionTimestamp")]
            ready_agents = [p for p in agents if ready(p)]
            self.most_unready_agents = max(self.most_unready_agents, workers - len(ready_agents))
            images = {p["spec"]["containers"][0]["image"] for p in ready_agents}
            self.mixed_agents |= len(images) > 1
            self.stop.wait(1)


def test_an_upgrade_keeps_running_pods_on_their_devices(deployed: Kind, demo: str, tmp_path: Path) -> None:
    needs_running_tenants(demo)
    before = {pod: (deployed.json("-n", pod.split("/")[0], "get", "pod", pod.split("/")[1])["metadata"]["uid"],
                    results(claim_of(deployed, *pod.split("/")))) for pod in TENANT_PODS}
    # The same image under a new tag: every agent and the controller restart, as in an upgrade.
    upgraded = load_upgrade_image(deployed)
    overlay = tmp_path / "upgrade"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        # kustomize takes no absolute path: the overlay, relative to this one.
        "resources": [os.path.relpath(REPO / "manifests/overlays/kind", overlay)],
        "images": [{"name": "gpuslice", "newTag": upgraded.partition(":")[2]}]}))
    # The skew a rolling upgrade goes through (docs/install.md, "Versions and skew"): the CRD and the
    # controller first, then the agents node by node, each Ready (publishing) before the next goes.
    with RolloutWatch(deployed) as watch:
        deployed.kubectl("apply", "--server-side", "-k", str(overlay))
        deployed.kubectl("-n", "gpuslice-system", "rollout", "status", "daemonset/gpuslice-agent", "--timeout=300s")
        deployed.kubectl("-n", "gpuslice-system", "rollout", "status", "deployment/gpuslice-controller",
                         "--timeout=300s")
    assert watch.most_unready_agents <= 1, f"{watch.most_unready_agents} GPU nodes had no ready agent at once"
    assert watch.mixed_agents, "no moment with an old and a new agent both ready was seen"
    agents = deployed.items("pods", "-n", "gpuslice-system", "-l", "app.kubernetes.io/component=agent")
    assert agents, "no agent pods"
    assert {c["image"] for p in agents for c in p["spec"]["containers"]} == {upgraded}
    for pod, (uid, devices) in before.items():
        namespace, name = pod.split("/")
        now = deployed.json("-n", namespace, "get", "pod", name)
        assert now["metadata"]["uid"] == uid, f"{pod} was replaced"
        assert now["status"]["phase"] == "Running", f"{pod} is {now['status']['phase']}"
        assert all(c["restartCount"] == 0 for c in now["status"]["containerStatuses"]), f"{pod} restarted"
        assert results(claim_of(deployed, namespace, name)) == devices, f"{pod}'s allocation changed"

    def published() -> bool:
        slices = deployed.items("resourceslices", "--field-selector", f"spec.driver={DRIVER}")
        names = {(s["spec"]["pool"]["name"], d["name"]) for s in slices for d in s["spec"].get("devices") or []}
        return all((r["pool"], r["device"]) in names for _, devices in before.values() for r in devices)

    deployed.wait_until("the upgraded agents to publish every allocated device", published)
    # The upgraded plugin prepares new claims: one more tenant pod starts.
    pod = next(yaml.safe_load_all((REPO / "examples/tenants/pods.yaml").read_text()))  # the inference tenant
    pod["metadata"].update(name="after-upgrade", namespace="team-b")
    deployed.kubectl("apply", "-f", "-", input=json.dumps(pod))
    deployed.kubectl("-n", "team-b", "wait", "pod/after-upgrade", "--for=condition=Ready", "--timeout=300s")
    assert environment(deployed, "team-b", "after-upgrade").get("GPUSLICE_POLICY") == "inference"
    assert over_allocation(deployed) == []
    # The notebook's MPS daemon went with its agent's container; the upgraded agent started it again
    # before it registered, and the notebook still reaches it.
    node = deployed.json("-n", "data-science", "get", "pod", "notebook")["spec"]["nodeName"]
    assert metric(deployed, node, "gpuslice_agent_mps_daemons", node=node) == 1
    assert "control" in deployed.kubectl("-n", "data-science", "exec", "notebook", "--", "ls", "/tmp/nvidia-mps")


def test_uninstall_leaves_nothing_behind(deployed: Kind, demo: str) -> None:
    # docs/install.md's order ("Uninstalling"): tenants' workloads first, then make kind-undeploy.
    deployed.kubectl("delete", "pods", "-A", "-l", "app.kubernetes.io/name=gpuslice-tenant", "--wait=true")
    deployed.kubectl("-n", "team-b", "delete", "pod", "after-upgrade", "--ignore-not-found", "--wait=true")
    deployed.make("kind-undeploy")
    found = leftovers(deployed)
    assert not found, "left behind:\n" + "\n".join(found)
    labels = deployed.json("get", "namespace", "gpu-monitoring")["metadata"].get("labels", {})
    assert "resource.kubernetes.io/admin-access" not in labels
    nothing_left_on_the_nodes(deployed)
