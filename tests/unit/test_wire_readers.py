"""A slice's devices and counter sets, and a policy body's tenants, are read only by their readers
(issue 37's check: ``get("tenants")`` and ``get("devices")`` outside the readers, 0). Each reader
decides once what a missing, null or malformed field means; a hand-read elsewhere would decide again,
and differently (a crash on a policy that does not parse, "None" as a namespace)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "gpuslice"
KEYS = {"tenants", "devices", "sharedCounters"}
# The modules that read these keys: the readers, each of its own shape.
READERS = {
    "dra/slice_wire.py",  # a ResourceSlice's spec.devices and spec.sharedCounters
    "dra/policy_wire.py",  # a GpuSlicePolicy's spec.tenants, valid or not
    "dra/wire.py",  # a claim's spec.devices.requests and status.devices
    "dra/cdi.py",  # a CDI spec's devices
}
# Reads of another shape that happens to use one of the keys, and how many each module has.
OTHER_SHAPES = {
    "agent/published.py": 1,  # the agent's own record of what it last published, written beside it
    "bench/report.py": 1,  # a row of the scheduler figure: its count of devices
}


def hand_reads(source: str) -> list[int]:
    """The lines that read one of KEYS: ``x.get("devices")``, or ``x["devices"]`` other than as a target."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            key = node.args[0] if node.args else None
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        else:
            continue
        if isinstance(key, ast.Constant) and key.value in KEYS:
            found.append(node.lineno)
    return sorted(found)


def test_the_guard_finds_gets_and_loads_but_not_writes() -> None:
    source = ('a = spec.get("devices") or []\nb = body["spec"]["tenants"]\nc = spec.get(\'sharedCounters\')\n'
              'spec["devices"] = []\nd = {"devices": []}\ne = spec.get("pool")\nf = row[\'devices\']\n')
    assert hand_reads(source) == [1, 2, 3, 7]


def test_slices_and_policy_bodies_are_read_only_by_their_readers() -> None:
    counts = Counter({str(p.relative_to(PACKAGE)): len(hand_reads(p.read_text())) for p in PACKAGE.rglob("*.py")})
    unexpected = {path: n for path, n in counts.items() if n and path not in READERS and OTHER_SHAPES.get(path) != n}
    assert not unexpected, ("read a slice's devices or counter sets with gpuslice.dra.slice_wire, a policy's tenants"
                            " with gpuslice.dra.policy_wire (or a CDI spec's devices with dra.cdi.cdi_devices);"
                            f" hand-reads by module: {unexpected}")
    assert all(counts[path] for path in READERS | set(OTHER_SHAPES)), "a module listed here reads none now: drop it"
