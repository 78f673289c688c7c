"""gpuslice on kind nodes of NVIDIA's own code: the agent's NVML backend on the mock
``libnvidia-ml.so.1`` (go-nvml's DGX mocks) under a fake driver root, each container's CDI edits
set against what ``nvidia-ctk cdi generate`` writes for that device, and NVIDIA's device plugin as a
live neighbour on the same library (tests/kind/nvidia.py lays the nodes out). Run right after the
image test, on the first kustomize install, and leaves nothing of its own.

Two NVML workers (kind config from tests/kind/conftest.py): an H100 (memory slices; later the device
plugin's node) and an A100 40GB in MIG mode (dynamic MIG). What a container got is read in the running
container, under the real kubelet, containerd and runc: its device nodes (numbers included) and
environment, the toolkit's mounts and the links its hooks made. What gpuslice adds of its own
(``GPUSLICE_*``) and what only a real driver does (docs/nvidia.md) are the documented differences.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.kind import nvidia
from tests.kind.checks import DRIVER, claim_of, gpuslice_pods, ready, results
from tests.kind.kindutil import REPO, Kind

NAMESPACE = "nvml-tenant"
POLICIES = [
    {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": "nvml-memory"},
     "spec": {"nodeSelector": {"matchLabels": {"gpuslice.dev/pool": "nvml-memory"}},
              "gpuSelector": {"products": ["NVIDIA H100 80GB HBM3"]},
              "slicing": {"mode": "memory", "sliceSize": "10G"},
              "tenants": [{"namespace": NAMESPACE, "maxSlices": 2}], "claimTemplateName": "nvml-slice"}},
    {"apiVersion": "gpuslice.dev/v1alpha1", "kind": "GpuSlicePolicy", "metadata": {"name": "nvml-mig"},
     "spec": {"nodeSelector": {"matchLabels": {"gpuslice.dev/pool": "nvml-mig"}},
              "gpuSelector": {"products": ["NVIDIA A100-SXM4-40GB"]},
              "slicing": {"mode": "mig", "mig": {"profiles": ["1g.5gb"]}},
              "tenants": [{"namespace": NAMESPACE, "maxMigDevices": {"1g.5gb": 1}}], "claimTemplateName": "nvml-mig"}},
]
# What the container reads of itself: every NVIDIA device node with its type and numbers, then env.
SEEN = ("for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c \"$f\" ] && stat -c '%n %F %t:%T' \"$f\"; done;"
        " echo ---; env")


@pytest.fixture(scope="module")
def nvml(deployed: Kind) -> Iterator[dict[str, str]]:
    """The NVML workers (pool -> node) with GFD's labels, the toolkit's spec, the NVML agent and the two
    policies; all of it taken away afterwards."""
    kind = deployed
    nodes = nvidia.nvml_nodes(kind)
    assert sorted(nodes) == sorted(nvidia.NODES), f"the NVML workers are missing: {nodes}"
    for pool, node in nodes.items():
        model, count = nvidia.NODES[pool]
        nvidia.toolkit_spec(kind, node, mig=model.startswith("a100"))
        nvidia.label(kind, node, model, count, on=True)
    kind.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(nvidia.agent_daemonset(kind)))
    kind.kubectl("create", "namespace", NAMESPACE)
    kind.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(POLICIES))
    try:
        kind.kubectl("-n", "gpuslice-system", "rollout", "status", f"daemonset/{nvidia.AGENT}", "--timeout=300s")
        kind.kubectl("wait", "gsp", "nvml-memory", "nvml-mig", "--for=condition=Ready", "--timeout=300s")
        yield nodes
    finally:
        for node in nodes.values():
            nvidia.stop_device_plugin(kind, node)
        kind.kubectl("-n", NAMESPACE, "delete", "pod", "--all", "--wait=true", "--timeout=120s", check=False)
        kind.kubectl("delete", "gsp", "nvml-memory", "nvml-mig", "--wait=true", "--timeout=120s", check=False)
        kind.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s", check=False)
        # Its pods gone too before the next module lists gpuslice-system's pods.
        kind.kubectl("-n", "gpuslice-system", "delete", "daemonset", nvidia.AGENT, "--cascade=foreground",
                     "--wait=true", "--timeout=120s", check=False)
        for pool, node in nodes.items():
            model, count = nvidia.NODES[pool]
            nvidia.label(kind, node, model, count, on=False)
        kind.wait_until("the NVML nodes' slices to be gone", lambda: not [
            s for s in kind.items("resourceslices") if s["spec"]["driver"] == DRIVER
            and s["spec"].get("nodeName") in nodes.values()], within=120)


def tenant_pod(kind: Kind, name: str, template: str) -> dict[str, Any]:
    pod = next(yaml.safe_load_all((REPO / "examples/tenants/pods.yaml").read_text()))
    pod["metadata"].update(name=name, namespace=NAMESPACE)
    pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = template
    kind.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
    kind.kubectl("-n", NAMESPACE, "wait", f"pod/{name}", "--for=condition=Ready", "--timeout=300s")
    return kind.json("-n", NAMESPACE, "get", "pod", name)  # type: ignore[no-any-return]


def seen(kind: Kind, pod: str) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """The container's NVIDIA device nodes (path -> (type, major:minor in hex)) and environment."""
    out = kind.kubectl("-n", NAMESPACE, "exec", pod, "--", "sh", "-c", SEEN)
    nodes_part, env_part = out.split("---\n", 1)
    nodes = {}
    for line in nodes_part.splitlines():
        path, rest = line.split(" ", 1)
        kind_of, numbers = rest.rsplit(" ", 1)
        nodes[path] = (kind_of, numbers)
    env = dict(line.split("=", 1) for line in env_part.splitlines() if "=" in line)
    return nodes, env


