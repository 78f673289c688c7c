"""Fake GPU Node objects: what the scheduler needs to place pods, nothing more.

They are created Ready with their status set on create, which the apiserver allows
for Nodes, so they can take pods at once. With pod runners (the default) each runner
then heartbeats its node and the node-lifecycle controller marks a node whose runner
stopped NotReady; without them nothing ever does.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuslice.devcluster.pki import CertificateAuthority, kubeconfig
from gpuslice.devcluster.process import Component, HealthCheck
from gpuslice.inventory.catalog import MODELS
from gpuslice.inventory.nodes import FAKE_BACKEND as LABEL_BACKEND
from gpuslice.inventory.nodes import FAKE_COUNT as LABEL_COUNT
from gpuslice.inventory.nodes import FAKE_MODEL as LABEL_MODEL
from gpuslice.inventory.nodes import FAKE_SYSTEM as LABEL_SYSTEM
from gpuslice.inventory.nodes import GFD_COUNT, GFD_MEMORY_MIB, GFD_PRODUCT, product_key
from gpuslice.inventory.systems import SYSTEMS

# Models the fake GPU backend knows, and whole systems (inventory.systems); the node agent and the
# controller read the labels to know what GPUs the node pretends to have.
FAKE_GPU_MODELS = (*MODELS, *SYSTEMS)


def node_name(index: int) -> str:
    return f"gpu-node-{index}"


def gpu_labels(gpu_model: str, gpu_count: int, backend: str) -> dict[str, str]:
    """The fake backend's labels (the agent and the controller read them), or for a node of the mock
    NVML library (``mocknvml``) GPU Feature Discovery's, as a real NVIDIA node has them."""
    if backend == "fake":
        return {LABEL_BACKEND: "fake", LABEL_MODEL: gpu_model, LABEL_COUNT: str(gpu_count)}
    model = MODELS.get(gpu_model)
    product, mib = (model.product_name, model.memory // 2**20) if model else MOCK_ONLY[gpu_model]
    return {LABEL_BACKEND: backend, GFD_PRODUCT: product_key(product), GFD_COUNT: str(gpu_count),
            GFD_MEMORY_MIB: str(mib), GPU_PRESENT: "true"}


# Models only the mock NVML library has (go-nvml's figures: NVML's name and memory).
MOCK_ONLY = {"b200-180gb": ("NVIDIA B200 180GB HBM3e", 184320)}
GPU_PRESENT = "nvidia.com/gpu.present"


def fake_gpu_node(name: str, gpu_model: str, gpu_count: int, backend: str = "fake",
                  system: str | None = None) -> dict[str, Any]:
    """A fake GPU node; ``system`` (``inventory.systems``, e.g. dgx-h100, the fake backend's only): a whole
    server, whose model and count it says, and whose layout (NUMA nodes, PCIe roots, NVLink) its agent
    publishes. A node of the mock NVML library gets its layout from the library (go-nvml's DGX mocks)."""
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    layout = SYSTEMS[system] if system else None
    if layout is not None:
        gpu_model, gpu_count = layout.model, len(layout.gpus)
    labels = {LABEL_SYSTEM: system} if system else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **gpu_labels(gpu_model, gpu_count, backend),
                **labels,
            },
        },
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "FakeGPUNode",
                "message": "gpuslice dev cluster: fake GPU node, no containers run here",
            }],
            "addresses": [{"type": "Hostname", "address": name}],
        },
    }


# A fake node's own directories, as a kubelet and a container runtime have them.
NODE_DIRS = ("plugins_registry", "plugins", "cdi")


def node_layout(root: Path, node: str, server: str, ca: CertificateAuthority) -> Path:
    """Create the node's directories and a kubeconfig for its identity (``system:node:<name>``, under the
    Node authorizer and NodeRestriction); the kubeconfig's path."""
    for sub in NODE_DIRS:
        (root / sub).mkdir(parents=True, exist_ok=True)
    user = f"system:node:{node}"
    path = root / "kubeconfig"
    identity = ca.issue_client(user, ("system:nodes",))
    path.write_text(kubeconfig(server, ca.pair, identity, user, "gpuslice-dev"))
    path.chmod(0o600)
    return path


def pod_runner_component(binary: Path, node: str, root: Path, node_kubeconfig: Path, log: Path,
                         health: HealthCheck | None = None, extra_args: Sequence[str] = ()) -> Component:
    """The node's pod runner (the kubelet's plugin and DRA managers), rooted at the node's directory."""
    return Component(
        f"pod-runner-{node}",
        [str(binary), f"--kubeconfig={node_kubeconfig}", f"--node={node}", f"--root={root}", *extra_args],
        log, health, startup_timeout=30,
    )


def stop_mps_daemons(node_dir: Path) -> list[int]:
    """SIGKILL the MPS control daemons (stand-ins, or NVIDIA's on a node of the mock NVML library) a
    fake node's agent started: they outlive their agent on purpose (its pods keep running), so a
    stopped dev cluster stops them itself. The pids killed."""
    killed = []
    for record in (node_dir / "agent" / "mps").glob("*/*/daemon.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            pid = int(json.loads(record.read_text())["pid"])
            command = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
            if "gpuslice.agent.mps.standin" in command or "nvidia-cuda-mps-control" in command:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed
