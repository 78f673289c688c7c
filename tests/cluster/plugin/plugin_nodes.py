"""A fake GPU node with everything a real one runs (a pod runner and the node agent), and what a
test reads of it: its pods' phases and Events, what their containers were given. Its agent runs the
fake backend, or the NVML backend on the mock NVML library (``devcluster/mocknvml.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.devcluster import mocknvml, operator
from gpuslice.devcluster.cluster import DevCluster, free_port
from gpuslice.devcluster.nodes import stop_mps_daemons
from gpuslice.devcluster.process import Component
from gpuslice.kube.client import KubeClient, KubeError
from tests.cluster.kubeutil import wait_for
from tests.cluster.observe import scrape
from tests.cluster.pools import create_pods, published, tenant_policy


class PluginNode:
    """A fake node: its directories, pod runner and agent, and what tests do to them."""

    def __init__(self, name: str, root: Path, runner: Component, agent_args: list[str], logs: Path,
                 nvml: mocknvml.NvmlNode | None = None, model: str = "") -> None:
        self.name, self.root, self.runner, self.logs = name, root, runner, logs
        self.agent_args = agent_args
        self.nvml, self.model = nvml, model
        self.metrics_port = free_port()
        self.agent: Component = self._agent_component()

    @property
    def agent_kubeconfig(self) -> Path:
        """The agent's kubeconfig: its ServiceAccount's token, bound to this node."""
        return self.logs / f"agent-{self.name}.kubeconfig"

    def _agent_component(self, env: dict[str, str] | None = None) -> Component:
        backend = self.nvml.agent_args() if self.nvml else ("--backend=fake",)
        component = operator.agent_component(self.name, self.agent_kubeconfig, self.logs / f"agent-{self.name}.log",
                                             self.metrics_port, self.root, self.agent_args, env, backend)
        return component

    async def metrics(self) -> dict[str, float]:
        """The agent's Prometheus samples, by name with labels."""
        return await scrape(f"http://127.0.0.1:{self.metrics_port}/metrics")

    @property
    def agent_log(self) -> str:
        return (self.logs / f"agent-{self.name}.log").read_text(errors="replace")

    async def start_agent(self, kill_at: str | None = None, wait: bool = True, boot_id: str | None = None) -> None:
        """Start the agent (with a test kill point armed, if given: it then dies there; with
        ``boot_id``, as if the node had booted again: it reads that as the kernel's boot ID)."""
        env = {**os.environ, "GPUSLICE_TEST_KILL_AT": kill_at} if kill_at else None
        if boot_id is not None:
            (self.root / "boot_id").write_text(boot_id + "\n")
            env = {**(env or os.environ), "GPUSLICE_BOOT_ID_FILE": str(self.root / "boot_id")}
        self.agent = self._agent_component(env)
        await self.agent.start()
        if wait:
            await self.agent.wait_healthy()

    async def kill_agent(self) -> None:
        """SIGKILL, as the OOM killer or a node crash would: no clean-up, sockets left behind."""
        if self.agent.process is not None and self.agent.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.agent.process.pid, signal.SIGKILL)
            await self.agent.process.wait()

    async def agent_died(self) -> bool:
        return not self.agent.running

    def recorded(self, namespace: str, pod: str) -> dict[str, Any] | None:
        """What the pod's container was given, as the pod runner recorded it."""
        for path in sorted((self.root / "containers").glob(f"{namespace}_{pod}_*/*.json")):
            data: dict[str, Any] = json.loads(path.read_text())
            return data
        return None

    def env(self, namespace: str, pod: str) -> dict[str, str]:
        recorded = self.recorded(namespace, pod) or {}
        return dict(line.split("=", 1) for line in recorded.get("env") or [])

    def cdi_specs(self) -> list[str]:
        return sorted(p.name for p in (self.root / "cdi").glob("gpuslice.dev-gpu_*.json"))

    def checkpoints(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.root / "agent" / "claims").glob("*.json"))]

    def fake_state(self) -> dict[str, Any]:
        path = self.root / "agent" / "fake-gpus.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def mig_instances(self, gpu: int = 0) -> list[tuple[str, int]]:
        """(profile, start) of the fake GPU's MIG instances, as its state file holds them (the fake
        backend's, or the mock NVML library's)."""
        if self.nvml is not None:
            state = self.nvml.state.read().gpus.get(str(gpu))
            names = mocknvml.profile_names(self.model)
            return sorted((names[i.profile_id], i.start) for i in (state.instances if state else []))
        instances = (self.fake_state().get("gpus") or {}).get(str(gpu), {}).get("instances") or []
        return sorted((i["profile"], i["start"]) for i in instances)

    def mig_modes(self) -> list[bool]:
        """Each GPU's MIG mode (current), as the fake backend's or the mock library's state has it."""
        if self.nvml is not None:
            config = self.nvml.state.config
            state = self.nvml.state.read()
            return [state.gpu(config, i).mig_mode == 1 for i in range(len(config["gpus"]))]  # type: ignore[arg-type]
        return [g["mig_enabled"] for g in self.fake_state()["gpus"].values()]

    def mig_uuids(self) -> dict[tuple[int, int], str]:
        """(GPU, placement start) -> the MIG device's UUID, of every instance."""
        if self.nvml is not None:
            return {(int(i), gi.start): ci.uuid for i, g in self.nvml.state.read().gpus.items()
                    for gi in g.instances for ci in gi.compute_instances}
        return {(int(i), m["start"]): m["uuid"] for i, g in self.fake_state()["gpus"].items() for m in g["instances"]}

    def fake_gpu(self, *args: str) -> str:
        """Run `gpuslice fake-gpu --state-dir <agent state> ARGS...`; its output."""
        done = subprocess.run([sys.executable, "-m", "gpuslice", "fake-gpu", "--state-dir", str(self.root / "agent"),
                               *args], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    async def registered(self) -> bool:
        return "registered with the kubelet" in self.agent_log

    def mps_daemons(self) -> dict[tuple[str, str], int]:
        """The running MPS control daemons (stand-ins) of this node, pid by (GPU UUID, namespace), from
        the agent's records, checked against the processes that are alive."""
        found = {}
        for record in (self.root / "agent" / "mps").glob("*/*/daemon.json"):
            body = json.loads(record.read_text())
            if process_alive(int(body["pid"])):
                found[(str(body["gpu"]), str(body["namespace"]))] = int(body["pid"])
        return found

    async def metric(self, name: str, labels: dict[str, str]) -> float | None:
        """One sample the agent serves now (None: no such series)."""
        return await scraped(self.metrics_port, name, labels)

    def kill_mps_daemons(self) -> None:
        stop_mps_daemons(self.root)


async def scraped(port: int, name: str, labels: dict[str, str]) -> float | None:
    """One sample the process serving metrics on ``port`` serves now (None: no such series)."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def fake_gpus_mig_mode(args: Sequence[str]) -> bool | None:
    """The MIG mode the fake backend's ``--fake-gpus MODEL:N:mig-on|off`` starts with, if it says one."""
    for i, arg in enumerate(args[:-1]):
        if arg == "--fake-gpus":
            suffix = args[i + 1].rsplit(":", 1)[-1]
            return {"mig-on": True, "mig-off": False}.get(suffix)
    return None


def without_fake_gpus(args: Sequence[str]) -> list[str]:
    """``args`` less the fake backend's ``--fake-gpus VALUE`` (an NVML node's GPUs are the library's)."""
    return [a for i, a in enumerate(args) if a != "--fake-gpus" and (i == 0 or args[i - 1] != "--fake-gpus")]


def process_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


PluginNodeFactory = Callable[..., Awaitable[PluginNode]]


async def one_gpu_with_pods(kube: KubeClient, make_policy: Callable[..., Awaitable[dict[str, Any]]],
                            plugin_node: PluginNodeFactory, namespace: str, slicing: dict[str, Any], devices: int,
                            pods: Sequence[str], agent_args: Sequence[str] = ()) -> tuple[PluginNode, str]:
    """A fake node of one H100 with a policy of ``slicing`` for ``namespace``, its ``devices``
    published, and ``pods`` (of the policy's template) Running; the node and the policy's name."""

    node = await plugin_node("h100-80gb", 1, agent_args)
    policy = await tenant_policy(make_policy, namespace, node.name, slicing)
    await published(kube, node.name, devices)
    if pods:
        await create_pods(kube, namespace, "gpu-slice", list(pods))
        await running(kube, namespace, pods)
    return node, policy


async def pod_phase(kube: KubeClient, namespace: str, pod: str) -> str | None:
    try:
        return str((await kube.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")).get("status", {}).get("phase"))
    except KubeError as error:
        if error.status == 404:
            return None
        raise


async def running(kube: KubeClient, namespace: str, pods: Sequence[str], within: float = 60) -> None:
    async def check() -> bool:
        return all([await pod_phase(kube, namespace, p) == "Running" for p in pods])

    await wait_for(check, within=within, what=f"pods {', '.join(pods)} to be Running")


async def gone(kube: KubeClient, namespace: str, pods: Sequence[str], within: float = 60) -> None:
    async def check() -> bool:
        return all([await pod_phase(kube, namespace, p) is None for p in pods])

    await wait_for(check, within=within, what=f"pods {', '.join(pods)} to be unprepared and removed")


async def pod_events(kube: KubeClient, namespace: str, pod: str) -> list[dict[str, Any]]:
    return [e for e in await kube.list(f"/api/v1/namespaces/{namespace}/events") if e["involvedObject"]["name"] == pod]


async def event_with(kube: KubeClient, namespace: str, pod: str, text: str, within: float = 60) -> dict[str, Any]:
    async def found() -> list[dict[str, Any]]:
        return [e for e in await pod_events(kube, namespace, pod) if text in e.get("message", "")]

    events: list[dict[str, Any]] = await wait_for(found, within=within, what=f"an Event on {pod} saying {text!r}")
    return events[0]


def exec_env(cluster: DevCluster, namespace: str, pod: str) -> dict[str, str]:
    """`gpuslice dev-cluster exec-env`, as a user runs it."""
    done = subprocess.run([sys.executable, "-m", "gpuslice", "dev-cluster", "exec-env", f"{namespace}/{pod}",
                           "--state-dir", str(cluster.state.root)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


async def until(check: Callable[[], Any], within: float = 30, what: str = "condition") -> Any:
    async def poll() -> Any:
        return check()

    return await wait_for(poll, within=within, what=what)


def mps_mounts(node: PluginNode, namespace: str, pod: str) -> dict[str, str]:
    """containerPath -> hostPath of the MPS mounts the pod runner resolved for the pod's container."""
    recorded = node.recorded(namespace, pod) or {}
    return {m["destination"]: m["source"] for m in recorded.get("mounts") or []
            if m["destination"] in ("/tmp/nvidia-mps", "/var/log/nvidia-mps", "/dev/shm")}


async def killed_at(node: PluginNode, point: str) -> None:
    await wait_for(node.agent_died, within=60, what=f"the agent to kill itself at {point}")
    assert node.agent.process is not None
    assert node.agent.process.returncode == -9
