"""No control character read from the cluster reaches a person's terminal or makes the map's SVG
unreadable: a tenant's escape sequences in every string of every view's model, as a hostile Event, a
pod's annotation, a condition's message or a node's label would carry them."""

from __future__ import annotations

import dataclasses
import datetime
import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

import pytest
from rich.console import Console, RenderableType
from rich.table import Table

from gpuslice.inspect.render.defrag_view import defrag_view
from gpuslice.inspect.render.image import html, svg
from gpuslice.inspect.render.printable import printable, printable_model
from gpuslice.inspect.render.terminal import plan_view, status_view, why_view
from gpuslice.planning.defrag.facts import Blocker
from gpuslice.planning.defrag.model import GpuOption, Move, Plan
from gpuslice.planning.reads.pending import Diagnosis, Finding, Request
from gpuslice.planning.reads.policy_change import ChangePlan, HeldDevice, NodeChange, PolicyCount
from gpuslice.planning.reads.published import Holder
from gpuslice.planning.reads.status_report import Snapshot, StatusReport, status_report
from gpuslice.planning.reads.topology import ClaimAlignment, NodeTopology
from gpuslice.planning.validation import Problem
from tests.unit.planning.cluster_state import claim, devices_of, node_body, policy_body, published, taint

ESC = "\x1b"
PAYLOAD = (f"{ESC}]0;gpuslice: all clear{ESC}\\"  # window title
           f"{ESC}]52;c;a3ViZWN0bCBkZWxldGUgbnMgLS1hbGwK\x07"  # OSC 52: clipboard := 'kubectl delete ns --all'
           f"{ESC}[2J{ESC}[H\r\x9b31m\x7f\u202e[link=https://evil.example]x[/link]"
           "\n  Nothing gpuslice knows of blocks it."
           f"{ESC}[8m")
# What must never reach the output: C0 but newline and tab, DEL, C1, bidirectional overrides.
FORBIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_printable_escapes_every_control_but_newline_and_tab() -> None:
    assert printable(f"a{ESC}[2Jb") == "a\\x1b[2Jb"
    assert printable("line\n\tindented") == "line\n\tindented"
    assert printable("\r\x7f\x9b\x85\u202e\u2066\ud800") == "\\x0d\\x7f\\x9b\\x85\\u202e\\u2066\\ud800"
    assert printable("team-a/web-0 · 10Gi · ünïcode 日本") == "team-a/web-0 · 10Gi · ünïcode 日本"
    assert not FORBIDDEN.search(printable(PAYLOAD))


