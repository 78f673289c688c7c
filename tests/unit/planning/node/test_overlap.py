"""The overlap guard at prepare (planning.node.overlap): partitions that overlap on a GPU's counters,
whatever their names, and what admin access and other claims' own devices are left out of."""

from __future__ import annotations

from gpuslice.planning.devices import CounterSet, Device
from gpuslice.planning.node.overlap import Holding, overlaps

MIG_SET = CounterSet("gpu-aaaa-mig", tuple(sorted((f"memory-slice-{i}", "1") for i in range(8))))


def mig(name: str, start: int, size: int) -> Device:
    return Device(name=name, policy="p", mode="mig", kind=f"{size}g", gpu_uuid="GPU-aaaa", gpu_index=0,
                  product_name="H100", pci_bus_id="", memory=size * 10**10, placement=(start, size),
                  counter_set=MIG_SET.name, counters=tuple(sorted((f"memory-slice-{i}", "1")
                                                                  for i in range(start, start + size))))


DEVICES = {d.name: d for d in (mig("a", 0, 2), mig("b", 1, 1), mig("c", 2, 2))}


def test_overlapping_mig_placements_of_other_names_are_refused() -> None:
    problems = overlaps([Holding("t/new", "u2", "b")], [Holding("t/old", "u1", "a")], DEVICES, [MIG_SET])
    assert problems == ["the devices prepared on counter set gpu-aaaa-mig (a, b) would take more than it has of"
                        " memory-slice-1"]


def test_disjoint_placements_admin_access_and_the_claim_itself_pass() -> None:
    held = [Holding("t/old", "u1", "a"), Holding("ops/watch", "u3", "c", admin=True), Holding("t/new", "u2", "b")]
    assert overlaps([Holding("t/new", "u2", "c")], held[:2], DEVICES, [MIG_SET]) == []
    assert overlaps([Holding("ops/watch2", "u4", "a", admin=True)], held, DEVICES, [MIG_SET]) == []
    assert overlaps([Holding("t/new", "u2", "c")], held, DEVICES, [MIG_SET]) == []  # its own earlier record


def test_a_held_device_no_longer_published_is_judged_by_name() -> None:
    assert overlaps([Holding("t/new", "u2", "gone")], [Holding("t/old", "u1", "gone")], DEVICES, [MIG_SET]) == [
        "device gone is already prepared for claim t/old (uid u1)"]
