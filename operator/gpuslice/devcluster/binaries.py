"""Finding, and when needed building, the control-plane binaries.

Resolution follows envtest's convention so a user with downloaded binaries
needs no Go: ``TEST_ASSET_<NAME>`` for one binary, then ``KUBEBUILDER_ASSETS/<name>``,
then our own build of ``hack/kube`` in a cache keyed by the hash of everything
that goes into it (go.mod, go.sum, Go sources, Go version, target, ldflags),
so a warm run skips even the link.

``hack/kube/go.mod`` is the default minor; ``go.1.MINOR.mod`` beside it is another one, built from
the same sources with ``-modfile`` and the build tag ``kube1MINOR`` (what the pod runner calls of
the kubelet differs between minors: ``kubelet_1_*.go``). ``GPUSLICE_KUBE_VERSION=1.36`` (or
``--kube-version``) picks it; each minor has its own cache slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuslice.devcluster.errors import DevClusterError

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
KUBE_VERSION_ENV = "GPUSLICE_KUBE_VERSION"  # a minor ("1.36") other than go.mod's, built beside it
POD_RUNNER = "pod-runner"  # ours, not upstream's: only from our build or TEST_ASSET_POD_RUNNER
MULTICALL = "kubebins"

Reporter = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Binaries:
    """Paths of the four control-plane binaries, and where each came from."""

    paths: dict[str, Path]
    origins: dict[str, str]

    def __getitem__(self, component: str) -> Path:
        return self.paths[component]

    @property
    def pod_runner(self) -> Path | None:
        return self.paths.get(POD_RUNNER)

    @property
    def origin(self) -> str:
        """One line for the user: where the binaries came from."""
        distinct = sorted(set(self.origins.values()))
        if len(distinct) == 1:
            return distinct[0]
        return "; ".join(f"{name} from {self.origins[name]}" for name in COMPONENTS)


def asset_env_name(component: str) -> str:
    """``kube-apiserver`` -> ``TEST_ASSET_KUBE_APISERVER`` (controller-runtime's rule)."""
    return "TEST_ASSET_" + re.sub(r"[^A-Za-z0-9]", "_", component).upper()


def kube_source_dir() -> Path | None:
    """The ``hack/kube`` Go module of a source checkout, if this is one."""
    override = os.environ.get("GPUSLICE_KUBE_SOURCE")
    if override:
        return Path(override)
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "hack" / "kube"
        if (candidate / "go.mod").is_file():
            return candidate
    return None


def cache_root() -> Path:
    explicit = os.environ.get("GPUSLICE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "gpuslice"


@dataclass(frozen=True)
class KubeBuild:
    """Everything that determines the multi-call binary, and its cache slot."""

    source: Path
    kubernetes_version: str
    go_version: str
    target: str
    ldflags: str
    key: str
    modfile: str = "go.mod"  # go.1.MINOR.mod for a minor other than the default's
    tags: str = ""  # kube1MINOR with such a modfile

    @property
    def minor(self) -> str:
        """``1.36`` of ``v1.36.3``."""
        return ".".join(self.kubernetes_version.removeprefix("v").split(".")[:2])

    @property
    def build_flags(self) -> list[str]:
        """What ``go build`` (and ``go vet``) take to build this minor."""
        if self.modfile == "go.mod":
            return []
        return [f"-modfile={self.modfile}", f"-tags={self.tags}"]

    @property
    def directory(self) -> Path:
        return cache_root() / "kube" / f"{self.kubernetes_version}-{self.key[:16]}"

    @property
    def is_built(self) -> bool:
        return all((self.directory / name).exists() for name in (MULTICALL, *COMPONENTS, POD_RUNNER))

    def binaries(self) -> Binaries:
        names = (*COMPONENTS, POD_RUNNER)
        paths = {name: self.directory / name for name in names}
        return Binaries(paths, dict.fromkeys(names, f"gpuslice build cache {self.directory}"))


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-modcacherw")
    return env


async def _run_go(args: list[str], cwd: Path) -> str:
    go = shutil.which("go")
    if go is None:
        raise DevClusterError(
            "Go is not installed, and no control-plane binaries were given. Install Go 1.26+"
            " (the build uses the Go module proxy only), or point KUBEBUILDER_ASSETS at a"
            " directory holding etcd, kube-apiserver, kube-scheduler and kube-controller-manager"
            " (or set TEST_ASSET_ETCD, TEST_ASSET_KUBE_APISERVER, TEST_ASSET_KUBE_SCHEDULER,"
            " TEST_ASSET_KUBE_CONTROLLER_MANAGER)."
        )
    process = await asyncio.create_subprocess_exec(
        go, *args, cwd=cwd, env=_go_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        raise DevClusterError(
            f"`go {' '.join(args)}` failed in {cwd}.", log_tail=err.decode(errors="replace")[-3000:]
        )
    return out.decode()


def parse_minor(asked: str, where: str = "--kube-version") -> str:
    """``1.36`` of ``1.36`` or ``v1.36``; anything else is refused with the fix."""
    match = re.fullmatch(r"v?(1\.\d+)", asked.strip())
    if match is None:
        raise DevClusterError(
            f"{where}={asked!r} is not a Kubernetes minor: give one such as 1.36 (the patch is the one"
            " hack/kube pins)."
        )
    return match.group(1)


def requested_minor() -> str | None:
    """The minor asked for by ``GPUSLICE_KUBE_VERSION``, or None for go.mod's."""
    asked = os.environ.get(KUBE_VERSION_ENV, "").strip()
    return parse_minor(asked, KUBE_VERSION_ENV) if asked else None


async def _modfile_version(source: Path, modfile: str) -> str:
    modfile_json = json.loads(await _run_go(["mod", "edit", "-json", modfile], source))
    version = next(
        (r["Version"] for r in modfile_json.get("Require", []) if r["Path"] == "k8s.io/kubernetes"),
        None,
    )
    if version is None:
        raise DevClusterError(f"{source / modfile} does not require k8s.io/kubernetes.")
    return str(version)


async def describe_build(source: Path | None = None, minor: str | None = None) -> KubeBuild:
    """Compute the cache key of ``hack/kube`` for ``minor`` (default: ``requested_minor()``, else
    go.mod's) without building anything."""
    source = source or kube_source_dir()
    if source is None or not (source / "go.mod").is_file():
        raise DevClusterError(
            "No control-plane binaries found: KUBEBUILDER_ASSETS and TEST_ASSET_* are unset, and"
            " this installation has no hack/kube source to build them from. Run from a gpuslice"
            " checkout (`make kube-bin`), or set KUBEBUILDER_ASSETS."
        )
    minor = parse_minor(minor) if minor else requested_minor()
    modfile = "go.mod"
    version = await _modfile_version(source, modfile)
    if minor is not None and not version.startswith(f"v{minor}."):
        modfile = f"go.{minor}.mod"
        if not (source / modfile).is_file():
            beside = sorted(p.name for p in source.glob("go.1.*.mod"))
            raise DevClusterError(
                f"hack/kube builds Kubernetes {version} (go.mod){''.join(f' and {b}' for b in beside)}, not"
                f" {minor}: generate {modfile} with `hack/kube/gen-gomod.sh --beside v{minor}.PATCH`, or unset"
                f" {KUBE_VERSION_ENV}."
            )
        version = await _modfile_version(source, modfile)
    go_env = json.loads(await _run_go(["env", "-json", "GOVERSION", "GOOS", "GOARCH"], source))
    match = re.fullmatch(r"v(\d+)\.(\d+)\.\d+.*", version)
    if match is None:
        raise DevClusterError(f"Unexpected k8s.io/kubernetes version {version!r} in {modfile}.")
    tags = "" if modfile == "go.mod" else f"kube{match.group(1)}{match.group(2)}"
    pkg = "k8s.io/component-base/version"
    ldflags = " ".join([
        "-s", "-w",
        f"-X {pkg}.gitVersion={version}",
        f"-X {pkg}.gitMajor={match.group(1)}",
        f"-X {pkg}.gitMinor={match.group(2)}",
        f"-X {pkg}.gitTreeState=clean",
    ])
    digest = hashlib.sha256()
    sums = modfile.removesuffix(".mod") + ".sum"
    inputs = sorted(p for p in source.iterdir() if p.name in (modfile, sums) or p.suffix == ".go")
    for path in inputs:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    target = f"{go_env['GOOS']}/{go_env['GOARCH']}"
    for part in (go_env["GOVERSION"], target, ldflags, "CGO_ENABLED=0 -trimpath", *([tags] if tags else [])):
        digest.update(part.encode() + b"\0")
    return KubeBuild(source, version, go_env["GOVERSION"], target, ldflags, digest.hexdigest(), modfile, tags)


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


async def build(kube: KubeBuild, report: Reporter = _stderr) -> Binaries:
    """Build the multi-call binary into its cache slot unless it is already there."""
    if kube.is_built:
        report(f"kube-bin: Kubernetes {kube.kubernetes_version} binaries are cached in {kube.directory}")
        return kube.binaries()
    with _build_lock(kube.directory):
        if kube.is_built:  # another process built it while we waited for the lock
            return kube.binaries()
        report(
            f"kube-bin: building Kubernetes {kube.kubernetes_version} (kube-apiserver,"
            f" kube-scheduler, kube-controller-manager, etcd) from Go modules with"
            f" {kube.go_version}.\nkube-bin: the first build downloads ~1 GB of modules and"
            " compiles for about 10 minutes on 2 cores; later runs reuse"
            f" {kube.directory} and take seconds."
        )
        await _compile(kube, report)
    report(f"kube-bin: done; binaries in {kube.directory}")
    return kube.binaries()


async def _compile(kube: KubeBuild, report: Reporter) -> None:
    go = shutil.which("go")
    assert go is not None  # describe_build ran go already
    kube.directory.mkdir(parents=True, exist_ok=True)
    partial = kube.directory / f"{MULTICALL}.partial"
    process = await asyncio.create_subprocess_exec(
        go, "build", "-v", "-trimpath", *kube.build_flags, "-ldflags", kube.ldflags, "-o", str(partial), ".",
        cwd=kube.source, env=_go_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    started = last_report = time.monotonic()
    packages, tail = 0, list[str]()
    async for raw in process.stdout:
        line = raw.decode(errors="replace").rstrip()
        packages += 1
        tail = [*tail[-40:], line]
        if time.monotonic() - last_report > 30:
            last_report = time.monotonic()
            report(
                f"kube-bin: still building ({int(last_report - started)} s, {packages} packages"
                f" compiled, last {line})"
            )
    if await process.wait() != 0:
        partial.unlink(missing_ok=True)
        raise DevClusterError(
            f"Building the control plane from {kube.source} failed.", log_tail="\n".join(tail)
        )
    partial.rename(kube.directory / MULTICALL)
    for name in (*COMPONENTS, POD_RUNNER):
        link = kube.directory / name
        link.unlink(missing_ok=True)
        link.symlink_to(MULTICALL)


def user_binaries() -> Binaries:
    """The binaries the user named through envtest's variables (possibly none)."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    paths: dict[str, Path] = {}
    origins: dict[str, str] = {}
    for name in (*COMPONENTS, POD_RUNNER):
        variable = asset_env_name(name)
        if value := os.environ.get(variable):
            paths[name], origins[name] = Path(value), variable
        elif assets and (name != POD_RUNNER or (Path(assets) / name).exists()):
            paths[name], origins[name] = Path(assets) / name, "KUBEBUILDER_ASSETS"
    return Binaries(paths, origins)


def check_executable(binaries: Binaries) -> None:
    for name, path in binaries.paths.items():
        if not path.is_file() or not os.access(path, os.X_OK):
            raise DevClusterError(
                f"{name} binary {path} (from {binaries.origins[name]}) does not exist or is not"
                f" executable. Fix the path, unset the variable to use gpuslice's own build"
                f" (`make kube-bin`), or run `make kube-bin` again."
            )


async def resolve(*, build_if_missing: bool = True, report: Reporter = _stderr, minor: str | None = None) -> Binaries:
    """The binaries to run, each resolved on its own as envtest does: its
    ``TEST_ASSET_*`` variable, else ``KUBEBUILDER_ASSETS``, else our cached build of ``minor``
    (built now if allowed)."""
    chosen = user_binaries()
    if any(name not in chosen.paths for name in COMPONENTS):
        kube = await describe_build(minor=minor)
        if not kube.is_built and not build_if_missing:
            raise DevClusterError(
                f"The control plane for Kubernetes {kube.kubernetes_version} is not built yet."
                f" Run `make kube-bin{'' if kube.modfile == 'go.mod' else ' KUBE_VERSION=' + kube.minor}`"
                " (about 10 minutes the first time), or set KUBEBUILDER_ASSETS."
            )
        built = await build(kube, report) if not kube.is_built else kube.binaries()
        chosen = Binaries({**built.paths, **chosen.paths}, {**built.origins, **chosen.origins})
    check_executable(chosen)
    return chosen
