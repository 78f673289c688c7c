"""The bench's control plane: a dev cluster without pod runners, gpuslice installed, fake
nodes made and removed per scenario, and the counters the figures read (the scheduler's
CPU time from /proc, the apiserver's own request metrics, processes' peak RSS)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from gpuslice.backoff import Backoff
from gpuslice.coordinates import (
    EVENTS,
    NAMESPACES,
    NODES,
    POLICIES,
    SLICES,
    claim_path,
    claims_in,
    device_class_path,
    namespace_path,
    node_path,
    pods_in,
)
from gpuslice.devcluster import binaries as binaries_module
from gpuslice.devcluster import operator as gpuslice_install
from gpuslice.devcluster.cluster import ClusterSpec, DevCluster
from gpuslice.devcluster.nodes import fake_gpu_node
from gpuslice.devcluster.ports import free_port
from gpuslice.devcluster.process import Component
from gpuslice.dra.names import DRIVER
from gpuslice.errors import GpusliceError
from gpuslice.kube.client import Conflict, KubeClient, KubeError
from gpuslice.kube.watch import list_all

CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(GpusliceError):
    """The bench could not measure something; the message says what and where to look."""


class BenchPartial(GpusliceError):
    """A figure failed part-way: ``measured`` is what it had (kept in results.json beside the error)."""

    def __init__(self, measured: dict[str, Any], error: BaseException, post_mortem: str = "") -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.measured = measured
        self.error = error
        self.post_mortem = post_mortem


async def wait_until(check: Callable[[], Awaitable[Any]], within: float, what: str, every: float = 0.5) -> Any:
    """Poll ``check`` until truthy; a BenchError naming ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(KubeError, OSError):
            if result := await check():
                return result
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {within:.0f} s waiting for {what}")
        await asyncio.sleep(every)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def peak_rss_mib(pid: int) -> float:
    """VmHWM: the most resident memory the process has had."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise BenchError(f"no VmHWM for process {pid}")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise BenchError(f"no VmRSS for process {pid}")


_METRIC = re.compile(r'^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_request_totals(text: str) -> Counter[tuple[str, str]]:
    """apiserver_request_total summed by (verb, resource[/subresource])."""
    totals: Counter[tuple[str, str]] = Counter()
    for line in text.splitlines():
        found = _METRIC.match(line)
        if not found:
            continue
        labels = dict(_LABEL.findall(found.group(1)))
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        totals[(labels.get("verb", ""), resource)] += int(float(found.group(2)))
    return totals


WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY", "CREATE", "UPDATE", "DELETECOLLECTION"})


class BenchCluster:
    """A real control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager) with
    gpuslice's CRD, RBAC and controller, and fake GPU nodes added and removed on demand."""

    def __init__(self, state_dir: Path, report: Callable[[str], None]) -> None:
        self.state_dir = state_dir
        self.report = report
        self.dev = DevCluster(ClusterSpec(state_dir, nodes=0, operator=False, pod_runner=False), report=report)
        self.kubernetes_version = ""
        self.kube: KubeClient | None = None
        self.controller: Component | None = None
        self.controller_kubeconfig: Path | None = None
        self.webhook_kubeconfig: Path | None = None
        self.webhook: Component | None = None
        self.webhook_port = free_port()
        self.webhook_metrics = free_port()
        self.agents: dict[str, Component] = {}
        self.ca_pem = b""

    @property
    def api(self) -> KubeClient:
        assert self.kube is not None, "the bench cluster is not started"
        return self.kube

    def pid(self, component: str) -> int:
        for c in self.dev.components:
            if c.name == component and c.pid:
                return c.pid
        raise BenchError(f"{component} is not running")

    async def start(self) -> None:
        found = await binaries_module.resolve(build_if_missing=False)  # make bench builds them first
        self.dev = DevCluster(self.dev.spec, binaries=found, report=self.report)
        await self.dev.start()
        self.kubernetes_version = self.dev.kubernetes_version
        self.kube = await KubeClient.from_kubeconfig(self.dev.kubeconfig)
        self.ca_pem = (self.dev.state.pki / "ca.crt").read_bytes()
        self.controller_kubeconfig, self.webhook_kubeconfig = await gpuslice_install.install(
            self.api, self.dev.state.root, self.dev.server, self.ca_pem, self.webhook_port)

    async def start_controller(self, *flags: str) -> Component:
        """``flags``: more of the controller's settings (the fragmentation figure's shorter timers)."""
        assert self.controller_kubeconfig is not None
        # The Lease a real install has (15 s, renewed within 10): the dev cluster's short one for fault
        # tests (4 s) runs out while a thousand agents load the apiserver, and the controller then
        # writes nothing.
        component = gpuslice_install.controller_component(
            self.controller_kubeconfig, self.dev.state.logs / "gpuslice-controller.log", free_port(), lease=(),
            extra_args=flags)
        await component.start()
        self.dev.components.append(component)
        await component.wait_healthy()
        self.controller = component
        return component

    async def start_webhook(self) -> Component:
        """The maxMemory webhook on loopback (its certificate comes from the controller)."""
        assert self.webhook_kubeconfig is not None
        component = gpuslice_install.webhook_component(
            self.webhook_kubeconfig, self.dev.state.logs / "gpuslice-webhook.log", self.webhook_port,
            self.webhook_metrics, extra_args=self.dev.webhook_client_flags())
        await component.start()
        self.dev.components.append(component)
        await component.wait_healthy()
        self.webhook = component
        return component

    async def stop_webhook(self) -> None:
        if self.webhook is not None:
            await self.webhook.stop()
            self.dev.components.remove(self.webhook)
            self.webhook = None

    async def stop_controller(self) -> None:
        if self.controller is not None:
            await self.controller.stop()
            self.dev.components.remove(self.controller)
            self.controller = None

    async def agent_kubeconfig(self, node: str) -> Path:
        return await retry(lambda: gpuslice_install.agent_kubeconfig(self.api, node, self.dev.state.root,
                                                                     self.dev.server, self.ca_pem))

    async def start_agent(self, node: str) -> Component:
        """One real `gpuslice agent` process for ``node``, with its node-bound identity."""
        component = gpuslice_install.agent_component(
            node, await self.agent_kubeconfig(node), self.dev.state.logs / f"gpuslice-agent-{node}.log", free_port(),
            self.dev.node_dir(node))
        await component.start()
        self.dev.components.append(component)
        await component.wait_healthy()
        self.agents[node] = component
        return component

    async def stop_agents(self) -> None:
        for node, component in list(self.agents.items()):
            await component.stop()
            self.dev.components.remove(component)
            del self.agents[node]

    def post_mortem(self) -> str:
        """After a failure: which processes exited (with their logs' last lines) and this process's
        open files against its limit, the two causes a lost connection has had at fleet scale."""
        import resource

        from gpuslice.devcluster.process import log_tail

        found = []
        try:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            found.append(f"bench process: {len(os.listdir('/proc/self/fd'))} open files (limit {soft})")
        except OSError as error:
            found.append(f"bench process: open files unknown ({error})")
        for c in self.dev.components:
            if c.process is not None and not c.running:
                found.append(f"{c.name} exited with {c.process.returncode}; its log ends:\n"
                             f"{log_tail(c.log_path, 10)}")
        return "\n".join(found)

    def failed(self, measured: dict[str, Any], error: BaseException) -> BenchPartial:
        """What a figure raises when it fails: what it measured, and the post-mortem taken now,
        before its clean-up stops the processes that may be the cause."""
        return BenchPartial(measured, error, self.post_mortem())

    async def reset(self) -> None:
        """After a failed figure, what it made goes (agents, pods, claims, namespaces, policies,
        nodes, slices, the whole-GPU class), so the next figure starts on an empty cluster
        rather than failing on what this one left."""
        await self.stop_agents()
        api = self.api
        namespaces = [n["metadata"]["name"] for n in await api.list(NAMESPACES)
                      if n["metadata"]["name"].startswith("bench-")]
        for namespace in namespaces:
            claims = claims_in(namespace)
            with contextlib.suppress(KubeError):
                await api.delete(pods_in(namespace), gracePeriodSeconds=0)
            with contextlib.suppress(KubeError):
                await api.delete(claims)
            for claim in await api.list(claims):
                with contextlib.suppress(KubeError):
                    await api.merge_patch(claim_path(namespace, claim["metadata"]["name"]),
                                          {"metadata": {"finalizers": None}})
            with contextlib.suppress(KubeError):
                await api.delete(namespace_path(namespace))
        with contextlib.suppress(KubeError):
            await api.delete(POLICIES)
        await self.delete_nodes([n["metadata"]["name"] for n in await api.list(NODES)])
        from gpuslice.bench.layouts import WHOLE_CLASS

        with contextlib.suppress(KubeError):
            await api.delete(device_class_path(WHOLE_CLASS))

        async def empty() -> bool:
            # A deleting policy waits until no slice publishes its devices; no agent removes them now.
            with contextlib.suppress(KubeError):
                await api.delete(SLICES)
            left = [n for n in await api.list(NAMESPACES) if n["metadata"]["name"] in namespaces]
            return not left and not await api.list(POLICIES)

        await wait_until(empty, 600, "what the failed figure made to be deleted", every=2.0)

    async def stop(self) -> None:
        if self.kube is not None:
            await self.kube.close()
            self.kube = None
        await self.dev.stop()

    async def create_nodes(self, names: Sequence[str], labels: dict[str, dict[str, str]] | None = None,
                           gpus: int = 8, concurrency: int = 16) -> dict[str, str]:
        """Fake H100 nodes; returns their UIDs."""
        uids: dict[str, str] = {}

        async def one(name: str) -> None:
            body = fake_gpu_node(name, "h100-80gb", gpus)
            body["metadata"]["labels"].update((labels or {}).get(name, {}))
            uids[name] = (await create(self.api, NODES, body))["metadata"]["uid"]

        await gather_limited((one(n) for n in names), concurrency)
        return uids

    async def delete_nodes(self, names: Iterable[str], concurrency: int = 16) -> None:
        async def one(name: str) -> None:
            with contextlib.suppress(KubeError):
                await self.api.delete(node_path(name))
        await gather_limited((one(n) for n in names), concurrency)

    async def request_totals(self) -> Counter[tuple[str, str]]:
        text = await self.api.request("GET", "/metrics", accept="text/plain")
        return parse_request_totals(text if isinstance(text, str) else str(text))

    async def our_events(self) -> int:
        """How many times gpuslice has posted an Event (each repeat counted): Events are written by
        everyone (kube-scheduler refreshes its event series every 6 minutes), so the apiserver's
        count of writes to them says nothing of ours."""
        events = (await list_all(self.api, EVENTS, None, 500))[0]
        return sum(int(e.get("count") or 1) for e in events
                   if str((e.get("source") or {}).get("component") or e.get("reportingComponent") or "")
                   .startswith("gpuslice"))

    async def our_slices(self) -> list[dict[str, Any]]:
        """gpuslice's slices, in pages: one list of a thousand nodes' slices is ~60 MB, more than
        this process (busy with the fleet's agents) reads within a request's timeout."""
        return (await list_all(self.api, SLICES, {"fieldSelector": f"spec.driver={DRIVER}"}, 100))[0]


