"""Finding the control-plane binaries, and the build cache key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuslice.devcluster import binaries
from gpuslice.devcluster.errors import DevClusterError

_ALL_ASSET_VARS = ["KUBEBUILDER_ASSETS",
                   *(binaries.asset_env_name(c) for c in (*binaries.COMPONENTS, binaries.POD_RUNNER))]


@pytest.fixture(autouse=True)
def _no_user_assets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in _ALL_ASSET_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUSLICE_CACHE_DIR", str(tmp_path / "cache"))


def _fake_assets(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in binaries.COMPONENTS:
        path = directory / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return directory


def test_asset_variable_names_follow_envtest() -> None:
    assert binaries.asset_env_name("kube-apiserver") == "TEST_ASSET_KUBE_APISERVER"
    assert binaries.asset_env_name("etcd") == "TEST_ASSET_ETCD"


async def test_kubebuilder_assets_directory_is_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assets = _fake_assets(tmp_path / "assets")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    found = await binaries.resolve(build_if_missing=False)
    assert found["kube-scheduler"] == assets / "kube-scheduler"
    assert found.origin == "KUBEBUILDER_ASSETS"


async def test_single_asset_variable_overrides_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assets = _fake_assets(tmp_path / "assets")
    other = _fake_assets(tmp_path / "other")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    monkeypatch.setenv("TEST_ASSET_ETCD", str(other / "etcd"))
    found = await binaries.resolve(build_if_missing=False)
    assert found["etcd"] == other / "etcd"
    assert found["kube-apiserver"] == assets / "kube-apiserver"


async def test_unnamed_binaries_come_from_our_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    source = _copy_source(tmp_path)
    monkeypatch.setenv("GPUSLICE_KUBE_SOURCE", str(source))
    kube = await binaries.describe_build(source)
    _fake_assets(kube.directory)
    for extra in (binaries.MULTICALL, binaries.POD_RUNNER):
        (kube.directory / extra).write_text("#!/bin/sh\n")
        (kube.directory / extra).chmod(0o755)
    own = _fake_assets(tmp_path / "own")
    monkeypatch.setenv("TEST_ASSET_KUBE_APISERVER", str(own / "kube-apiserver"))
    found = await binaries.resolve(build_if_missing=False)
    assert found["kube-apiserver"] == own / "kube-apiserver"
    assert found["etcd"] == kube.directory / "etcd"
    assert found.pod_runner == kube.directory / binaries.POD_RUNNER
    assert found.origins["kube-apiserver"] == "TEST_ASSET_KUBE_APISERVER"
    assert "kube-apiserver from TEST_ASSET_KUBE_APISERVER" in found.origin


async def test_missing_binary_is_named_with_its_origin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path / "nowhere"))
    with pytest.raises(DevClusterError, match=r"etcd binary .*nowhere/etcd \(from KUBEBUILDER_ASSETS"):
        await binaries.resolve(build_if_missing=False)


async def test_no_go_and_no_binaries_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(DevClusterError, match=r"Go is not installed.*KUBEBUILDER_ASSETS"):
        await binaries.resolve(build_if_missing=False)


def test_build_with_every_binary_given_needs_no_go(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gpuslice.cli import main

    assets = _fake_assets(tmp_path / "assets")
    (assets / binaries.POD_RUNNER).write_text("#!/bin/sh\n")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    monkeypatch.setenv("PATH", "/nonexistent")
    result = CliRunner().invoke(main, ["dev-cluster", "build"])
    assert result.exit_code == 0, result.output
    assert "Nothing to build" in result.output
    assert str(assets) in result.output


def _copy_source(tmp_path: Path) -> Path:
    source = binaries.kube_source_dir()
    assert source is not None, "tests run from a checkout that has hack/kube"
    copy = tmp_path / "kube"
    copy.mkdir()
    for name in ("go.mod", "go.sum", "main.go"):
        shutil.copy(source / name, copy / name)
    return copy


async def test_cache_key_is_stable_and_follows_the_sources(tmp_path: Path) -> None:
    source = _copy_source(tmp_path)
    first = await binaries.describe_build(source)
    again = await binaries.describe_build(source)
    assert first.key == again.key
    assert first.kubernetes_version.startswith("v1.")
    assert f"gitVersion={first.kubernetes_version}" in first.ldflags
    assert not first.is_built

    (source / "main.go").write_text((source / "main.go").read_text() + "\n// changed\n")
    changed = await binaries.describe_build(source)
    assert changed.key != first.key
    assert changed.directory != first.directory


async def test_not_built_and_building_forbidden_points_at_make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSLICE_KUBE_SOURCE", str(_copy_source(tmp_path)))
    with pytest.raises(DevClusterError, match="make kube-bin"):
        await binaries.resolve(build_if_missing=False)


async def test_another_minor_builds_from_its_own_modfile_with_its_tag(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """go.mod is the default minor; go.1.36.mod beside it is 1.36's, built from the same sources with
    -modfile and the tag kube136 (kubelet_1_36.go), each minor in its own cache slot."""
    source = _copy_source(tmp_path)
    kube = binaries.kube_source_dir()
    assert kube is not None
    for name in ("go.1.36.mod", "go.1.36.sum"):
        shutil.copy(kube / name, source / name)
    default = await binaries.describe_build(source)
    k136 = await binaries.describe_build(source, "1.36")
    assert k136.kubernetes_version.startswith("v1.36.")
    assert (k136.minor, k136.build_flags) == ("1.36", ["-modfile=go.1.36.mod", "-tags=kube136"])
    assert default.build_flags == []
    assert k136.key != default.key
    assert k136.directory != default.directory
    assert (await binaries.describe_build(source, "v" + default.minor)).key == default.key
    monkeypatch.setenv(binaries.KUBE_VERSION_ENV, "1.36")
    assert (await binaries.describe_build(source)).key == k136.key
    with pytest.raises(DevClusterError, match=r"not 1\.35: generate go\.1\.35\.mod with `hack/kube/gen-gomod\.sh"
                                               r" --beside v1\.35\.PATCH`"):
        await binaries.describe_build(source, "1.35")
    with pytest.raises(DevClusterError, match="is not a Kubernetes minor"):
        await binaries.describe_build(source, "1.36.3")
