"""Each pod's GPU use against its allocation: attribution of processes through cgroups, idle pods,
shared claims, unattributed use, and overuse with its tolerance and grace."""

from __future__ import annotations

from gpuslice.planning.node.gpu_use import (
    GpuProcess,
    Holding,
    OveruseTracker,
    PodRef,
    measure,
    parse_cgroup,
    tenant_totals,
)

GI = 1024**3
UID = "1b2c3d4e-5f60-4172-8394-a5b6c7d8e9f0"
CID = "a" * 64
A, B, C = PodRef("team-a", "a"), PodRef("team-a", "b"), PodRef("team-b", "c")


def test_cgroup_paths_of_both_drivers_and_kind_name_the_pod() -> None:
    systemd = ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
               f"{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n")
    cgroupfs = f"12:memory:/kubepods/besteffort/pod{UID}/{CID}\n11:cpu:/kubepods/besteffort/pod{UID}/{CID}\n"
    kind = f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
    for text in (systemd, cgroupfs, kind):
        found = parse_cgroup(text)
        assert found is not None
        assert (found.pod_uid, found.container_id) == (UID, CID)
    assert parse_cgroup("0::/system.slice/containerd.service\n") is None, "a host process is no pod's"
    assert parse_cgroup("0::/\n") is None


def holding(pod: PodRef, gpu: str, allocated: int, claim: str = "", container: str = "main", device: str = "d",
            policy: str = "p") -> Holding:
    return Holding(pod, container, claim or f"{pod.namespace}/{pod.name}-gpu", device, None, gpu, policy, allocated)


def test_processes_are_charged_to_their_pod_on_their_gpu_and_idle_pods_show_zero() -> None:
    holdings = [holding(A, "G0", 10 * GI), holding(B, "G0", 10 * GI, device="e"), holding(C, "G1", 20 * GI)]
    processes = [GpuProcess(1, "G0", 4 * GI, 0.3), GpuProcess(2, "G0", 12 * GI, 0.5), GpuProcess(3, "G0", GI),
                 GpuProcess(4, "G1", GI), GpuProcess(5, "G0", 2 * GI)]
    use = measure(holdings, processes, {1: A, 2: A, 3: B, 4: A, 5: C})
    by = {(u.pod, u.gpu): u for u in use.pods}
    assert (by[A, "G0"].used, by[A, "G0"].sm, by[A, "G0"].allocated) == (16 * GI, 0.8, 10 * GI)
    assert by[A, "G0"].container == "main"
    assert by[B, "G0"].used == GI
    assert by[C, "G1"].used == 0, "an idle pod is measured too (its slice allocated, nothing used)"
    assert use.unattributed == {"G1": GI, "G0": 2 * GI}, "A has nothing on G1; C nothing on G0"
    assert tenant_totals(use.pods) == {("p", "team-a"): (17 * GI, 20 * GI), ("p", "team-b"): (0, 20 * GI)}


def test_a_claim_shared_by_two_containers_counts_once_and_names_no_container() -> None:
    shared = [holding(A, "G0", 10 * GI, container="x"), holding(A, "G0", 10 * GI, container="y")]
    [use] = measure(shared, [GpuProcess(1, "G0", GI)], {1: A}).pods
    assert use.allocated == 10 * GI
    assert (use.containers, use.container) == (("x", "y"), "")


def test_overuse_needs_the_tolerance_passed_for_the_grace() -> None:
    tracker = OveruseTracker(tolerance=0.05, grace=30)
    holdings = [holding(A, "G0", 10 * GI)]

    def at(used: float, now: float) -> tuple[list[str], list[str]]:
        started, ended = tracker.update(measure(holdings, [GpuProcess(1, "G0", int(used * GI))], {1: A}).pods, now)
        return [str(u.pod) for u in started], [str(u.pod) for u in ended]

    assert at(10.4, 0) == ([], []), "within the 5% tolerance"
    assert at(12, 10) == ([], []), "over, but not for 30 s yet"
    assert at(12, 39) == ([], [])
    assert at(12, 40) == (["team-a/a"], [])
    assert tracker.overusing(A, "G0")
    assert at(13, 80) == ([], []), "reported once"
    assert at(9, 90) == ([], ["team-a/a"])
    assert at(12, 100) == ([], []), "the grace starts again"
    assert at(9, 105) == ([], []), "never reported: no end to report"
