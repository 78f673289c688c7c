"""A kind cluster as the kind tier drives it: its tools, its nodes, and the time each step took."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


# No "gpuslice" in it: the uninstall sweep looks for that name. GPUSLICE_KIND_CLUSTER runs the tier on
# a cluster of another name (two checkouts on one machine).
CLUSTER = os.environ.get("GPUSLICE_KIND_CLUSTER", "kind-tier")
TIMINGS: dict[str, float] = {}


def cache_dir() -> Path:
    explicit = os.environ.get("GPUSLICE_CACHE_DIR")
    if explicit:
        return Path(explicit) / "kind"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuslice" / "kind"


@dataclass
class Kind:
    """One kind cluster, and the commands the README gives, with this build's binaries and images."""

    build: dict[str, str]
    workdir: Path
    cluster: str = CLUSTER
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.kubeconfig = self.workdir / "kubeconfig"
        self.env = {**os.environ, "KUBECONFIG": str(self.kubeconfig),
                    "PATH": f"{self.build['binDir']}{os.pathsep}{os.environ['PATH']}"}

    def run(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 900) -> str:
        done = subprocess.run(args, env=self.env, cwd=REPO, input=input, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"`{shlex.join(args)}` exited {done.returncode}:\n{done.stdout[-4000:]}\n"
                                 f"{done.stderr[-4000:]}")
        return done.stdout + done.stderr if not check else done.stdout

    def make(self, target: str, **variables: str) -> str:
        """A README target with this tier's binaries and images, its output streamed as it runs;
        returns the output, and records the time in TIMINGS."""
        settings = {"KIND": self.build["kind"], "KUBECTL": self.build["kubectl"], "KIND_CLUSTER": self.cluster,
                    **variables}
        args = ["make", "--no-print-directory", target, *(f"{k}={v}" for k, v in settings.items())]
        print(f"\n>>> {shlex.join(args)}", flush=True)
        started = time.monotonic()
        process = subprocess.Popen(args, env=self.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            print(f"  {line}", end="", flush=True)
            lines.append(line)
        TIMINGS[target] = time.monotonic() - started
        output = "".join(lines)
        if process.wait() != 0:
            raise AssertionError(f"`make {target}` exited {process.returncode}:\n{output[-6000:]}")
        return output

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self.run(self.build["kubectl"], *args, input=input, check=check)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def items(self, *args: str) -> list[dict[str, Any]]:
        return list(self.json("get", *args)["items"])

    def node_exec(self, node: str, *command: str) -> str:
        return self.run("docker", "exec", node, *command)

    @property
    def workers(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.items("nodes")
                if n["metadata"].get("labels", {}).get("gpuslice.dev/gpu-backend") == "fake"]

    @property
    def image_nodes(self) -> list[str]:
        """Every node but the control plane: where make kind-deploy loads the images, and where the
        controller's and webhook's replicas may land (the NVML workers included)."""
        return [n["metadata"]["name"] for n in self.items("nodes")
                if "node-role.kubernetes.io/control-plane" not in n["metadata"].get("labels", {})]

    def wait_until(self, what: str, check: Any, within: float = 300, every: float = 2) -> Any:
        deadline = time.monotonic() + within
        while True:
            if result := check():
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {within:.0f} s waiting for {what}")
            time.sleep(every)


def cluster_config(build: dict[str, str], extra_nodes: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """kind/cluster.yaml with hack/kind/local-patch.yaml merged in and ``extra_nodes`` added (the tier's
    NVML workers), every node on the local image."""
    config: dict[str, Any] = yaml.safe_load((REPO / "kind/cluster.yaml").read_text())
    patch = yaml.safe_load((REPO / "hack/kind/local-patch.yaml").read_text())
    for key, value in patch.items():
        if isinstance(value, list):
            config[key] = [*config.get(key, []), *value]
        elif isinstance(value, dict):
            config[key] = {**config.get(key, {}), **value}
        else:
            config[key] = value
    config["nodes"] = [*config["nodes"], *extra_nodes]
    for node in config["nodes"]:
        node["image"] = build["nodeImage"]
    return config
