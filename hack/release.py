#!/usr/bin/env python3
"""`make release VERSION=x.y.z`: every artifact of a release, into dist/, from this checkout.

- ``gpuslice-VERSION.oci.tar``: the image as an OCI image layout (a tar of it: ``skopeo copy
  oci-archive:``, ``oci push`` of hack/oci), one OCI index over every platform built (amd64 and
  arm64 where ``docker buildx`` can build both, else this host's: hack/image.sh says which), the
  Dockerfile's OCI labels also as annotations on the index and each manifest, its base pinned by
  digest (the Dockerfile's, or IMAGE_BASE);
- ``gpuslice-VERSION-PLATFORM.spdx.json``: an SBOM per platform (syft, from its Go module): the
  base's Debian packages and the Python distributions of the image's virtualenv;
- ``gpuslice-VERSION.tgz``: the Helm chart (``helm package``), its image the release's, pinned by digest;
- ``install.yaml``: the ``nvidia`` overlay with the image pinned by digest (kustomize ``images:``);
- ``gpuslice-VERSION-py3-none-any.whl`` and ``gpuslice-VERSION.tar.gz``: the package (the CLI);
- ``gpuslice.krew.yaml``: the krew plugin manifest for ``kubectl gpuslice``;
- ``SHA256SUMS`` over all of them, and with a cosign key ``SHA256SUMS.sig`` and ``cosign.pub``
  (``cosign verify-blob --key cosign.pub --signature SHA256SUMS.sig --insecure-ignore-tlog SHA256SUMS``).

Every tool is pinned and built from its Go module by hack/kind/build.py (cached by content hash).
The version is the one of ``operator/gpuslice/__init__.py``: VERSION must be it (a release changes
it, runs ``make manifests`` and writes the CHANGELOG entry first).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import krew  # hack/krew.py, beside this file

REPO = Path(__file__).resolve().parents[1]

INIT = REPO / "operator/gpuslice/__init__.py"
OVERLAY = "manifests/overlays/nvidia"


class ReleaseError(Exception):
    """A step failed; the message says which and why."""


def say(message: str) -> None:
    print(f"release: {message}", file=sys.stderr, flush=True)


def run(*args: str | Path, cwd: Path = REPO, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise ReleaseError(f"`{' '.join(str(a) for a in args)}` failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def tool(name: str) -> str:
    """A pinned tool of hack/kind/build.py, built and cached if it is not yet."""
    return run(sys.executable, REPO / "hack/kind/build.py", name).strip()


def package_version() -> str:
    found = re.search(r'^__version__ = "([^"]+)"$', INIT.read_text(), re.MULTILINE)
    if not found:
        raise ReleaseError(f"{INIT.relative_to(REPO)} has no __version__")
    return found.group(1)


def source_url() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]["Source"])


def check_version(version: str) -> None:
    ours = package_version()
    if version != ours:
        raise ReleaseError(f"VERSION={version}, but {INIT.relative_to(REPO)} says {ours}: set __version__ to"
                           f" {version}, run `make manifests`, add its CHANGELOG.md entry, commit, then release")
    entries = re.findall(r"^## \[([^\]]+)\]", (REPO / "CHANGELOG.md").read_text(), re.MULTILINE)
    if not entries or entries[0] != version:
        raise ReleaseError(f"CHANGELOG.md's first entry is not [{version}]")


def revision() -> str:
    commit = run("git", "rev-parse", "HEAD").strip()
    if run("git", "status", "--porcelain", "--untracked-files=no").strip():
        say(f"the work tree has changes not committed: the image's revision label says {commit}, which lacks them")
    return commit


def deterministic_tar(directory: Path, archive: Path) -> None:
    """``directory`` as a tar with sorted names, no owners and no times: the same tree, the same bytes."""
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(directory.rglob("*")):
            info = tar.gettarinfo(str(path), str(path.relative_to(directory)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            info.mode = 0o755 if path.is_dir() else 0o644
            if path.is_file():
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)


def image(version: str, registry: str, base: str, work: Path, dist: Path) -> tuple[str, list[Path]]:
    """The image, built per platform by hack/image.sh, as an OCI layout tar; its index's digest and
    the per-platform `docker save` tarballs (for the SBOMs)."""
    archives = work / "platforms"
    env = {"IMAGE": f"{registry}/gpuslice:{version}", "ARCHIVES": str(archives), "VERSION": version,
           "REVISION": revision(), "SOURCE": source_url(), "IMAGE_BASE": base}
    say(f"building the image {env['IMAGE']} (hack/image.sh)")
    print(run(REPO / "hack/image.sh", env=env), end="", file=sys.stderr)
    saved = sorted(archives.glob("*.tar"))
    if not saved:
        raise ReleaseError(f"hack/image.sh wrote no image into {archives}")
    labels = json.loads(run("docker", "image", "inspect", "--format", "{{json .Config.Labels}}", env["IMAGE"]))
    annotations = [f"--annotation={k}={v}" for k, v in sorted(labels.items()) if k.startswith("org.opencontainers.")]
    layout = work / "layout"
    digest = run(tool("oci"), "layout", "-out", layout, "-ref", version, *annotations, *saved).strip()
    deterministic_tar(layout, dist / f"gpuslice-{version}.oci.tar")
    say(f"image: {', '.join(p.stem for p in saved)}, index {digest}")
    return digest, saved


def sboms(version: str, saved: list[Path], dist: Path) -> None:
    syft = tool("syft")
    for archive in saved:
        out = dist / f"gpuslice-{version}-{archive.stem}.spdx.json"
        run(syft, "scan", f"docker-archive:{archive}", "-o", f"spdx-json={out}", "-q",
            env={"SYFT_CHECK_FOR_APP_UPDATE": "false"})
        packages = len(json.loads(out.read_text()).get("packages", []))
        say(f"SBOM {out.name}: {packages} packages")


def chart(version: str, repository: str, digest: str, work: Path, dist: Path) -> None:
    """charts/gpuslice with its image the release's (repository and digest in values.yaml), packaged."""
    copy = work / "chart" / "gpuslice"
    shutil.copytree(REPO / "charts/gpuslice", copy)
    values = copy / "values.yaml"
    text = values.read_text()
    # The first value named so in values.yaml is the image's (the file begins with it).
    pinned, count = re.subn(r"^  repository: \S+$", f"  repository: {repository}", text, count=1, flags=re.MULTILINE)
    pinned, digests = re.subn(r"^  digest: ''$", f"  digest: {digest}", pinned, count=1, flags=re.MULTILINE)
    if count != 1 or digests != 1:
        raise ReleaseError("charts/gpuslice/values.yaml: no image.repository or image.digest to set")
    values.write_text(pinned)
    image = yaml.safe_load(pinned)["image"]
    if (image["repository"], image["digest"]) != (repository, digest):
        raise ReleaseError(f"values.yaml's image is {image}, not {repository}@{digest}")
    helm = tool("helm")
    run(helm, "lint", "--strict", "--namespace", "gpuslice-system", copy)
    run(helm, "package", copy, "--destination", dist)
    say(f"chart gpuslice-{version}.tgz: image {repository}@{digest}")


def install_yaml(repository: str, digest: str, work: Path, dist: Path) -> None:
    """The nvidia overlay with the image pinned by digest, as a kustomize overlay of it renders it."""
    overlay = Path(tempfile.mkdtemp(dir=REPO, prefix=".release-"))
    try:
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(REPO / OVERLAY, overlay)],
            "images": [{"name": "gpuslice", "newName": repository, "digest": digest}]}))
        rendered = run(tool("kustomize"), "build", overlay)
    finally:
        shutil.rmtree(overlay)
    header = (f"# gpuslice {package_version()} for clusters with NVIDIA GPUs: the nvidia overlay, its image pinned by"
              f" digest.\n# kubectl apply --server-side -f install.yaml (docs/install.md).\n")
    (dist / "install.yaml").write_text(header + rendered)
    images = set(re.findall(r"^\s+image: (\S+)$", rendered, re.MULTILINE))
    if images != {f"{repository}@{digest}"}:
        raise ReleaseError(f"install.yaml's images are {images}, not {repository}@{digest}")


def python_package(dist: Path, work: Path) -> None:
    """The wheel and sdist, built by setuptools' own build backend from a copy of the tracked files
    (nothing untracked, no build/ left in the checkout)."""
    source = work / "source"
    for name in run("git", "ls-files", "-z").split("\0"):
        if name and (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    built = []
    for hook in ("build_sdist", "build_wheel"):  # one process each: setuptools keeps state between them
        script = f"import sys; from setuptools import build_meta as b; print(b.{hook}(sys.argv[1]))"
        built.append(run(sys.executable, "-c", script, dist, cwd=source).split()[-1])
    for name in built:
        if not (dist / name).is_file():
            raise ReleaseError(f"setuptools says it built {name}, which is not in {dist}")
    say(f"package: {', '.join(built)}")


def checksums(dist: Path) -> Path:
    lines = []
    for path in sorted(p for p in dist.iterdir() if p.is_file() and p.name != "SHA256SUMS"):
        lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n")
    sums = dist / "SHA256SUMS"
    sums.write_text("".join(lines))
    return sums


def sign(sums: Path, key: Path, dist: Path) -> None:
    """cosign, key-based (keyless needs Sigstore's servers): the checksums file, and so every artifact.
    The key's password comes from COSIGN_PASSWORD, as cosign reads it."""
    cosign = tool("cosign")
    signature = dist / "SHA256SUMS.sig"
    run(cosign, "sign-blob", "--yes", "--key", key, "--tlog-upload=false", "--use-signing-config=false",
        "--new-bundle-format=false", "--output-signature", signature, sums)
    public = dist / "cosign.pub"
    run(cosign, "public-key", "--key", key, "--outfile", public)
    run(cosign, "verify-blob", "--key", public, "--signature", signature, "--insecure-ignore-tlog",
        "--use-signed-timestamps=false", "--new-bundle-format=false", sums)
    say("signed SHA256SUMS (SHA256SUMS.sig, cosign.pub) and verified the signature")


def release(version: str, registry: str, base: str, dist: Path, key: Path | None) -> None:
    check_version(version)
    run(sys.executable, REPO / "hack/manifests.py", "--check", "--kustomize", tool("kustomize"))
    repository = f"{registry}/gpuslice"
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="gpuslice-release-") as scratch:
        work = Path(scratch)
        digest, saved = image(version, registry, base, work, dist)
        sboms(version, saved, dist)
        chart(version, repository, digest, work, dist)
        install_yaml(repository, digest, work, dist)
        python_package(dist, work)
    packed = krew.archive(version, dist / f"gpuslice-{version}-py3-none-any.whl", REPO / "LICENSE", dist)
    (dist / "gpuslice.krew.yaml").write_text(krew.manifest(version, source_url(), packed))
    sums = checksums(dist)
    if key is not None:
        sign(sums, key, dist)
    else:
        say("not signed: no COSIGN_KEY given (docs/release.md)")
    (dist / "release.json").write_text(json.dumps({
        "version": version, "image": f"{repository}:{version}", "digest": digest,
        "platforms": [p.stem.replace("-", "/") for p in saved], "signed": key is not None}, indent=2) + "\n")
    say(f"gpuslice {version} in {dist}: " + ", ".join(sorted(p.name for p in dist.iterdir())))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", required=True)
    parser.add_argument("--registry", required=True, help="where the image will be pushed (its repository's parent)")
    parser.add_argument("--base", default="", help="the image's base (default: the Dockerfile's, pinned by digest)")
    parser.add_argument("--dist", type=Path, default=REPO / "dist")
    parser.add_argument("--cosign-key", type=Path, help="sign SHA256SUMS with this cosign key")
    args = parser.parse_args()
    try:
        release(args.version, args.registry, args.base, args.dist.resolve(), args.cosign_key)
    except ReleaseError as error:
        print(f"release: FAILED: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
