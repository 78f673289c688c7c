"""The tests' own layout holds (issue 37's checks): helpers are imported from helper modules, never
from a test module or a conftest; one builder makes policy bodies; and a sleep of a second or more in
the cluster and kind tiers is a length that says so, never a wait for nothing to happen; and the
cluster tier's long files, which start first, exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SLEEP = re.compile(r"(?:asyncio|time)\.sleep\(([0-9.]+)\)")


def _sources(*tiers: str) -> list[Path]:
    return sorted(p for tier in tiers for p in (TESTS / tier).rglob("*.py")) if tiers else sorted(TESTS.rglob("*.py"))


def test_no_helper_is_imported_from_a_test_module_or_a_conftest() -> None:
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
                last = node.module.rsplit(".", 1)[-1]  # type: ignore[union-attr]
                if last.startswith("test_") or last == "conftest":
                    found.append(f"{path.relative_to(TESTS.parent)}:{node.lineno} from {node.module}")
    assert not found, "move these helpers into a helper module (tests/builders.py, tests/cluster/*.py, ...):\n" + \
        "\n".join(found)


def test_policy_bodies_have_one_builder() -> None:
    factories = [f"{p.relative_to(TESTS.parent)}:{n.lineno}" for p in _sources()
                 for n in ast.parse(p.read_text()).body
                 if isinstance(n, ast.FunctionDef) and n.name in ("policy", "_policy", "make_policy", "policy_body")]
    assert len(factories) == 1, f"build policies with tests.builders.policy(): {factories}"
    assert factories[0].startswith("tests/builders.py:"), factories


def test_each_sleep_of_a_second_or_more_in_the_cluster_and_kind_tiers_is_a_length() -> None:
    unsaid = [f"{p.relative_to(TESTS.parent)}:{i}: {line.strip()}" for p in _sources("cluster", "kind")
              for i, line in enumerate(p.read_text().splitlines(), 1)
              if (m := SLEEP.search(line)) and float(m.group(1)) >= 1 and "# length:" not in line]
    assert not unsaid, ("wait for what the process reports (tests/cluster/observe.py), or say what the sleep is"
                        " the length of in a '# length:' comment:\n" + "\n".join(unsaid))


def test_the_cluster_tiers_long_files_exist() -> None:
    """A file renamed or gone would silently start last again (tests/cluster/tiers.py)."""
    from tests.cluster.tiers import LONG_FILES  # a plain module: tiers.py imports nothing

    assert [f for f in LONG_FILES if not (TESTS.parent / f).is_file()] == []
