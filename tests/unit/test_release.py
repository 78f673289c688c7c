"""`make release` (hack/release.py, hack/krew.py) without Docker: it refuses a version that is not the
package's, its archives are the same bytes for the same inputs (so a release can be checked by
rebuilding it), and the krew manifest names its archive's digest. The whole release, image and
signature included, is made, pushed, verified and installed by the kind tier (tests/kind/test_helm.py)."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from gpuslice import __version__

REPO = Path(__file__).resolve().parents[2]


def hack(name: str) -> ModuleType:
    sys.path.insert(0, str(REPO / "hack"))
    try:
        spec = importlib.util.spec_from_file_location(name, REPO / "hack" / f"{name}.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "hack"))


def test_a_release_of_another_version_than_the_package_is_refused() -> None:
    release = hack("release")
    release.check_version(__version__)
    with pytest.raises(release.ReleaseError, match=f"VERSION=9.9.9, but operator/gpuslice/__init__.py says {__version__}"):
        release.check_version("9.9.9")


def test_the_layout_tar_is_the_same_bytes_for_the_same_tree(tmp_path: Path) -> None:
    release = hack("release")
    tree = tmp_path / "layout"
    (tree / "blobs/sha256").mkdir(parents=True)
    (tree / "index.json").write_text("{}")
    (tree / "blobs/sha256/abc").write_bytes(b"layer")
    release.deterministic_tar(tree, tmp_path / "one.tar")
    (tree / "index.json").touch()  # a new mtime: not in the tar
    release.deterministic_tar(tree, tmp_path / "two.tar")
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()
    with tarfile.open(tmp_path / "one.tar") as tar:
        assert sorted(tar.getnames()) == ["blobs", "blobs/sha256", "blobs/sha256/abc", "index.json"]
        assert {m.uid for m in tar.getmembers()} == {0}


def test_the_krew_archive_is_reproducible_and_its_manifest_names_its_digest(tmp_path: Path) -> None:
    krew = hack("krew")
    wheel = tmp_path / f"gpuslice-{__version__}-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    digests = set()
    for attempt in ("a", "b"):
        out = tmp_path / attempt
        out.mkdir()
        packed = krew.archive(__version__, wheel, REPO / "LICENSE", out)
        digests.add(hashlib.sha256(packed.read_bytes()).hexdigest())
    assert len(digests) == 1, "the same inputs make the same archive"
    with tarfile.open(packed) as tar:
        assert sorted(tar.getnames()) == sorted(["LICENSE", "kubectl-gpuslice", wheel.name])
        launcher = tar.getmember("kubectl-gpuslice")
        assert launcher.mode == 0o755
        script = tar.extractfile(launcher)
        assert script is not None
        assert f"version={__version__}\n" in script.read().decode()
    manifest = yaml.safe_load(krew.manifest(__version__, "https://example.org/gpuslice", packed))
    assert manifest["kind"] == "Plugin"
    assert manifest["spec"]["version"] == f"v{__version__}"
    [digest] = digests
    assert {(p["selector"]["matchLabels"]["os"], p["selector"]["matchLabels"]["arch"])
            for p in manifest["spec"]["platforms"]} == {(o, a) for o in ("linux", "darwin") for a in ("amd64", "arm64")}
    for platform in manifest["spec"]["platforms"]:
        assert platform["sha256"] == digest
        assert platform["uri"].endswith(f"/v{__version__}/{packed.name}")
        assert platform["bin"] == "kubectl-gpuslice"