T = TypeVar("T")
TRANSIENT = frozenset({429, 500, 502, 503, 504})


async def retry(call: Callable[[], Awaitable[T]], attempts: int = 8) -> T:
    """The bench's own set-up requests, retried when the apiserver says "not now" (429 once a
    thousand agents start at once, 5xx, timeouts), with jittered backoff."""
    for attempt in range(attempts):
        try:
            return await call()
        except KubeError as error:
            if error.status not in TRANSIENT or attempt == attempts - 1:
                raise
        except (aiohttp.ClientError, TimeoutError, OSError):
            if attempt == attempts - 1:
                raise
        await asyncio.sleep(Backoff(1.0, 15.0).after(attempt + 1))
    raise AssertionError("unreachable")


async def create(api: KubeClient, collection: str, body: dict[str, Any]) -> dict[str, Any]:
    """Create, retried (see ``retry``); an earlier attempt that the server did carry out is fine."""
    tried = False

    async def once() -> dict[str, Any]:
        nonlocal tried
        try:
            return await api.create(collection, body)
        except Conflict:
            if tried:
                return await api.get(f"{collection}/{body['metadata']['name']}")
            raise
        finally:
            tried = True

    return await retry(once)


async def gather_limited(coroutines: Iterable[Awaitable[Any]], limit: int) -> list[Any]:
    """Run awaitables with at most ``limit`` in flight (API calls the apiserver should not queue)."""
    semaphore = asyncio.Semaphore(limit)

    async def guarded(aw: Awaitable[Any]) -> Any:
        async with semaphore:
            return await aw

    return await asyncio.gather(*(guarded(c) for c in coroutines))


