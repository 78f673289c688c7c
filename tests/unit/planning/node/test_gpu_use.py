"""Each pod's GPU use against its allocation: attribution of processes through cgroups, idle pods,
shared claims (judged whole, as a tenant sharing one claim among many pods would try to stretch it),
unattributed use, overuse with its tolerance and grace, and whom onOveruse: Evict evicts."""

from __future__ import annotations

from gpuslice.planning.node.gpu_use import (
    ClaimUse,
    GpuProcess,
    Holding,
    OveruseTracker,
    PodRef,
    measure,
    over,
    parse_cgroup,
    tenant_totals,
    to_evict,
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
        use = measure(holdings, [GpuProcess(1, "G0", int(used * GI))], {1: A})
        started, ended = tracker.update(use.claims, now)
        return [str(p.pod) for u in started for p in u.pods], [str(p.pod) for u in ended for p in u.pods]

    assert at(10.4, 0) == ([], []), "within the 5% tolerance"
    assert at(12, 10) == ([], []), "over, but not for 30 s yet"
    assert at(12, 39) == ([], [])
    assert at(12, 40) == (["team-a/a"], [])
    [claim] = measure(holdings, [], {}).claims
    assert tracker.overusing(claim)
    assert at(13, 80) == ([], []), "reported once"
    assert at(9, 90) == ([], ["team-a/a"])
    assert at(12, 100) == ([], []), "the grace starts again"
    assert at(9, 105) == ([], []), "never reported: no end to report"


S0, S1, S2 = PodRef("team-a", "s0"), PodRef("team-a", "s1"), PodRef("team-a", "s2")


def shared(pods: list[PodRef], allocated: int = 10**10, claim: str = "team-a/shared") -> list[Holding]:
    return [holding(p, "G0", allocated, claim=claim) for p in pods]


def processes(*used: float) -> tuple[list[GpuProcess], dict[int, PodRef]]:
    pods = [S0, S1, S2, A, B]
    return ([GpuProcess(i + 1, "G0", int(u * GI)) for i, u in enumerate(used)],
            {i + 1: pods[i] for i in range(len(used))})


def test_pods_sharing_one_claim_are_judged_together_against_what_it_holds_once() -> None:
    """The review's S1: three pods on one 10G claim, 9Gi each: 27Gi of a 10G claim is over, though no
    pod alone is; and each pod's allocation is its share, so the per-pod series add up to the claim."""
    use = measure(shared([S0, S1, S2]), *processes(9, 9, 9))
    [claim] = use.claims
    assert (claim.allocated, claim.used, claim.claims) == (10**10, 27 * GI, ("team-a/shared",))
    assert [str(p.pod) for p in claim.pods] == ["team-a/s0", "team-a/s1", "team-a/s2"]
    assert over(claim, 0.05)
    assert [p.allocated for p in use.pods] == [3333333334, 3333333333, 3333333333]
    assert sum(p.allocated for p in use.pods) == 10**10
    assert tenant_totals(use.pods) == {("p", "team-a"): (27 * GI, 10**10)}, "the claim counted once"


def test_many_pods_each_just_under_the_claim_are_over_together() -> None:
    pods = [PodRef("team-a", f"w{i}") for i in range(12)]
    [claim] = measure(shared(pods), [GpuProcess(i, "G0", int(9.3 * GI)) for i in range(12)],
                      {i: p for i, p in enumerate(pods)}).claims
    assert all(p.used < 10**10 for p in claim.pods), "each alone within the claim"
    assert over(claim, 0.05)
    assert len(to_evict(claim, 0.05)) == 11, "all but one must go for the rest to fit"


def test_a_pod_holding_a_shared_claim_and_one_of_its_own_binds_them() -> None:
    """A holds claim x and shares y with B: A's bytes cannot be split between x and y, so x, y, A and B
    are one unit, allocated x + y; C's claim on the same GPU stays its own."""
    holdings = [holding(A, "G0", 10 * GI, claim="team-a/x"), holding(A, "G0", 10 * GI, claim="team-a/y", device="e"),
                holding(B, "G0", 10 * GI, claim="team-a/y", device="e"), holding(C, "G0", 10 * GI, device="f")]
    use = measure(holdings, [GpuProcess(1, "G0", 15 * GI), GpuProcess(2, "G0", 6 * GI)], {1: A, 2: B})
    joint, alone = use.claims
    assert (joint.claims, joint.allocated, joint.used) == (("team-a/x", "team-a/y"), 20 * GI, 21 * GI)
    assert [p.pod for p in joint.pods] == [A, B]
    assert over(joint, 0.0)
    assert (alone.claims, [p.pod for p in alone.pods]) == (("team-b/c-gpu",), [C])
    assert {p.pod: p.allocated for p in use.pods} == {A: 15 * GI, B: 5 * GI, C: 10 * GI}


def test_shares_of_one_shared_device_are_separate_claims() -> None:
    """Shared mode: many claims on one device, each with its own share and consumed capacity."""
    holdings = [Holding(A, "main", "team-a/one", "d", "share-1", "G0", "p", 4 * GI),
                Holding(B, "main", "team-a/two", "d", "share-2", "G0", "p", 4 * GI)]
    one, two = measure(holdings, [GpuProcess(1, "G0", 6 * GI)], {1: A}).claims
    assert (one.claims, one.used, over(one, 0.05)) == (("team-a/one",), 6 * GI, True)
    assert (two.claims, two.used, over(two, 0.05)) == (("team-a/two",), 0, False)


def test_evict_takes_the_largest_users_until_the_rest_fit() -> None:
    claim = measure(shared([S0, S1, S2]), *processes(9, 2, 4)).claims[0]
    assert to_evict(claim, 0.05) == (S0,), "9 of 15Gi: the 6Gi left fit 10G"
    claim = measure(shared([S0, S1, S2]), *processes(9, 9, 9)).claims[0]
    assert to_evict(claim, 0.05) == (S0, S1), "equal users go by name; the last 9Gi fits"
    claim = measure(shared([S0, S1, S2], 10 * GI), *processes(4, 4, 3)).claims[0]
    assert to_evict(claim, 0.05) == (S0,), "11Gi of 10Gi is over at 5%; 7Gi left is not"
    claim = measure(shared([S0, S1, S2], 10 * GI), *processes(4, 3.5, 3)).claims[0]
    assert to_evict(claim, 0.05) == (), "10.5Gi of 10Gi is within 5%: nobody"
    claim = measure(shared([S0, S1]), *processes(30, 0)).claims[0]
    assert to_evict(claim, 0.05) == (S0,), "a pod using nothing frees nothing: never chosen"


def test_a_choice_to_evict_is_kept_while_its_pod_is_there() -> None:
    """An evicted pod's processes use the GPU until it has stopped; meanwhile it may no longer be the
    largest user. Choosing again from scratch would evict a second pod for the same overuse."""
    claim = measure(shared([S0, S1, S2], 10 * GI), *processes(4, 4.5, 4)).claims[0]
    assert to_evict(claim, 0.05) == (S1,)
    assert to_evict(claim, 0.05, chosen={S0}) == (S0,), "S1 is not chosen: the rest fit once S0 is gone"
    claim = measure(shared([S0, S1, S2], 10 * GI), *processes(1, 6, 6)).claims[0]
    assert to_evict(claim, 0.05, chosen={S0}) == (S0, S1), "S0 going is not enough: the largest of the rest too"


def test_a_pod_joining_an_overused_claim_late_keeps_its_overuse_and_its_end_is_the_claims() -> None:
    tracker = OveruseTracker(tolerance=0.05, grace=30)

    def at(pods: list[PodRef], used: tuple[float, ...], now: float) -> tuple[list[ClaimUse], list[ClaimUse]]:
        return tracker.update(measure(shared(pods), *processes(*used)).claims, now)

    assert at([S0, S1], (6, 6), 0) == ([], [])
    [started], _ = at([S0, S1], (6, 6), 30)
    assert [p.pod for p in started.pods] == [S0, S1]
    assert at([S0, S1, S2], (6, 6, 1), 40) == ([], []), "one overuse: a late joiner starts no new grace"
    [claim] = measure(shared([S0, S1, S2]), *processes(6, 6, 1)).claims
    assert tracker.overusing(claim)
    _, [ended] = at([S1, S2], (6, 1), 50)
    assert [p.pod for p in ended.pods] == [S1, S2], "the evicted pod gone, the rest are within"
    assert not tracker.over(claim)


def test_a_claim_that_binds_another_keeps_both_overuse_states() -> None:
    tracker = OveruseTracker(tolerance=0.0, grace=10)
    x = [holding(A, "G0", 10 * GI, claim="team-a/x")]
    both = [*x, holding(B, "G0", 10 * GI, claim="team-a/x"), holding(B, "G0", 10 * GI, claim="team-a/y", device="e")]
    tracker.update(measure(x, [GpuProcess(1, "G0", 12 * GI)], {1: A}).claims, 0)
    started, _ = tracker.update(measure(both, [GpuProcess(1, "G0", 21 * GI)], {1: A}).claims, 10)
    assert [u.claims for u in started] == [("team-a/x", "team-a/y")], "x's grace began at 0: reported at 10"
