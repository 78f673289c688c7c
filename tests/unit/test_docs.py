"""The docs hold together: every page is reachable from docs/index.md, the generated pages are what
the code generates now, and the site's build refuses a link to a file or heading that is not there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


def unlinked(docs: Path) -> list[str]:
    """The pages under ``docs`` that ``docs/index.md`` does not link to."""
    index = docs / "index.md"
    linked = {(docs / target).resolve() for target in LINK.findall(index.read_text())}
    return sorted(page.relative_to(docs).as_posix() for page in docs.rglob("*.md")
                  if page != index and page.resolve() not in linked)


def test_the_index_links_every_page() -> None:
    missing = unlinked(DOCS)
    assert not missing, f"docs/index.md does not link {missing}: add a line for each under its audience"


def test_a_page_left_out_of_the_index_is_found(tmp_path: Path) -> None:
    (tmp_path / "reference").mkdir()
    (tmp_path / "index.md").write_text("- [A](a.md)\n- [B](reference/b.md#part)\n")
    for page in ("a.md", "reference/b.md", "reference/c.md", "d.md"):
        (tmp_path / page).write_text("# x\n")
    assert unlinked(tmp_path) == ["d.md", "reference/c.md"]


LONGEST = 400


def long_lines(root: Path) -> list[str]:
    """``path:line (length)`` of each line over LONGEST characters in ``root``'s README.md and docs/**/*.md."""
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    return [f"{page.relative_to(root)}:{number} ({len(line)})" for page in pages if page.exists()
            for number, line in enumerate(page.read_text().splitlines(), 1) if len(line) > LONGEST]


def test_no_line_of_the_docs_is_over_400_characters() -> None:
    """A reader of a diff, a terminal or a table's source cannot follow a line that long (issue 42): a table
    row that long becomes a list, a generated page wraps what it takes from the code."""
    found = long_lines(REPO)
    assert not found, f"lines over {LONGEST} characters (make a long table row a list, wrap the rest): {found}"


def test_a_long_line_is_found_in_the_readme_and_a_nested_page(tmp_path: Path) -> None:
    (tmp_path / "docs" / "reference").mkdir(parents=True)
    (tmp_path / "README.md").write_text("short\n" + "x" * 401 + "\n")
    (tmp_path / "docs" / "a.md").write_text("y" * 400 + "\n")
    (tmp_path / "docs" / "reference" / "b.md").write_text("| " + "z" * 399 + " |\n")
    assert long_lines(tmp_path) == ["README.md:2 (401)", "docs/reference/b.md:1 (403)"]


def test_the_generated_pages_are_fresh() -> None:
    checked = subprocess.run([sys.executable, str(REPO / "hack/docs/reference.py"), "--check"],
                             capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr


def _build(site: Path, page: str) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of a one-page site beside a copy of the repository's README."""
    (site / "docs").mkdir(parents=True)
    (site / "docs" / "index.md").write_text(page)
    (site / "README.md").write_text("# gpuslice\n\n## Trying it on kind\n")
    (site / "manifests").mkdir()
    (site / "manifests" / "admission.yaml").write_text("{}\n")
    config = (REPO / "mkdocs.yml").read_text().replace("hack/docs/mkdocs_hooks.py",
                                                       str(REPO / "hack/docs/mkdocs_hooks.py"))
    (site / "mkdocs.yml").write_text(config)
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(site / "mkdocs.yml")],
                          capture_output=True, text=True, check=False, cwd=site,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"})


def test_links_outside_the_docs_are_checked_and_pointed_at_the_files(tmp_path: Path) -> None:
    good = _build(tmp_path / "good", "# Home\n\n[rules](../manifests/admission.yaml), [kind](../README.md#trying-it-on-kind)\n")
    assert good.returncode == 0, good.stderr
    html = (tmp_path / "good" / "build" / "site" / "index.html").read_text()
    assert f'href="{(tmp_path / "good" / "manifests" / "admission.yaml").as_uri()}"' in html
    assert f'href="{(tmp_path / "good" / "README.md").as_uri()}#trying-it-on-kind"' in html
    bad = _build(tmp_path / "bad", "# Home\n\n[gone](../manifests/gone.yaml), [kind](../README.md#trying-kind)\n"
                                   "[page](nowhere.md), [anchor](#no-such-heading)\n")
    assert bad.returncode != 0
    for broken in ("'../manifests/gone.yaml', which is not in the repository", "no heading 'trying-kind' in README.md",
                   "'nowhere.md'", "'#no-such-heading'"):
        assert broken in bad.stderr, bad.stderr
