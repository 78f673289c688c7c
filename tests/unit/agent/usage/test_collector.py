"""The agent's usage passes over a claim several pods share, as a tenant would stretch it: pods each
within the claim but over it together, a pod that joins late, the choice of whom to evict kept while
the chosen pod stops, and an agent restarted mid-overuse picking the marks it left up again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuslice.agent.gpus.fake import FakeBackend
from gpuslice.agent.node_state.checkpoint import ClaimCheckpoint, PreparedDevice
from gpuslice.agent.usage.collector import UsageCollector, UsageSettings
from gpuslice.agent.usage.metrics import USE
from gpuslice.agent.usage.podresources import HeldDevice
from gpuslice.inventory.gpus import Gpu
from gpuslice.planning.node.gpu_use import GpuProcess, PodRef
from gpuslice.planning.overuse import MAX_MESSAGE

GI = 1024**3
NODE, NAMESPACE, CLAIM = "node-a", "team-a", "shared"
UIDS = {f"s{i}": f"0f3a7c4e-{i}{i}{i}{i}-4c2a-9a51-00000000000{i}" for i in range(4)}


class Node:
    """The kubelet, the GPU and the API server as one usage pass meets them."""

    def __init__(self, root: Path, gpu: Gpu) -> None:
        self.root, self.gpu = root, gpu
        self.pods: list[str] = []
        self.use: dict[str, float] = {}  # pod -> GiB
        self.claim: dict[str, Any] = {"status": {}}
        self.applied: list[dict[str, Any]] = []

    def runs(self, *pods: str) -> None:
        self.pods = list(pods)
        self.claim["status"]["reservedFor"] = [{"resource": "pods", "name": p, "uid": UIDS[p]} for p in pods]
        for pod in pods:
            proc = self.root / str(self.pid(pod))
            proc.mkdir(parents=True, exist_ok=True)
            (proc / "cgroup").write_text(f"0::/kubepods/besteffort/pod{UIDS[pod]}/{'c' * 64}\n")

    @staticmethod
    def pid(pod: str) -> int:
        return 100 + int(pod[1:])

    # The kubelet's PodResources API
    async def list(self, node: str) -> list[HeldDevice]:
        return [HeldDevice(PodRef(NAMESPACE, p), "work", NAMESPACE, CLAIM, "gpu-0-slice-0", None) for p in self.pods]

    async def close(self) -> None:
        pass

    # The GPU backend
    def processes(self, gpu: Gpu) -> list[GpuProcess]:
        return [GpuProcess(self.pid(p), gpu.uuid, int(u * GI)) for p, u in self.use.items() if p in self.pods]

    # The API server
    async def get(self, path: str) -> dict[str, Any]:
        return self.claim

    async def apply(self, path: str, body: dict[str, Any], field_manager: str) -> dict[str, Any]:
        self.applied.append(body)
        self.claim["status"]["devices"] = body["status"]["devices"]
        return body

    def checkpoints(self) -> list[ClaimCheckpoint]:
        return [ClaimCheckpoint(uid="c", namespace=NAMESPACE, name=CLAIM, phase="completed", devices=[
            PreparedDevice(request="gpu", pool=NODE, device="gpu-0-slice-0", mode="memory", gpu_uuid=self.gpu.uuid,
                           policy="p", allocated=10 * GI)])]

    def mark(self) -> dict[str, tuple[bool, str]]:
        """Each pod the claim's mark names: whether to evict it, and the agent's words."""
        [entry] = self.claim["status"]["devices"]
        return {p["name"]: (p["evict"], p["message"]) for p in entry["data"]["overusingPods"]}

    def condition(self) -> str:
        return str(self.claim["status"]["devices"][0]["conditions"][0]["status"])


def collector(node: Node) -> UsageCollector:
    return UsageCollector(NODE, node, node, [node.gpu], node, node.checkpoints, dict,  # type: ignore[arg-type]
                          host_proc=node.root, settings=UsageSettings(interval=1, tolerance=0.05, grace=2))


def fake_node(tmp_path: Path) -> Node:
    [gpu] = FakeBackend(NODE, [("h100-80gb", 1)], tmp_path / "gpus").discover()
    return Node(tmp_path / "proc", gpu)


async def test_pods_each_within_a_shared_claim_but_over_it_together_are_marked_and_the_largest_chosen(
    tmp_path: Path,
) -> None:
    node = fake_node(tmp_path)
    node.runs("s0", "s1", "s2")
    node.use = {"s0": 4, "s1": 4.5, "s2": 4}  # 12.5Gi of a 10Gi claim; each pod within it alone
    agent = collector(node)
    await agent.once(1.0)
    assert node.applied == [], "within the grace"
    await agent.once(3.0)
    assert node.condition() == "True"
    marked = node.mark()
    assert {p: going for p, (going, _) in marked.items()} == {"s0": False, "s1": True, "s2": False}
    assert "with the 2 other pods sharing its claims (team-a/shared) that is 12800Mi" in marked["s1"][1]
    assert "under onOveruse: Evict the largest users go until the rest fit: this pod is one of them;" in marked["s1"][1]
    assert "until the rest fit: not this pod, as things stand;" in marked["s0"][1]
    assert all(len(words) < MAX_MESSAGE for _, words in marked.values()), "never cut where the choice is said"
    assert {(pod, gpu) for pod, gpu in USE.snapshot.overusing} == {(f"team-a/s{i}", node.gpu.uuid) for i in range(3)}

    # s1 is being evicted: its processes still run, and now use less than s0's. Choosing again would take
    # s0 as well; the choice stands, so nothing changes.
    node.use = {"s0": 4, "s1": 3.9, "s2": 4}
    writes = len(node.applied)
    await agent.once(4.0)
    assert len(node.applied) == writes

    # A pod joins late: named at once (one overuse, no new grace), and the choice is made again around s1.
    node.runs("s0", "s1", "s2", "s3")
    node.use["s3"] = 3
    await agent.once(5.0)
    assert {p: going for p, (going, _) in node.mark().items()} == {"s0": True, "s1": True, "s2": False, "s3": False}

    # s0 and s1 gone: the other two fit; the claim's mark turns False.
    node.runs("s2", "s3")
    await agent.once(6.0)
    assert node.condition() == "False"
    assert "are back within their 10Gi" in node.claim["status"]["devices"][0]["conditions"][0]["message"]


async def test_a_restarted_agent_keeps_the_choice_its_predecessor_made(tmp_path: Path) -> None:
    node = fake_node(tmp_path)
    node.runs("s0", "s1", "s2")
    node.use = {"s0": 4, "s1": 4.5, "s2": 4}
    first = collector(node)
    await first.once(1.0)
    await first.once(3.0)
    assert node.mark()["s1"][0]

    node.use = {"s0": 4, "s1": 3.9, "s2": 4}  # s1 stopping
    second = collector(node)
    await second.once(10.0)
    await second.once(12.0)
    assert {p: going for p, (going, _) in node.mark().items()} == {"s0": False, "s1": True, "s2": False}


async def test_one_pod_over_its_own_claim_is_chosen_and_told_as_before(tmp_path: Path) -> None:
    node = fake_node(tmp_path)
    node.runs("s0")
    node.use = {"s0": 12}
    agent = collector(node)
    await agent.once(1.0)
    await agent.once(3.0)
    [(going, words)] = node.mark().values()
    assert going
    assert words.startswith(f"pod {NAMESPACE}/s0 (container work) uses 12Gi of GPU memory on GPU {node.gpu.uuid},"
                            " more than the 10Gi its claims (team-a/shared) were allocated there (policy p")
