"""`make image` (hack/image.sh) builds amd64 and arm64 with buildx where the builder can, and says what
it built and why not otherwise. These machines have no buildx (the kind tier runs the host-only path
for real), so a stand-in `docker` on PATH answers as each kind of Docker would and records what it
was asked to do."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAND_IN = """#!/bin/sh
echo "$*" >> "$CALLS"
case "$1 $2" in
  "version --format") echo amd64 ;;
  "buildx version") [ -n "$BUILDX" ] || { echo "docker: unknown command: docker buildx" >&2; exit 1; }; echo "v0.20" ;;
  "buildx inspect") printf 'Name: b\\nDriver: %s\\nPlatforms: %s\\n' "$DRIVER" "$PLATFORMS_LISTED" ;;
esac
exit 0
"""


def make_image(tmp_path: Path, **env: str) -> tuple[str, list[str]]:
    docker = tmp_path / "docker"
    docker.write_text(STAND_IN)
    docker.chmod(0o755)
    calls = tmp_path / "calls"
    done = subprocess.run([str(REPO / "hack/image.sh")], cwd=REPO, capture_output=True, text=True, check=True,
                          env={**os.environ, "DOCKER": str(docker), "CALLS": str(calls), "IMAGE": "r.example/g:1",
                               **env})
    return done.stdout, calls.read_text().splitlines()


def test_without_buildx_it_builds_the_hosts_architecture_and_says_so(tmp_path: Path) -> None:
    said, calls = make_image(tmp_path)
    assert "built r.example/g:1 for linux/amd64 only (not multi-arch: docker buildx is not installed)" in said
    assert [c for c in calls if c.startswith("build ")] == ["build -t r.example/g:1 ."]


@pytest.mark.parametrize(("driver", "listed", "why"), [
    ("docker", "linux/amd64, linux/386", "uses the docker driver, which builds one platform"),
    ("docker-container", "linux/amd64, linux/386", "cannot build linux/arm64"),
])
def test_a_builder_that_cannot_build_both_falls_back_naming_why(tmp_path: Path, driver: str, listed: str,
                                                                 why: str) -> None:
    said, calls = make_image(tmp_path, BUILDX="1", DRIVER=driver, PLATFORMS_LISTED=listed)
    assert why in said, said
    assert not any(c.startswith("buildx build") for c in calls)


def test_with_a_builder_for_both_it_builds_both_into_an_archive_and_loads_the_hosts(tmp_path: Path) -> None:
    said, calls = make_image(tmp_path, BUILDX="1", DRIVER="docker-container",
                             PLATFORMS_LISTED="linux/amd64*, linux/arm64, linux/arm/v7", IMAGE_BASE="base:1")
    builds = [c for c in calls if c.startswith("buildx build")]
    assert builds == [
        "buildx build --platform linux/amd64,linux/arm64 --build-arg BASE=base:1 -t r.example/g:1"
        " --output type=oci,dest=dist/r.example_g_1.oci.tar .",
        "buildx build --platform linux/amd64 --build-arg BASE=base:1 -t r.example/g:1 --load .",
    ]
    assert "built r.example/g:1 for linux/amd64,linux/arm64: dist/r.example_g_1.oci.tar" in said


def test_push_pushes_the_multi_arch_image(tmp_path: Path) -> None:
    said, calls = make_image(tmp_path, BUILDX="1", DRIVER="docker-container",
                             PLATFORMS_LISTED="linux/amd64, linux/arm64", PUSH="1")
    assert [c for c in calls if c.startswith("buildx build")] == [
        "buildx build --platform linux/amd64,linux/arm64 -t r.example/g:1 --push ."]
    assert "built and pushed r.example/g:1 for linux/amd64,linux/arm64" in said