def poisoned(value: Any, payload: str = PAYLOAD) -> Any:
    """``value`` with ``payload`` added to every string in it: every field a tenant might have written."""
    if isinstance(value, str):
        return value + payload
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: poisoned(getattr(value, f.name), payload)
                                             for f in dataclasses.fields(value) if f.init})
    if isinstance(value, Mapping):
        return {k: poisoned(v, payload) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(poisoned(v, payload) for v in value)
    return value


def test_printable_model_cleans_every_string_and_keeps_the_original() -> None:
    dirty = poisoned(Diagnosis("team-a/job", "Pending", (Request("c", "gpu", "p.gpuslice.dev"),),
                               (Finding("AdmissionDenied", "m"),)))
    clean = printable_model(dirty)
    assert not FORBIDDEN.search(repr(clean))
    assert ESC in dirty.findings[0].message, "the model read (-o json) is left as it was"
    assert clean.findings[0].message.startswith("m\\x1b]0;gpuslice: all clear")


def report() -> StatusReport:
    policy = policy_body("inference", {"mode": "memory", "sliceSize": "10G"}, tenants=[{"namespace": "team-a"}])
    slices = published("n1", "h100-80gb", 2, [policy])
    device, other = (d["name"] for d in devices_of(slices)[:2])
    taint(slices, {other}, "gpuslice.dev/unhealthy", "XID-48")
    held = claim("team-a", "c", [("n1", device)], pods=("web-0",))
    result = status_report(Snapshot([policy], slices, [held], [node_body("n1", "h100-80gb", 2)], notes=["a note"]))
    [node] = result.map.nodes
    gpu = node.gpus[0]
    segments = tuple(dataclasses.replace(s, holder=Holder("team-a", "c", ("web-0",), overuse="pod team-a/web-0 uses"),
                                         reasons=("tainted",)) if s.holder is not None else s for s in gpu.segments)
    gpu = dataclasses.replace(gpu, segments=segments, freeing="being freed")
    # What a node publishes of where its GPUs sit, and a claim on two of them (the topology tables).
    topology = (NodeTopology("n1", nvlink=(("nvl-0", (0, 1)),), numa=((0, (0,)),), pcie=(("pci0000:15", (0, 1)),),
                             unknown_numa=(1,)),)
    aligned = (ClaimAlignment("team-a", "c2", "n1", (0, 1), "nvlink", "nvlink-numa"),)
    return dataclasses.replace(result, topology=topology, aligned=aligned, map=dataclasses.replace(result.map, nodes=(
        dataclasses.replace(node, gpus=(gpu, *node.gpus[1:])),)))


def diagnosis() -> Diagnosis:
    return Diagnosis("team-a/job", "Pending", (Request("job-gpu", "gpu", "inference.gpuslice.dev", memory=10**10),),
                     (Finding("AdmissionDenied", "Event: FailedScheduling: no room"),
                      Finding("NeighbourOverusing", "pod team-a/web-0 uses 12Gi", blocking=False)))


def change() -> ChangePlan:
    holder = Holder("team-a", "c", ("web-0",))
    return ChangePlan("inference", False, (Problem("Invalid", "spec.slicing: bad"),), (
        NodeChange("n1", added=("d1",), waiting=("d2",), drain_change=("d3",), drain_remove=("d4",),
                   held=(HeldDevice("d5", False, (holder,)),), unchanged=2, notes=("a note",), unknown_gpus=1),),
        (PolicyCount("inference", 4, 8),))


def plans() -> list[Plan]:
    move = Move("team-b/web-1", "uid-1", "ReplicaSet web-5d8f", ("d1",), 10**10, "n1 GPU 1")
    blocked = GpuOption("n1", 1, "GPU-1", blockers=(Blocker("Bare", "team-b/solo", "team-b/solo is a bare pod"),))
    return [Plan("team-a/big", "uid-2", "big-gpu", "uid-3", "inference", "whole", "2026-12-01T10:00:00Z", "Ready",
                 "moving 1 pod frees n1 GPU 0", GpuOption("n1", 0, "GPU-0", "d0", (move,)), (blocked,))]


def terminal(renderable: RenderableType) -> str:
    """What rich writes for it, with no style of its own: any escape in it came from the model."""
    out = io.StringIO()
    Console(file=out, width=200, color_system=None, force_terminal=False, emoji=False).print(renderable)
    return out.getvalue()


NOW = datetime.datetime(2026, 12, 1, 11, tzinfo=datetime.UTC)


@pytest.mark.parametrize("view", ["status", "why", "plan", "defrag"])
def test_no_view_prints_a_control_character_of_its_model(view: str) -> None:
    renderable = {"status": lambda: status_view(poisoned(report()), 200),
                  "why": lambda: why_view(poisoned(diagnosis())),
                  "plan": lambda: plan_view(poisoned(change())),
                  "defrag": lambda: defrag_view(poisoned(plans()), NOW)}[view]()
    text = terminal(renderable)
    assert "gpuslice: all clear" in text, "the words are shown, their controls escaped"
    assert not FORBIDDEN.search(text), [line for line in text.splitlines() if FORBIDDEN.search(line)]
    assert "\\x1b]52;c;" in text
    assert "[link=https://evil.example]" in text, "markup in a cluster's string is shown, not obeyed"


def test_every_table_cell_is_text_so_no_cluster_string_is_read_as_markup(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich reads a ``str`` cell as markup: ``[link=...]`` a node publishes as a device attribute would
    become a hyperlink (OSC 8) on the terminal, ``[conceal]`` hidden text (the third December review's
    T: the topology table). Every cell of every view's tables must be ``Text``."""
    cells: list[object] = []
    add_row = Table.add_row

    def recording(self: Table, *renderables: object, **options: Any) -> None:
        cells.extend(renderables)
        add_row(self, *renderables, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(Table, "add_row", recording)
    for renderable in (status_view(report(), 200), why_view(diagnosis()), plan_view(change()),
                       defrag_view(plans(), NOW)):
        terminal(renderable)
    assert len(cells) > 20, "the views' tables were rendered"
    assert [c for c in cells if isinstance(c, str)] == []


def test_markup_a_node_publishes_is_shown_as_written_on_a_terminal() -> None:
    markup = "[link=https://evil.example/x]pci0000:15[/link][conceal]"
    dirty = dataclasses.replace(report(), topology=(NodeTopology("n1", nvlink=((markup, (0, 1)),),
                                                                 pcie=((markup, (0, 1)),)),))
    out = io.StringIO()
    Console(file=out, width=200, force_terminal=True, color_system="truecolor").print(status_view(dirty, 200))
    text = out.getvalue()
    assert f"{ESC}]8;" not in text, "no hyperlink"
    assert f"{ESC}[8m" not in text, "no hidden text"
    assert text.count("[link=https://evil.example/x]pci0000:15[/link][conceal]") == 2


def test_a_quoted_events_lines_stay_indented_under_its_finding() -> None:
    event = Finding("AdmissionDenied", f"Event: FailedScheduling: {PAYLOAD}")
    text = terminal(why_view(dataclasses.replace(diagnosis(), findings=(event,))))
    assert "\n  Nothing gpuslice knows of blocks it." not in text
    assert "\n        Nothing gpuslice knows of blocks it." in text


def test_the_map_as_svg_and_html_stays_well_formed_xml_with_every_string_poisoned() -> None:
    dirty = poisoned(report())
    image = svg(dirty)
    assert not FORBIDDEN.search(image)
    root = ET.fromstring(image)  # a control character, even as &#27;, is no XML 1.0
    titles = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title"))
    assert "\\x1b]0;gpuslice: all clear" in titles
    page = html(dirty)
    assert not FORBIDDEN.search(page)
    assert "<script" not in page.replace("&lt;script", "")


def test_a_table_cell_shows_rich_markup_as_it_was_written() -> None:
    """A ``str`` cell would be read as rich markup: ``[link=...]`` is an OSC 8 escape sequence."""
    text = terminal(status_view(poisoned(report(), "[link=https://e.x]x[/link]"), 200))
    policies = text.split("Policies", 1)[1].split("Tenants: use against limit", 1)[0]
    assert "[link=https://e.x]x[/link]" in policies


def test_the_commands_errors_and_warnings_are_escaped_too(capsys: pytest.CaptureFixture[str]) -> None:
    """An API server's message may quote what it was sent, a warning what it read."""
    import structlog

    from gpuslice.inspect.commands import _run, quiet_logging
    from gpuslice.inspect.snapshot import InspectError

    async def fails() -> None:
        raise InspectError(f"reading the cluster failed: {PAYLOAD}")

    saved = structlog.get_config()
    try:
        with pytest.raises(SystemExit):
            _run(fails())
        quiet_logging()  # twice: the escaping processor is added once
        # No blank, quote or newline: structlog's console renderer would show such a value as its repr.
        structlog.get_logger("test").warning("a warning", detail=f"title{ESC}]0;all-clear\x07{ESC}[2J")
    finally:
        structlog.configure(**saved)
    err = capsys.readouterr().err
    assert "reading the cluster failed: \\x1b]0;gpuslice: all clear" in err
    assert "detail=title\\x1b]0;all-clear\\x07\\x1b[2J" in err
    for raw in (f"{ESC}]", f"{ESC}[2J", f"{ESC}[8m", "\r", "\x9b", "\x7f"):  # the renderer's own colours may stay
        assert raw not in err, err
