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


def test_a_release_builds_one_docker_archive_per_platform_with_its_labels(tmp_path: Path) -> None:
    said, calls = make_image(tmp_path, BUILDX="1", DRIVER="docker-container",
                             PLATFORMS_LISTED="linux/amd64, linux/arm64", ARCHIVES=f"{tmp_path}/out", VERSION="1.2.3",
                             REVISION="abc", IMAGE_BASE="python@sha256:0123")
    labels = ("--build-arg BASE=python@sha256:0123 --build-arg VERSION=1.2.3 --build-arg REVISION=abc"
              " --build-arg BASE_DIGEST=sha256:0123")
    assert [c for c in calls if c.startswith("buildx build")] == [
        f"buildx build --platform linux/amd64 {labels} -t r.example/g:1 --output type=docker,dest={tmp_path}/out/linux-amd64.tar .",
        f"buildx build --platform linux/arm64 {labels} -t r.example/g:1 --output type=docker,dest={tmp_path}/out/linux-arm64.tar .",
    ]
    assert f"built r.example/g:1 for linux/amd64,linux/arm64 into {tmp_path}/out" in said


def test_a_release_without_buildx_saves_the_hosts_architecture_and_says_so(tmp_path: Path) -> None:
    said, calls = make_image(tmp_path, ARCHIVES=f"{tmp_path}/out", VERSION="1.2.3")
    base = (REPO / "Dockerfile").read_text().split("ARG BASE=", 1)[1].split("\n", 1)[0]
    assert "@sha256:" in base, "the Dockerfile's base is pinned by digest"
    assert [c for c in calls if c.startswith(("build ", "save "))] == [
        f"build --build-arg VERSION=1.2.3 --build-arg BASE_DIGEST={base.split('@')[1]} -t r.example/g:1 .",
        f"save -o {tmp_path}/out/linux-amd64.tar r.example/g:1",
    ]
    assert "built r.example/g:1 for linux/amd64 only (not multi-arch: docker buildx is not installed) into" in said
