"""Kind nodes whose gpuslice agent runs the NVML backend on the mock ``libnvidia-ml.so.1``, and
NVIDIA's tools on them (tests/kind/test_nvidia.py).

Each node's driver root is laid out here, on the host, by the dev cluster's own code
(``devcluster.mocknvml.make_driver_root``: the library, real character devices made with mknod,
``proc/devices``, ``mig-minors`` and the MIG capability files), and mounted into the node container
at one fixed path (kind's ``extraMounts``), with NVIDIA's binaries (nvidia-ctk, nvidia-cdi-hook,
the device plugin) beside it. The toolkit's spec is written by ``nvidia-ctk cdi generate`` inside the
node, over the root as the node sees it, so every path in it is the node's own.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import yaml

from gpuslice.devcluster.mocknvml import LIB_DIR, MANAGEMENT, make_driver_root, node_config, state_file
from gpuslice.devcluster.nodes import gpu_labels
from gpuslice.devcluster.nvidia_build import container_toolkit, device_plugin, mock_nvml_library
from tests.kind.kindutil import Kind

ROOT = "/var/lib/gpuslice-mock-nvml"  # in each NVML node: nvidia/ (the driver root), proc/, nvidia-cdi/
DRIVER_ROOT, HOST_PROC, CDI_DIR = f"{ROOT}/nvidia", f"{ROOT}/proc", f"{ROOT}/nvidia-cdi"
TOOLS = "/opt/nvidia-tools"  # ctk/ (nvidia-ctk, nvidia-cdi-hook) and device-plugin/
CTK, PLUGIN = f"{TOOLS}/ctk/nvidia-ctk", f"{TOOLS}/device-plugin/nvidia-device-plugin"
PLUGIN_PID = "/run/nvidia-device-plugin.pid"
# pool label (kind/cluster.yaml's gpuslice.dev/pool, which the uninstall checks already allow on a
# Node) -> (model, GPUs). A memory slice and a MIG device need two nodes: policies of two modes may not
# select one node's GPUs of one product (planning.validation, ConflictingPolicy).
NODES = {"nvml-memory": ("h100-80gb", 1), "nvml-mig": ("a100-40gb", 1)}
AGENT = "gpuslice-agent-nvml"


def prepare(workdir: Path) -> dict[str, Path]:
    """Each NVML node's directory on the host (its driver root in MIG mode as the dev cluster starts
    one: on before Hopper, off from Hopper on), by pool."""
    library = mock_nvml_library()
    dirs = {}
    for pool, (model, count) in NODES.items():
        node_dir = workdir / "nvml" / pool
        mig = model.startswith("a100")
        make_driver_root(node_dir / "nvidia", node_config(pool, model, count, mig), library, node_dir / "proc")
        (node_dir / "nvidia-cdi").mkdir(parents=True, exist_ok=True)
        dirs[pool] = node_dir
    return dirs


def node_entries(dirs: dict[str, Path]) -> list[dict[str, Any]]:
    """kind's config for the NVML workers: the label the NVML agent's DaemonSet selects, and the mounts."""
    return [{"role": "worker", "labels": {"gpuslice.dev/gpu-backend": "nvml", "gpuslice.dev/pool": pool},
             "extraMounts": [{"hostPath": str(node_dir), "containerPath": ROOT},
                             {"hostPath": str(container_toolkit()), "containerPath": f"{TOOLS}/ctk", "readOnly": True},
                             {"hostPath": str(device_plugin().parent), "containerPath": f"{TOOLS}/device-plugin",
                              "readOnly": True}]}
            for pool, node_dir in dirs.items()]


def nvml_nodes(kind: Kind) -> dict[str, str]:
    """pool -> node name."""
    return {n["metadata"]["labels"]["gpuslice.dev/pool"]: n["metadata"]["name"] for n in kind.items("nodes")
            if n["metadata"].get("labels", {}).get("gpuslice.dev/gpu-backend") == "nvml"}


def generate(kind: Kind, node: str, output: str, *args: str) -> dict[str, Any]:
    """NVIDIA's ``nvidia-ctk cdi generate`` in the node over its driver root (in a mount namespace where
    ``/proc/driver`` is the root's: nvml mode reads the host's ``mig-minors``), as
    ``devcluster.mocknvml.generate_spec`` runs it; the spec."""
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-ec",
               'mount --bind "$0" /proc/driver; exec "$@"', f"{DRIVER_ROOT}/proc/driver", CTK, "cdi", "generate",
               f"--driver-root={DRIVER_ROOT}", f"--nvidia-cdi-hook-path={TOOLS}/ctk/nvidia-cdi-hook",
               f"--output={output}", *args]
    kind.node_exec(node, *command)
    spec: dict[str, Any] = yaml.safe_load(kind.node_exec(node, "cat", output))
    return spec


def toolkit_spec(kind: Kind, node: str, mig: bool) -> dict[str, Any]:
    """The node's toolkit spec in the agent's --nvidia-cdi-dir; the GPU Operator's management spec where
    every GPU is in MIG mode with no instance (nvml mode cannot write one there: docs/nvidia.md)."""
    return generate(kind, node, f"{CDI_DIR}/nvidia.yaml", *(MANAGEMENT if mig else ()))


def label(kind: Kind, node: str, model: str, count: int, on: bool) -> None:
    """GPU Feature Discovery's labels, from which the controller takes the node's GPUs (on a real node
    GFD sets them); taken off again afterwards."""
    labels = {k: v for k, v in gpu_labels(model, count, "nvml").items() if k.startswith("nvidia.com/")}
    if on:
        kind.kubectl("label", "node", node, "--overwrite", *(f"{k}={v}" for k, v in labels.items()))
    else:
        kind.kubectl("label", "node", node, *(f"{k}-" for k in labels))


def agent_daemonset(kind: Kind) -> dict[str, Any]:
    """The installed agent's DaemonSet, made over for the NVML nodes: its nodes, the NVML backend on the
    mock driver root, the toolkit's spec and the root's kernel files as --host-proc (the node's own /proc
    has no NVIDIA driver), each mounted at its node path."""
    found = kind.json("-n", "gpuslice-system", "get", "daemonset", "gpuslice-agent")
    meta = {k: found["metadata"][k] for k in ("namespace", "labels")}
    body: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {**meta, "name": AGENT},
                            "spec": found["spec"]}
    component = {"app.kubernetes.io/component": "agent-nvml"}
    body["spec"]["selector"]["matchLabels"].update(component)
    template = body["spec"]["template"]
    template["metadata"]["labels"].update(component)
    template["metadata"].pop("annotations", None)
    pod = template["spec"]
    pod["nodeSelector"] = {"gpuslice.dev/gpu-backend": "nvml"}
    container = pod["containers"][0]
    args = [a for a in container["args"] if not a.startswith(("--backend=", "--host-proc="))]
    container["args"] = [*args, "--backend=nvml", f"--nvidia-driver-root={DRIVER_ROOT}",
                         f"--nvidia-cdi-dir={CDI_DIR}", f"--host-proc={HOST_PROC}"]
    container["volumeMounts"].append({"name": "mock-nvml", "mountPath": ROOT})
    pod["volumes"].append({"name": "mock-nvml", "hostPath": {"path": ROOT, "type": "Directory"}})
    return body


def start_device_plugin(kind: Kind, node: str) -> None:
    """NVIDIA's device plugin as a process of the node (as its DaemonSet's container would run it, in the
    host's namespaces), over the mock library; its pid in PLUGIN_PID, its log beside it."""
    plugin = shlex.join(["env", f"LD_LIBRARY_PATH={DRIVER_ROOT}/{LIB_DIR}", PLUGIN,
                         f"--nvidia-driver-root={DRIVER_ROOT}", "--fail-on-init-error=true"])
    kind.run("docker", "exec", "-d", node, "sh", "-c",
             f"echo $$ > {PLUGIN_PID}; exec {plugin} > /var/log/nvidia-device-plugin.log 2>&1")


def stop_device_plugin(kind: Kind, node: str) -> None:
    kind.node_exec(node, "sh", "-c", f"test ! -f {PLUGIN_PID} || {{ kill $(cat {PLUGIN_PID}); rm {PLUGIN_PID}; }}")


def plugin_log(kind: Kind, node: str) -> str:
    return kind.run("docker", "exec", node, "cat", "/var/log/nvidia-device-plugin.log", check=False)[-3000:]


def mig_instances(node_dir: Path) -> list[dict[str, Any]]:
    """The MIG instances the mock library holds (its state file), each with its GPU's index."""
    state = state_file(node_dir / "nvidia").read()
    return [{"gpu": int(index), **json.loads(gi.model_dump_json(by_alias=True))}
            for index, gpu in state.gpus.items() for gi in gpu.instances]
