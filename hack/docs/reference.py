#!/usr/bin/env python3
"""Write the generated reference pages (`make reference`), or check them (--check).

Each page is made from what it describes, so that it cannot say something the code does not:

- ``docs/reference/metrics.md``: the Prometheus metric objects (metrics_page.py);
- ``docs/reference/api.md``: the committed CRDs' schemas (api_page.py);
- ``docs/reference/cli.md``: ``--help`` of every command (cli_page.py);
- ``docs/reference/layout.md``: the packages' and modules' docstrings (layout_page.py);
- ``docs/reference/tests.md``: the tests' names and docstrings (tests_page.py);
- the settings lists of ``docs/configuration.md``, between their markers (the rest of it is prose).

With ``--check`` it writes nothing and fails, naming each stale page; the unit tier runs it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import api_page  # hack/docs/, beside this file
import cli_page
import layout_page
import metrics_page
import tests_page

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "reference"
CONFIGURATION = REPO / "docs" / "configuration.md"
BLOCK = re.compile(r"(<!-- settings: (\S+) -->\n)(.*?)(<!-- end -->)", re.S)


def settings_tables(text: str) -> str:
    """``docs/configuration.md`` with each settings list between its markers made from its model."""
    from gpuslice.cli import DOCUMENTED
    from gpuslice.settings import markdown

    def table(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in DOCUMENTED:
            raise SystemExit(f"docs/configuration.md: no settings model is called {name!r} ({', '.join(DOCUMENTED)})")
        return match.group(1) + markdown(DOCUMENTED[name]) + match.group(4)

    return BLOCK.sub(table, text)


def pages() -> dict[Path, Callable[[], str]]:
    return {REFERENCE / "metrics.md": metrics_page.render,
            REFERENCE / "api.md": lambda: api_page.render(REPO / "crds"),
            REFERENCE / "cli.md": cli_page.render,
            REFERENCE / "layout.md": lambda: layout_page.render(REPO),
            REFERENCE / "tests.md": lambda: tests_page.render(REPO),
            CONFIGURATION: lambda: settings_tables(CONFIGURATION.read_text())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="write nothing; fail naming each stale page")
    args = parser.parse_args()
    stale = []
    for path, render in pages().items():
        text = render()
        if path.exists() and path.read_text() == text:
            continue
        if args.check:
            stale.append(str(path.relative_to(REPO)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
    if stale:
        print(f"stale: {', '.join(stale)}: run `make reference` and commit the result", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