def expected_nodes(kind: Kind, node: str, edits: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """The device nodes nvidia-ctk's edits give a container: its path -> the host node's type and numbers."""
    found = {}
    for edit in edits:
        for device in edit.get("deviceNodes", []):
            host = device.get("hostPath", device["path"])
            numbers = kind.node_exec(node, "stat", "-c", "%t:%T", host).strip()
            found[device["path"]] = ("character special file", numbers)
    return found


def ctk_device(spec: dict[str, Any], name: str) -> dict[str, Any]:
    names = [d["name"] for d in spec["devices"]]
    assert name in names, f"nvidia-ctk wrote no device {name}: {names}"
    return next(d["containerEdits"] for d in spec["devices"] if d["name"] == name)  # type: ignore[no-any-return]


def assert_edits_as_nvidia_ctks(kind: Kind, node: str, pod: str, device: dict[str, Any],
                                common: dict[str, Any]) -> None:
    """The running container got nvidia-ctk's device nodes for the device (no other), its environment,
    its mounts, and what its create-symlinks hooks link."""
    nodes, env = seen(kind, pod)
    assert nodes == expected_nodes(kind, node, [device, common])
    for variable in [*common.get("env", []), *device.get("env", [])]:
        key, value = variable.split("=", 1)
        assert env.get(key) == value, f"{key}: nvidia-ctk sets {value!r}, the container has {env.get(key)!r}"
    ours = {k for k in env if k.startswith("GPUSLICE_")}
    assert {"GPUSLICE_DEVICE", "GPUSLICE_CLAIM", "GPUSLICE_POLICY"} <= ours  # gpuslice's own (documented)
    paths = [m["containerPath"] for m in [*common.get("mounts", []), *device.get("mounts", [])]
             if m["hostPath"] != "/dev/null"]
    links = []
    for hook in common.get("hooks", []):
        args = hook.get("args", [])
        if "create-symlinks" in args:
            links += [a.split("::", 1)[1] for a, flag in zip(args[1:], args, strict=False) if flag == "--link"]
    assert paths, f"nvidia-ctk's spec has no mounts to check: {common}"
    assert links, f"nvidia-ctk's spec has no create-symlinks hook to check: {common}"
    checks = " && ".join(f"test -e {p}" for p in paths) + " && " + " && ".join(f"test -L {link}" for link in links)
    kind.kubectl("-n", NAMESPACE, "exec", pod, "--", "sh", "-c", checks)


def test_a_memory_slice_pod_on_the_nvml_node_gets_nvidia_ctks_edits_for_its_gpu(
        deployed: Kind, nvml: dict[str, str]) -> None:
    kind, node = deployed, nvml["nvml-memory"]
    pod = tenant_pod(kind, "slice", "nvml-slice")
    assert pod["spec"]["nodeName"] == node
    (result,) = results(claim_of(kind, NAMESPACE, "slice"))
    assert result["pool"] == node
    spec = yaml.safe_load(kind.node_exec(node, "cat", f"{nvidia.CDI_DIR}/nvidia.yaml"))
    assert_edits_as_nvidia_ctks(kind, node, "slice", ctk_device(spec, "0"), spec["containerEdits"])


def test_a_mig_pod_on_the_nvml_node_gets_nvidia_ctks_edits_for_its_instance(
        deployed: Kind, nvml: dict[str, str]) -> None:
    kind, node = deployed, nvml["nvml-mig"]
    node_dir = kind.workdir / "nvml" / "nvml-mig"
    assert nvidia.mig_instances(node_dir) == []
    pod = tenant_pod(kind, "mig", "nvml-mig")
    assert pod["spec"]["nodeName"] == node
    (instance,) = nvidia.mig_instances(node_dir)  # made by the agent through the library at prepare
    (compute,) = instance["computeInstances"]
    # Generated now, with the instance there: nvml mode names it by index and by UUID.
    spec = nvidia.generate(kind, node, "/tmp/nvidia-after-prepare.yaml")
    assert_edits_as_nvidia_ctks(kind, node, "mig", ctk_device(spec, compute["uuid"]), spec["containerEdits"])
    kind.kubectl("-n", NAMESPACE, "delete", "pod", "mig", "--wait=true", "--timeout=120s")
    kind.wait_until("the instance to be destroyed at unprepare", lambda: nvidia.mig_instances(node_dir) == [],
                    within=120)


def test_nvidias_device_plugin_on_the_node_takes_its_gpus_out_of_gpuslices_slices(
        deployed: Kind, nvml: dict[str, str]) -> None:
    kind, node = deployed, nvml["nvml-memory"]

    def devices() -> list[dict[str, Any]]:
        return [d for s in kind.items("resourceslices") if s["spec"]["driver"] == DRIVER
                and s["spec"].get("nodeName") == node for d in s["spec"].get("devices", [])]

    kind.kubectl("-n", NAMESPACE, "delete", "pod", "--all", "--wait=true", "--timeout=120s")
    assert kind.wait_until("the node's devices published", devices, within=120)
    assert all(ready(p) for p in gpuslice_pods(kind, "agent-nvml"))
    nvidia.start_device_plugin(kind, node)

    def advertised() -> bool:
        allocatable = kind.json("get", "node", node)["status"]["allocatable"]
        return str(allocatable.get("nvidia.com/gpu", "0")) == "1"

    try:
        kind.wait_until("the kubelet to advertise the plugin's nvidia.com/gpu", advertised, within=120)
    except AssertionError as failure:
        raise AssertionError(f"{failure}\nthe plugin's log:\n{nvidia.plugin_log(kind, node)}") from None
    kind.wait_until("the agent to withdraw the node's devices", lambda: not devices(), within=120)

    def event() -> list[dict[str, Any]]:
        return [e for e in kind.items("events", "-A", "--field-selector", f"involvedObject.name={node}")
                if e["reason"] == "GpuAdvertisedByDevicePlugin"]

    (told, *_) = kind.wait_until("the agent's Warning Event on the Node", event, within=60)
    assert told["type"] == "Warning", told
    assert "nvidia.com/gpu: 1" in told["message"], told

    def degraded() -> dict[str, Any] | None:
        conditions = kind.json("get", "gsp", "nvml-memory").get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"), None)

    condition = kind.wait_until("the policy's Degraded condition", degraded, within=120)
    assert condition["reason"] == "DevicePlugin", condition
    assert kind.json("get", "gsp", "nvml-mig")["status"]["conditions"], "the other node's policy is untouched"
    assert not any(c["type"] == "Degraded" and c["status"] == "True"
                   for c in kind.json("get", "gsp", "nvml-mig")["status"]["conditions"])
