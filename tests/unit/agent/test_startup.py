"""The agent's start: its settings from flags and variables, and its check of the API server."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner

from gpuslice.agent.publisher import sort_policies
from gpuslice.agent.settings import AgentSettings
from gpuslice.agent.startup import AgentStopped, check_cluster, until_answered
from gpuslice.cli import main
from gpuslice.dra.support import NEEDED_RESOURCES
from gpuslice.kube.client import Forbidden, KubeClient, NotFound, NotReady, ServerError
from tests.builders import policy


def test_every_flag_is_a_variable_and_node_name_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[AgentSettings] = []

    async def run_agent(settings: AgentSettings) -> None:
        seen.append(settings)

    monkeypatch.setattr("gpuslice.agent.run.run_agent", run_agent)
    runner = CliRunner()
    result = runner.invoke(main, ["agent"], env={"NODE_NAME": "n1", "GPUSLICE_RESYNC": "5",
                                                 "GPUSLICE_LOG_LEVEL": "debug",
                                                 "GPUSLICE_NVIDIA_CDI_DIR": "/etc/cdi:/run/cdi"})
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["agent", "--node", "n2", "--resync", "7", "--backend", "fake"],
                           env={"NODE_NAME": "n1", "GPUSLICE_RESYNC": "5"})
    assert result.exit_code == 0, result.output
    first, second = seen
    assert (first.node, first.resync, first.log_level) == ("n1", 5.0, "debug")
    assert first.nvidia_cdi_dir == (Path("/etc/cdi"), Path("/run/cdi"))
    assert (second.node, second.resync, second.backend) == ("n2", 7.0, "fake"), "a flag wins over its variable"
    assert first.plugin.registrar_dir == Path("/var/lib/kubelet/plugins_registry")
    assert first.health.interval == 2.0


@pytest.mark.parametrize(("args", "words"), [
    ([], "Missing option '--node'"),
    (["--node", "n1", "--fake-gpus", "h100-80gb:1"], "Error: --fake-gpus is for --backend fake"),
    (["--node", "n1", "--resync", "0"], "--resync: Input should be greater than 0"),
    (["--node", "n1", "--log-level", "loud"], "Invalid value for '--log-level'"),
    (["--node", "n1/../x"], "'n1/../x' is not a Node's name"),
    (["--node", "n1", "--metrics-port", "0"], "--metrics-port: Input should be greater than or equal to 1"),
    (["--node", "n1", "--debounce", "inf"], "--debounce: Input should be a finite number"),
])
def test_bad_settings_are_refused_naming_the_flag(args: list[str], words: str) -> None:
    result = CliRunner().invoke(main, ["agent", *args], env={"NODE_NAME": ""} if not args else {})
    assert result.exit_code == 2
    assert words in result.output, result.output


class Server:
    """/version, discovery, the Node and the dry-run slices, as a server with ``drops`` gates off."""

    def __init__(self, minor: str = "37", drops: tuple[str, ...] = (), failures: list[Exception] | None = None,
                 refuse: Exception | None = None) -> None:
        self.minor, self.drops, self.failures, self.refuse = minor, drops, failures or [], refuse
        self.requests = 0

    async def get(self, path: str) -> dict[str, Any]:
        self.requests += 1
        if self.failures:
            raise self.failures.pop(0)
        if self.refuse is not None:
            raise self.refuse
        return {
            "/version": {"major": "1", "minor": self.minor, "gitVersion": f"v1.{self.minor}.2"},
            "/apis": {"groups": [{"name": "resource.k8s.io", "versions": [{"version": "v1"}]}]},
            "/apis/resource.k8s.io/v1": {"resources": [{"name": r} for r in NEEDED_RESOURCES]},
            "/api/v1/nodes/n1": {"metadata": {"name": "n1", "uid": "u1"}},
        }[path]

    async def create(self, path: str, body: dict[str, Any], **query: Any) -> dict[str, Any]:
        assert query == {"dryRun": "All"}, "the probe never stores anything"
        assert body["spec"]["nodeName"] == "n1"
        assert body["metadata"]["name"].endswith("-99")
        returned = copy.deepcopy(body)
        for device in returned["spec"].get("devices", []):
            for gate, field in (("partitionable", "consumesCounters"), ("taints", "taints"),
                                ("consumable", "allowMultipleAllocations")):
                if gate in self.drops:
                    device.pop(field, None)
        return returned


async def test_a_server_that_serves_everything_passes() -> None:
    verdict = await check_cluster(cast(KubeClient, Server()), "n1", asyncio.Event())
    assert verdict is not None
    assert verdict.ok
    assert verdict.unsupported_modes() == {}


async def test_a_server_that_cannot_answer_yet_is_asked_again() -> None:
    server = Server(failures=[ServerError(503, "ServiceUnavailable", "etcd", None),
                              NotReady(403, "Forbidden", "not yet ready to handle request", None),
                              NotFound(404, "NotFound", 'nodes "n1" not found', None)])
    verdict = await check_cluster(cast(KubeClient, server), "n1", asyncio.Event(), max_backoff=0.01)
    assert verdict is not None
    assert verdict.ok
    assert server.requests > 3


async def test_a_stopped_agent_stops_asking() -> None:
    stop = asyncio.Event()
    stop.set()
    assert await check_cluster(cast(KubeClient, Server(failures=[ServerError(503, "x", "y", None)])), "n1",
                               stop) is None


@pytest.mark.parametrize(("server", "words"), [
    (Server(minor="35"), "Kubernetes v1.35.2 is too old for gpuslice"),
    (Server(drops=("taints",)), "turn on the feature gate DRADeviceTaints"),
    (Server(refuse=Forbidden(403, "Forbidden", 'nodes "n1" is forbidden: User "x" cannot get', None)),
     "checking what the API server serves: the API server refused"),
])
async def test_a_server_that_cannot_serve_gpuslice_stops_the_agent(server: Server, words: str) -> None:
    with pytest.raises(AgentStopped, match=words):
        await check_cluster(cast(KubeClient, server), "n1", asyncio.Event())


async def test_modes_a_server_drops_the_fields_of_are_left_out() -> None:
    verdict = await check_cluster(cast(KubeClient, Server(drops=("consumable",))), "n1", asyncio.Event())
    assert verdict is not None
    assert verdict.ok
    modes = verdict.unsupported_modes()
    assert set(modes) == {"shared"}
    assert "DRAConsumableCapacity" in modes["shared"]
    judged: dict[str, Any] = {"generation": 1, "tenants": ["t"], "judged": True}
    policies = sort_policies([policy("mem", {"mode": "memory", "sliceSize": "10Gi"}, None, **judged),
                              policy("sh", {"mode": "shared", "sliceSize": "10Gi"}, None, **judged),
                              policy("mig", {"mode": "mig", "mig": {"profiles": ["1g.10gb"]}}, None, **judged)], modes)
    assert [p.name for p in policies.plannable] == ["mem", "mig"]
    assert "DRAConsumableCapacity" in policies.frozen["sh"]


@pytest.mark.looptime
@pytest.mark.asyncio(loop_scope="function")  # its own loop: a task another test left on the shared one keeps fake time from jumping
async def test_a_stop_ends_a_request_that_hangs() -> None:
    """SIGTERM must not wait for an API server that never answers (the shutdown grace is 10 s)."""
    stop = asyncio.Event()

    async def hangs() -> None:
        await asyncio.sleep(3600)

    asyncio.get_running_loop().call_later(0.1, stop.set)
    async with asyncio.timeout(2):
        assert await until_answered(hangs, stop, "n1", "asking") is None


async def test_cancelled_from_outside_the_request_goes_too() -> None:
    started, ended = asyncio.Event(), asyncio.Event()

    async def hangs() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            ended.set()

    task = asyncio.create_task(until_answered(hangs, asyncio.Event(), "n1", "asking"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended.is_set(), "no request left behind, to fail later unretrieved"


def test_retries_are_spread_so_a_fleet_does_not_ask_in_step() -> None:
    from gpuslice.backoff import spread

    waits = {round(spread(8.0), 3) for _ in range(50)}
    assert len(waits) > 10
    assert all(4.0 <= w <= 12.0 for w in waits)


@pytest.mark.looptime  # checks a resync apart, on fake loop time
@pytest.mark.asyncio(loop_scope="function")  # its own loop: a task another test left on the shared one keeps fake time from jumping
async def test_a_node_whose_containers_cannot_get_its_gpus_publishes_nothing_until_they_can() -> None:
    """No NVIDIA toolkit spec with the driver's libraries: the agent says so at start (/readyz, a
    Node Event) and waits before publishing, rather than failing every prepare."""
    from gpuslice.agent.run import _Agent

    class Backend:
        def __init__(self) -> None:
            self.answers = [["no NVIDIA Container Toolkit CDI spec ..."], ["still none"], []]

        def container_problems(self) -> list[str]:
            return self.answers.pop(0)

    events: list[tuple[str, dict[str, Any]]] = []

    class Kube:
        async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            events.append((path, body))
            return body

    agent = _Agent(AgentSettings(node="n1", backend="fake", fake_gpus="l4:1"))  # checks every 60 s
    waiting = asyncio.ensure_future(agent.containers_servable(cast(KubeClient, Kube()), cast(Any, Backend())))
    await asyncio.sleep(30)
    ready, why = agent.ready()
    assert not ready
    assert why.startswith("containers cannot be given this node's GPUs, nothing is published: no NVIDIA")
    assert await asyncio.wait_for(waiting, 120) is True
    [(path, event)] = events  # said once, not at every check
    assert path == "/api/v1/namespaces/default/events"
    assert (event["reason"], event["involvedObject"]["kind"]) == ("GpuContainerSetupMissing", "Node")
