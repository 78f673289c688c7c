"""One version, from operator/gpuslice/__init__.py: the package, `gpuslice --version`, the image tag
`make image` builds, the manifests' images, the chart's version and appVersion, and the top entry of
CHANGELOG.md. A release changes __version__, runs `make manifests` and writes its CHANGELOG entry."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import yaml

from gpuslice import __version__

REPO = Path(__file__).resolve().parents[2]


def test_the_package_and_the_command_say_the_one_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.]+)?", __version__), f"{__version__} is not semantic"
    assert importlib.metadata.version("gpuslice") == __version__, "pyproject.toml reads gpuslice.__version__"
    printed = subprocess.run([sys.executable, "-m", "gpuslice", "--version"], capture_output=True, text=True, check=True)
    assert printed.stdout.strip() == f"gpuslice, version {__version__}"


def test_make_image_tags_the_one_version() -> None:
    plan = subprocess.run(["make", "-n", "image"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert f"IMAGE=gpuslice:{__version__} " in plan, plan


def test_the_manifests_and_the_chart_run_the_one_version() -> None:
    images = set()
    for path in (REPO / "manifests/base").glob("*.yaml"):
        images |= set(re.findall(r"^\s+image: (\S+)$", path.read_text(), re.MULTILINE))
    assert images == {f"gpuslice:{__version__}"}, f"{images}: the base's images (and install.yaml, the chart) must be"\
        f" gpuslice:{__version__}"
    chart = yaml.safe_load((REPO / "charts/gpuslice/Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (__version__, __version__), "run `make manifests`"
    assert f"image: gpuslice:{__version__}\n" in (REPO / "install.yaml").read_text()


def test_the_changelog_has_an_entry_for_the_one_version() -> None:
    entries = re.findall(r"^## \[([^\]]+)\]", (REPO / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert entries, "CHANGELOG.md has no `## [version]` entry"
    assert entries[0] == __version__, f"CHANGELOG.md's first entry is {entries[0]}, not {__version__}"
