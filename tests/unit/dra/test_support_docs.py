"""One source of truth for the Kubernetes versions gpuslice runs on: ``dra.support.MATRIX``. README's
and the docs' support table are generated from it, the chart's ``kubeVersion`` is, each row's tested
patch is what hack/kube builds, and a README or docs line that names a range of Kubernetes versions
must name the matrix's. (Other software's ranges are worded without one: "since 1.35".)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpuslice.dra.support import MATRIX, NEWEST_TESTED_MINOR, RELEASES, chart_kube_version, matrix_table, oldest_version
from tests.cluster.tiers import K136

REPO = Path(__file__).resolve().parents[3]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "README.md"]
TABLE = re.compile(r"<!-- support-matrix:start[^>]*-->\n(.*?)\n<!-- support-matrix:end -->", re.DOTALL)
# A Kubernetes version (1.30 to 1.49: not Go's 1.26 nor the NVIDIA toolkit's 1.18) in a range.
_V = r"v?1\.[34]\d(?:\.\d+)?"
RANGE = re.compile(rf"(?:(?:older|newer|earlier|later) than (?:Kubernetes )?{_V})"
                   rf"|(?:{_V}(?:\+|\s+or\s+(?:newer|later|above|older|earlier|below)"
                   rf"|\s+and\s+(?:newer|later|above|up|older|earlier)))"
                   rf"|(?:>=\s*{_V})|(?:{_V}\s*(?:\u2013|\bto\b)\s*{_V})")
_REFUSED = min(r.minor for r in MATRIX)
ALLOWED = {f"{oldest_version()} or newer", f"{oldest_version()}+", f">={oldest_version()}",
           f"older than {oldest_version()}", f"newer than 1.{NEWEST_TESTED_MINOR}", f"1.{_REFUSED} and older"}


def ranges(text: str) -> list[str]:
    """Every range of Kubernetes versions ``text`` names (a range may break across lines)."""
    return [re.sub(r"\s+", " ", m.group(0)) for m in RANGE.finditer(re.sub(r"\s+", " ", text))]


def test_the_pattern_finds_ranges_and_leaves_other_software_alone() -> None:
    assert ranges("needs Kubernetes 1.36 or\n  newer; newer than 1.37 is untested; chart >=1.36.0-0") == [
        "1.36 or newer", "newer than 1.37", ">=1.36.0"]
    assert ranges("EKS 1.34+, 1.33 to 1.35, older than Kubernetes 1.36.1") == [
        "1.34+", "1.33 to 1.35", "older than Kubernetes 1.36.1"]
    assert ranges("Go 1.26+, the toolkit 1.18 or later, since 1.35, on 1.36 and 1.37") == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_range_a_doc_names_is_the_matrixs(path: Path) -> None:
    wrong = [r for r in ranges(path.read_text()) if r not in ALLOWED]
    assert wrong == [], (f"{path.relative_to(REPO)} names Kubernetes ranges other than dra.support.MATRIX's"
                         f" ({sorted(ALLOWED)}): {wrong}")


def test_the_support_tables_are_the_matrixs() -> None:
    found = {p.relative_to(REPO): TABLE.findall(p.read_text()) for p in DOCS}
    tables = {str(p): t for p, t in found.items() if t}
    assert set(tables) >= {"README.md", "docs/install.md"}
    for where, blocks in tables.items():
        assert blocks == [matrix_table()], f"{where}: regenerate with python -m gpuslice.dra.support"


def test_the_charts_kube_version_is_the_matrixs() -> None:
    chart = yaml.safe_load((REPO / "charts" / "gpuslice" / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == chart_kube_version() == f">={oldest_version()}-0"


def test_each_tested_row_names_the_patch_hack_kube_builds() -> None:
    kube = REPO / "hack" / "kube"
    default = re.search(r"k8s\.io/kubernetes (v\S+)", (kube / "go.mod").read_text())
    assert default is not None
    for release in MATRIX:
        if not release.tested:
            assert not release.supported or release.minor == NEWEST_TESTED_MINOR + 1
            continue
        if default.group(1) == release.tested:
            continue
        beside = re.search(r"k8s\.io/kubernetes (v\S+)", (kube / f"go.1.{release.minor}.mod").read_text())
        assert beside is not None
        assert beside.group(1) == release.tested, release
        assert int(release.tested.split(".")[2]) >= (release.first_patch or 0)
    assert RELEASES[NEWEST_TESTED_MINOR].tested == default.group(1)


def test_the_136_tier_names_tests_that_exist() -> None:
    for node in K136:
        path, _, name = node.partition("::")
        source = (REPO / path).read_text()
        assert re.search(rf"^(async )?def {re.escape(name)}\(", source, re.MULTILINE), node
