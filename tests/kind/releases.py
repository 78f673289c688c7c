"""Releases for the kind tier, as users get them: a local OCI registry on the kind network (hack/oci,
go-containerregistry's registry), `make release` of this checkout pushed there and signed with a
throwaway cosign key, and the previous release built from its git commit (cached), pushed beside it.

Which commit is "the previous release": the newest tag `v*` that HEAD descends from, once there is
one. Until the first release is tagged there is none, so it is the first commit whose chart has its
CRDs as templates (`charts/gpuslice/templates/crds.yaml`): the oldest state of the chart a release can
have, and the layout every release has (a chart with `crds/` was never released). Its version is
then HEAD's own, so in the test's clone only it is named `<version>-previous` (a pre-release, which
semver orders before the version itself), its chart packaged and its image tagged under that name.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gpuslice import __version__
from tests.hacktools import hack_tool
from tests.kind.kindutil import REPO, Kind, cache_dir

CRD_TEMPLATES = "charts/gpuslice/templates/crds.yaml"


@dataclass(frozen=True)
class Registry:
    host: str  # localhost:PORT, as the host and (through containerd's hosts.toml) the nodes name it
    container: str


@dataclass(frozen=True)
class Release:
    version: str
    digest: str  # the image's index digest
    dist: Path
    kind_values: Path  # its chart's ci/kind-values.yaml


def start_registry(kind: Kind) -> Registry:
    """hack/oci's registry as a container on the kind network, published on the host's loopback; each
    node's containerd sends pulls of localhost:PORT to it over plain HTTP (hosts.toml)."""
    oci = Path(hack_tool("oci"))
    image = f"gpuslice-kind/registry:{hashlib.sha256(oci.read_bytes()).hexdigest()[:16]}"
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
        tarball = kind.workdir / "registry.tar"
        with tarfile.open(tarball, "w") as tar:
            info = tar.gettarinfo(str(oci), "oci")
            info.uid = info.gid = 0
            info.mode = 0o755
            with open(oci, "rb") as handle:
                tar.addfile(info, handle)
        kind.run("docker", "import", "--change", 'ENTRYPOINT ["/oci", "registry", "-addr", ":5000"]', str(tarball),
                 image)
    container = f"{kind.cluster}-registry"
    kind.run("docker", "rm", "-f", container, check=False)
    kind.run("docker", "run", "-d", "--name", container, "--network", "kind", "-p", "127.0.0.1::5000", image)
    port = kind.run("docker", "port", container, "5000/tcp").strip().splitlines()[0].rsplit(":", 1)[1]
    host = f"localhost:{port}"
    hosts = (f'server = "http://{container}:5000"\n[host."http://{container}:5000"]\n'
             '  capabilities = ["pull", "resolve"]\n')
    for node in kind.run(kind.build["kind"], "get", "nodes", "--name", kind.cluster).split():
        kind.run("docker", "exec", node, "mkdir", "-p", f"/etc/containerd/certs.d/{host}")
        kind.run("docker", "exec", "-i", node, "tee", f"/etc/containerd/certs.d/{host}/hosts.toml", input=hosts)
    kind.wait_until("the registry to answer", lambda: _answers(host), within=30)
    return Registry(host, container)


def _answers(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}/v2/", timeout=5) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def make_release(kind: Kind, registry: Registry, key: Path, dist: Path) -> Release:
    """`make release` of this checkout, for this registry, signed with ``key``."""
    kind.make("release", VERSION=__version__, REGISTRY=registry.host, IMAGE_BASE=kind.build["pythonBase"],
              COSIGN_KEY=str(key), DIST=str(dist))
    made = json.loads((dist / "release.json").read_text())
    return Release(__version__, made["digest"], dist, REPO / "charts/gpuslice/ci/kind-values.yaml")


def push(kind: Kind, registry: Registry, release: Release, layout: Path, chart: Path) -> None:
    """The image (every platform of its layout) and the chart, as a release pipeline pushes them."""
    pushed = kind.run(hack_tool("oci"), "push", "-layout", str(layout), "-ref",
                      f"{registry.host}/gpuslice:{release.version}", "-insecure").strip()
    assert pushed == release.digest, f"pushed {pushed}, released {release.digest}"
    kind.run(kind.build["helm"], "push", str(chart), f"oci://{registry.host}/charts", "--plain-http")


def previous_commit() -> tuple[str, str]:
    """(commit, why): the previous release's commit, by the rule in this module's docstring."""
    tag = subprocess.run(["git", "describe", "--tags", "--abbrev=0", "--match", "v*"], cwd=REPO, capture_output=True,
                         text=True, check=False)
    if tag.returncode == 0:
        name = tag.stdout.strip()
        return git("rev-list", "-n", "1", name), f"the tag {name}"
    first = git("log", "--diff-filter=A", "--reverse", "--format=%H", "--", CRD_TEMPLATES).split()
    assert first, f"no commit adds {CRD_TEMPLATES}: the chart has no CRD templates"
    return first[0], f"no tag yet: the first commit with {CRD_TEMPLATES}"


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def previous_release(kind: Kind, registry: Registry) -> Release:
    """The previous release, built from its commit in a clone (its Dockerfile, its chart), cached under
    its commit and the base image: the image's `docker save` and the packaged chart."""
    commit, why = previous_commit()
    clone = kind.workdir / "previous"
    shutil.rmtree(clone, ignore_errors=True)
    git("clone", "--quiet", "--no-checkout", str(REPO), str(clone))
    git("checkout", "--quiet", commit, cwd=clone)
    theirs = git("show", f"{commit}:operator/gpuslice/__init__.py").split('__version__ = "')[1].split('"')[0]
    version = theirs if theirs != __version__ else f"{__version__}-previous"
    print(f"\nkind tier: the previous release is {commit[:12]} ({why}), as {version}", flush=True)
    key = hashlib.sha256(f"{commit} {version} {kind.build['pythonBase']} {registry.host}".encode()).hexdigest()[:16]
    cached = cache_dir() / "previous" / f"{commit[:12]}-{key}"
    image = f"{registry.host}/gpuslice:{version}"
    if not (cached / ".complete").exists():
        shutil.rmtree(cached, ignore_errors=True)
        cached.mkdir(parents=True)
        kind.run("docker", "build", "-t", image, "--build-arg", f"BASE={kind.build['pythonBase']}", str(clone),
                 timeout=1800)
        kind.run("docker", "save", "-o", str(cached / "image.tar"), image)
        kind.run(kind.build["helm"], "package", str(clone / "charts/gpuslice"), "--version", version,
                 "--app-version", version, "--destination", str(cached))
        (cached / ".complete").touch()
    layout = kind.workdir / "previous-layout"
    shutil.rmtree(layout, ignore_errors=True)
    digest = kind.run(hack_tool("oci"), "layout", "-out", str(layout), "-ref", version, str(cached / "image.tar"))
    release = Release(version, digest.strip(), cached, clone / "charts/gpuslice/ci/kind-values.yaml")
    push(kind, registry, release, layout, cached / f"gpuslice-{version}.tgz")
    return release