async def scheduler_profile(cluster: BenchCluster, seconds: int, out: Path) -> Path:
    """A CPU profile of kube-scheduler from its pprof endpoint (``--profiling``, on by default),
    fetched with the admin's client certificate (the scheduler delegates authorization to the
    apiserver)."""
    import base64
    import ssl

    import aiohttp
    import yaml

    scheduler = next(c for c in cluster.dev.components if c.name == "kube-scheduler")
    port = next(a.split("=", 1)[1] for a in scheduler.argv if a.startswith("--secure-port="))
    user = yaml.safe_load(cluster.dev.kubeconfig.read_text())["users"][0]["user"]
    pki = cluster.dev.state.pki
    cert, key = pki / "bench-admin.crt", pki / "bench-admin.key"
    cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
    key.write_bytes(base64.b64decode(user["client-key-data"]))
    key.chmod(0o600)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.load_cert_chain(cert, key)
    url = f"https://127.0.0.1:{port}/debug/pprof/profile?seconds={seconds}"
    async with aiohttp.ClientSession() as session, session.get(
            url, ssl=context, timeout=aiohttp.ClientTimeout(total=seconds + 60)) as response:
        if response.status != 200:
            raise BenchError(f"kube-scheduler's pprof answered {response.status}: {(await response.text())[:300]}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(await response.read())  # noqa: ASYNC240 (a local file, written once)
    return out


def pprof_top(profile: Path, lines: int = 25) -> list[str]:
    """``go tool pprof -top`` of a profile (needs Go; an empty list without it)."""
    import shutil
    import subprocess

    go = shutil.which("go")
    if go is None:
        return []
    done = subprocess.run([go, "tool", "pprof", "-top", "-cum", f"-nodecount={lines}", str(profile)],
                          capture_output=True, text=True, check=False)
    return [line.rstrip() for line in done.stdout.splitlines() if line.strip()]
