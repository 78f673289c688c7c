"""What the image installs: pinned, and without what only people's own commands need."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gpuslice import __version__

ROOT = Path(__file__).resolve().parents[2]
CLI_EXTRA = ("rich", "kubernetes_asyncio")


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _closure(requirements: list[str]) -> set[str]:
    """Every distribution these requirements install (no extras), as installed here."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        todo.extend(Requirement(r) for r in metadata.requires(requirement.name) or [])
    return seen


def test_constraints_pin_every_runtime_dependency_within_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _pins()
    for text in project["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"constraints.txt does not pin {name}: make constraints"
        assert requirement.specifier.contains(pins[name]), \
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject.toml's {requirement.specifier}: make constraints"
    missing = _closure(project["dependencies"]) - set(pins)
    assert not missing, f"constraints.txt leaves {sorted(missing)} unpinned: make constraints"
    extra = {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["cli"]}
    assert not extra & set(pins), "the cli extra is not for the image"


def test_the_image_installs_with_the_constraints_and_without_extras() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"pip install -c /src/constraints\.txt /src\b", dockerfile)
    assert "[cli]" not in dockerfile
    assert "[dev]" not in dockerfile


_BLOCKED = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Absent())
"""


def _without_the_cli_extra(code: str) -> subprocess.CompletedProcess[str]:
    """Python as in the image: the cli extra's packages cannot be imported."""
    return subprocess.run([sys.executable, "-c", _BLOCKED.format(blocked=set(CLI_EXTRA)) + code],
                          capture_output=True, text=True, timeout=60)


def test_controller_and_agent_run_without_the_cli_extra_and_load_no_dev_code() -> None:
    code = ("import gpuslice.controller.run, gpuslice.agent.run, gpuslice.cli\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in {'rich', 'kubernetes_asyncio'}"
            " or m.startswith(('gpuslice.devcluster', 'gpuslice.inspect.commands', 'gpuslice.bench'))))")
    done = _without_the_cli_extra(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("args", [["status"], ["status", "--help"], ["dev-cluster", "up"]])
def test_a_command_that_needs_the_extra_says_how_to_get_it(args: list[str]) -> None:
    done = _without_the_cli_extra(f"from gpuslice.cli import main\nmain({args!r})")
    assert done.returncode == 1
    assert f"`gpuslice {args[0]}` needs the cli extra" in done.stderr
    assert "pipx install 'gpuslice[cli]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_kubectl_gpuslice_says_its_version_without_the_extra_and_what_it_needs_otherwise() -> None:
    code = "import sys; sys.argv = ['kubectl-gpuslice', {arg!r}]\nfrom gpuslice.inspect.plugin import run\nrun()"
    version = _without_the_cli_extra(code.format(arg="--version"))
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"kubectl-gpuslice, version {__version__}"
    status = _without_the_cli_extra(code.format(arg="status"))
    assert status.returncode == 1
    assert "`kubectl gpuslice` needs the cli extra" in status.stderr


def test_help_lists_every_command_without_the_extra() -> None:
    done = _without_the_cli_extra("from gpuslice.cli import main\nmain(['--help'])")
    assert done.returncode == 0, done.stderr
    for command in ("agent", "controller", "status", "why", "dev-cluster"):
        assert f"  {command}" in done.stdout


def test_the_license_is_apache_2_0_and_the_package_ships_it() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n" in text, "LICENSE is not the Apache-2.0 text"
    assert "Version 2.0, January 2004" in text, "LICENSE is not the Apache-2.0 text"
    assert "END OF TERMS AND CONDITIONS" in text, "LICENSE is cut short: the full Apache-2.0 text"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"], "the wheel and sdist carry LICENSE (PEP 639)"
