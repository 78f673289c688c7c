"""The map drawn: bars in proportion, labels that fit, idle GPUs folded, the same map as SVG and HTML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from rich.console import Console

from gpuslice.inspect.commands import render_report
from gpuslice.inspect.render.labels import fit, rows, size_pair, widths
from gpuslice.inspect.render.terminal import status_view
from gpuslice.planning.reads.occupancy import Segment
from gpuslice.planning.reads.published import Holder
from gpuslice.planning.reads.status_report import Snapshot, StatusReport, status_report
from tests.unit.planning.cluster_state import INFERENCE, claim, node_body, published, tag


def report() -> StatusReport:
    t = tag("n1", index=2)
    return status_report(Snapshot([INFERENCE], published("n1", "h100-80gb", 4, [INFERENCE]),
                                  [claim("team-a", "c", [("n1", f"{t}-inference-10g-0")], pods=("web-0",))],
                                  [node_body("n1", "h100-80gb", 4)]))


def test_widths_share_cells_in_proportion_and_give_every_segment_one() -> None:
    assert widths([1, 1, 2], 8) == [2, 2, 4]
    assert sum(widths([10**10] * 8 + [5 * 10**9], 80)) == 80
    assert widths([1000, 1], 10) == [9, 1]


def test_a_label_that_does_not_fit_drops_the_namespace_then_is_cut() -> None:
    segment = Segment("allocated", 1, 1, holder=Holder("team-a", "claim-x", ("web-0",)))
    assert fit(segment, 20) == "team-a/web-0"
    assert fit(segment, 6) == "web-0"
    assert fit(segment, 4) == "web…"
    assert fit(segment, 2) == ""


def test_memory_totals_in_one_unit() -> None:
    assert size_pair(30 * 10**9, 165_520_809_984) == "30G / 165.5G"
    assert size_pair(0, 40 * 10**9) == "0 / 40G"
    assert size_pair(10 * 2**30, None) == "10Gi / no limit"


def test_idle_gpus_alike_share_a_row_and_busy_ones_have_their_own() -> None:
    [node] = report().map.nodes
    assert [title for title, _ in rows(node.gpus)] == ["GPU 0-1", "GPU 2", "GPU 3"]


def test_the_terminal_view_names_the_holder_and_the_totals() -> None:
    console = Console(width=160, record=True)
    console.print(status_view(report(), 160))
    text = console.export_text()
    assert "team-a/web-0" in text
    assert "GPU 0-1" in text
    assert "10G / 165.5G" in text


def test_svg_and_html_are_well_formed_and_say_the_same() -> None:
    result = report()
    svg = render_report(result, "svg")
    assert svg is not None
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    titles = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any("claim team-a/c (pod web-0)" in t for t in titles)
    html = render_report(result, "html")
    assert html is not None
    assert html.startswith("<!doctype html>")
    assert "<svg" in html
    data = json.loads(render_report(result, "json") or "")
    assert data["policies"][0]["tenants"][0]["allocatedBytes"] == 10 * 10**9


def test_an_edit_keeps_the_live_policys_age_and_a_new_one_is_the_youngest(tmp_path: object) -> None:
    from pathlib import Path

    import pytest

    from gpuslice.inspect.cluster_plan import NEWEST, edited, load_edits
    from gpuslice.inspect.snapshot import InspectError

    live = {**INFERENCE, "metadata": {**INFERENCE["metadata"], "generation": 3}}
    edit = {"metadata": {"name": "inference"}, "spec": {**INFERENCE["spec"], "slicing": {"mode": "memory", "allowFullGpu": True,
                                                                                          "sliceSize": "20G"}}}
    policy = edited(edit, live)
    assert (policy.metadata.creation_timestamp, policy.metadata.generation) == (INFERENCE["metadata"]["creationTimestamp"], 4)
    assert policy.status.conditions, "the live status comes along: seniority reads Valid"
    assert edited({**edit, "metadata": {"name": "other"}}, None).metadata.creation_timestamp == NEWEST
    with pytest.raises(InspectError, match="sliceSize"):
        edited({"metadata": {"name": "x"}, "spec": {"slicing": {"mode": "memory"}}}, None)
    bad = Path(str(tmp_path)) / "bad.yaml"
    bad.write_text("kind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(InspectError, match="expected a GpuSlicePolicy"):
        load_edits([bad])


def test_an_overusing_holder_is_drawn_over_full_in_every_view() -> None:
    from tests.unit.planning.cluster_state import overusing

    t = tag("n1", index=2)
    greedy = overusing(claim("team-b", "g", [("n1", f"{t}-inference-10g-1")], pods=("greedy-0",)),
                       "pod team-b/greedy-0 uses 14Gi of GPU memory on GPU ..., more than the 10G")
    result = status_report(Snapshot([INFERENCE], published("n1", "h100-80gb", 4, [INFERENCE]), [greedy],
                                    [node_body("n1", "h100-80gb", 4)]))
    [gpu] = [g for g in result.map.gpus if g.overusing]
    assert [h.who for h in gpu.overusing] == ["team-b/greedy-0"]
    console = Console(width=160, record=True)
    console.print(status_view(result, 160))
    text = console.export_text()
    assert "over their allocation: team-b/greedy-0" in text
    assert "OVER" in text
    svg = render_report(result, "svg")
    assert "over its allocation: pod team-b/greedy-0 uses 14Gi" in svg
    assert "#b91c1c" in svg
    as_json = json.loads(render_report(result, "json"))
    holders = [s["holder"] for n in as_json["map"]["nodes"] for g in n["gpus"] for s in g["segments"] if s["holder"]]
    assert next(h["overuse"] for h in holders if h["claim"] == "g").startswith("pod team-b/greedy-0 uses 14Gi")
