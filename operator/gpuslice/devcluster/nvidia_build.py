"""Building NVIDIA's code and gpuslice's mock NVML library from Go modules, cached by content hash.

Each build is a Go module under ``hack/nvidia`` pinned by its go.mod and go.sum, as the control
plane is (``binaries.py``):

- ``mocknvml``: gpuslice's ``libnvidia-ml.so.1`` for fake nodes (cgo, ``-buildmode=c-shared``) over
  go-nvml's DGX mocks; its stubs are generated from go-nvml's ``nvml.h`` at build time.
- ``ctk``: NVIDIA Container Toolkit's ``nvidia-ctk`` and ``nvidia-cdi-hook``, which write and apply CDI
  specs.
- ``deviceplugin``: NVIDIA's device plugin, a neighbour gpuslice must leave the GPUs to.

NVIDIA's MPS binaries come from Debian (``mps_binaries``), fetched once into the same cache.

A build's slot is keyed by the hash of its module's files, the Go version, the C compiler and the
build's own flags, so a warm run only checks; concurrent builders of one slot wait on its lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuslice.devcluster.binaries import cache_root
from gpuslice.devcluster.errors import DevClusterError

Reporter = Callable[[str], None]
# Bump when how a build is made changes (its commands, not its sources: those are hashed).
RECIPE = "1"
CGO_CFLAGS = "-O2 -g -Wno-deprecated-declarations"


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def nvidia_source_dir() -> Path | None:
    """``hack/nvidia`` of a source checkout, if this is one."""
    override = os.environ.get("GPUSLICE_NVIDIA_SOURCE")
    if override:
        return Path(override)
    for parent in Path(__file__).resolve().parents:
        if (parent / "hack" / "nvidia" / "mocknvml" / "go.mod").is_file():
            return parent / "hack" / "nvidia"
    return None


@dataclass(frozen=True)
class Build:
    name: str  # the module's directory under hack/nvidia
    outputs: tuple[str, ...]  # files the slot holds when complete
    compile: Callable[[Path, Path, Reporter], None]  # (module, partial slot, report)


def _go_env(cgo: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update(GOTOOLCHAIN="local", GOFLAGS="-modcacherw", CGO_ENABLED="1" if cgo else "0")
    if cgo:
        env["CGO_CFLAGS"] = CGO_CFLAGS
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str], what: str) -> str:
    if args[0] == "go":
        go = shutil.which("go")
        if go is None:
            raise DevClusterError(f"Go is not installed: {what} is built from Go modules. Install Go 1.26+.")
        args = [go, *args[1:]]
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise DevClusterError(f"{what}: `{' '.join(args)}` failed in {cwd}.", log_tail=done.stderr[-3000:])
    return done.stdout


def _toolchain() -> str:
    parts = [_run(["go", "env", "GOVERSION", "GOOS", "GOARCH"], Path.cwd(), _go_env(False), "go env")]
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is not None:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
        parts.append(version.splitlines()[0] if version else cc)
    return " ".join(" ".join(parts).split())


def _key(module: Path, build: Build, toolchain: str) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in module.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(module)).encode() + b"\0" + path.read_bytes() + b"\0")
    for part in (build.name, toolchain, RECIPE, CGO_CFLAGS):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def slot(build: Build, source: Path | None = None) -> Path:
    """The cache directory of the build, without building it."""
    source = source or nvidia_source_dir()
    if source is None:
        raise DevClusterError("This installation has no hack/nvidia sources: run from a gpuslice checkout.")
    key = _key(source / build.name, build, _toolchain())
    return cache_root() / "nvidia" / f"{build.name}-{key[:16]}"


def ensure(build: Build, report: Reporter = _stderr, source: Path | None = None) -> Path:
    """The build's cache directory, built first if it is not there."""
    source = source or nvidia_source_dir()
    directory = slot(build, source)
    if (directory / ".complete").exists():
        return directory
    assert source is not None  # slot() said so
    with _lock(directory.parent / f".{directory.name}.lock"):
        if (directory / ".complete").exists():
            return directory
        report(f"nvidia: building {build.name} from Go modules (hack/nvidia/{build.name}) into {directory}")
        started = time.monotonic()
        partial = directory.with_name(directory.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        build.compile(source / build.name, partial, report)
        missing = [name for name in build.outputs if not (partial / name).exists()]
        if missing:
            raise DevClusterError(f"building {build.name} left no {', '.join(missing)} in {partial}.")
        (partial / ".complete").write_text(json.dumps({"seconds": round(time.monotonic() - started, 1)}))
        shutil.rmtree(directory, ignore_errors=True)
        partial.rename(directory)
        report(f"nvidia: {build.name} built in {time.monotonic() - started:.0f} s")
    return directory


MOCK_NVML_LIBRARY = "libnvidia-ml.so.1"


def _compile_mocknvml(module: Path, partial: Path, report: Reporter) -> None:
    """The stubs are generated from go-nvml's nvml.h (the version go.mod pins) in a copy of the
    module, so the checkout stays as it is."""
    env = _go_env(True)
    with tempfile.TemporaryDirectory(prefix="gpuslice-mocknvml-") as scratch:
        work = Path(scratch) / "mocknvml"
        shutil.copytree(module, work)
        # Downloaded first: `go list -m` names no directory for a module not in the cache yet (a cold machine).
        nvml = json.loads(_run(["go", "mod", "download", "-json", "github.com/NVIDIA/go-nvml"], work, env,
                               "mocknvml"))["Dir"]
        _run(["go", "run", "./gen", str(Path(nvml) / "pkg/nvml/nvml.h"), "stubs.c"], work, env, "mocknvml stubs")
        _run(["go", "build", "-trimpath", "-buildmode=c-shared", "-ldflags",
              '-s -w -extldflags "-Wl,-soname,libnvidia-ml.so.1"', "-o", str(partial / MOCK_NVML_LIBRARY), "."],
             work, env, "mocknvml")
    (partial / "libnvidia-ml.so.h").unlink(missing_ok=True)


MOCK_NVML = Build("mocknvml", (MOCK_NVML_LIBRARY,), _compile_mocknvml)


def mock_nvml_library(report: Reporter = _stderr) -> Path:
    """gpuslice's ``libnvidia-ml.so.1`` over go-nvml's mocks, built when missing."""
    return ensure(MOCK_NVML, report) / MOCK_NVML_LIBRARY


def _compile_tools(packages: tuple[str, ...]) -> Callable[[Path, Path, Reporter], None]:
    """Main packages of NVIDIA's modules, at the versions the module's go.mod pins (its ``tool`` lines)."""

    def compile_them(module: Path, partial: Path, report: Reporter) -> None:
        _run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", f"{partial}/", *packages], module,
             _go_env(True), f"building {' '.join(packages)}")

    return compile_them


CTK = Build("ctk", ("nvidia-ctk", "nvidia-cdi-hook"), _compile_tools((
    "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk",
    "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook")))


DEVICE_PLUGIN = Build("deviceplugin", ("nvidia-device-plugin",), _compile_tools((
    "github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin",)))


def device_plugin(report: Reporter = _stderr) -> Path:
    """NVIDIA's ``nvidia-device-plugin`` (hack/nvidia/deviceplugin's pinned version), built when missing."""
    return ensure(DEVICE_PLUGIN, report) / "nvidia-device-plugin"


def container_toolkit(report: Reporter = _stderr) -> Path:
    """The directory of NVIDIA's ``nvidia-ctk`` and ``nvidia-cdi-hook`` (hack/nvidia/ctk's pinned
    version), built when missing."""
    return ensure(CTK, report)


# NVIDIA's MPS control daemon and server, from Debian's non-free component (bookworm's driver branch,
# 535): the binaries run without a GPU (they start, answer their control commands and quit), so the
# agent's MPS lifecycle is tested against them. Fetched with a scoped apt configuration into the cache;
# the system's apt sources are left as they are.
MPS_PACKAGE, MPS_VERSION, MPS_SUITES = "nvidia-cuda-mps", "535.261.03-1", ("bookworm",)
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
MPS_CONTROL, MPS_SERVER = "usr/bin/nvidia-cuda-mps-control", "usr/sbin/nvidia-cuda-mps-server"


def mps_binaries(report: Reporter = _stderr) -> Path:
    """A directory holding ``usr/bin/nvidia-cuda-mps-control`` and ``usr/sbin/nvidia-cuda-mps-server``
    of Debian's ``nvidia-cuda-mps`` at the pinned version, fetched when missing (apt-get, dpkg-deb)."""
    directory = cache_root() / "nvidia" / f"mps-{MPS_VERSION}"
    if (directory / ".complete").exists():
        return directory
    for tool in ("apt-get", "apt-cache", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise DevClusterError(f"{tool} is missing: NVIDIA's MPS daemon comes from Debian's non-free component"
                                  f" ({MPS_PACKAGE} {MPS_VERSION}); on another system put its binaries in {directory}.")
    with _lock(directory.parent / f".{directory.name}.lock"):
        if (directory / ".complete").exists():
            return directory
        report(f"nvidia: fetching {MPS_PACKAGE} {MPS_VERSION} from Debian's non-free component into {directory}")
        with tempfile.TemporaryDirectory(prefix="gpuslice-apt-") as scratch:
            apt = Path(scratch)
            for sub in ("lists/partial", "archives/partial", "parts", "preferences"):
                (apt / sub).mkdir(parents=True)
            signed = f"[signed-by={DEBIAN_KEYRING}] " if Path(DEBIAN_KEYRING).exists() else ""
            (apt / "sources.list").write_text("".join(f"deb {signed}{DEBIAN_MIRROR} {suite} non-free\n"
                                                      for suite in MPS_SUITES))
            options = [f"-oDir::Etc::SourceList={apt / 'sources.list'}", f"-oDir::Etc::SourceParts={apt / 'parts'}",
                       f"-oDir::State::Lists={apt / 'lists'}", f"-oDir::Cache={apt}",
                       f"-oDir::Cache::Archives={apt / 'archives'}", f"-oDir::Etc::Preferences={apt / 'none'}",
                       f"-oDir::Etc::PreferencesParts={apt / 'preferences'}", "-oDebug::NoLocking=1",
                       "-oAPT::Sandbox::User=root" if os.geteuid() == 0 else "-oAPT::Get::List-Cleanup=0"]
            _run(["apt-get", *options, "-q", "update"], apt, dict(os.environ), "apt-get update (Debian non-free)")
            try:
                _run(["apt-get", *options, "-q", "download", f"{MPS_PACKAGE}={MPS_VERSION}"], apt, dict(os.environ),
                     f"apt-get download {MPS_PACKAGE}={MPS_VERSION}")
            except DevClusterError as error:
                offered = _run(["apt-cache", *options, "madison", MPS_PACKAGE], apt, dict(os.environ), "apt-cache")
                raise DevClusterError(f"Debian no longer offers {MPS_PACKAGE} {MPS_VERSION} (it offers:"
                                      f" {offered.strip()}); update MPS_VERSION in devcluster/nvidia_build.py."
                                      ) from error
            [deb] = apt.glob("*.deb")
            partial = directory.with_name(directory.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            _run(["dpkg-deb", "-x", str(deb), str(partial)], apt, dict(os.environ), "dpkg-deb")
        (partial / ".complete").write_text(f"{MPS_PACKAGE} {MPS_VERSION}\n")
        shutil.rmtree(directory, ignore_errors=True)
        partial.rename(directory)
    return directory


def main() -> int:
    """``python -m gpuslice.devcluster.nvidia_build``: every piece the NVML nodes need, built or found."""
    for name, get in (("mock NVML library", mock_nvml_library), ("nvidia-ctk", container_toolkit),
                      ("NVIDIA's device plugin", device_plugin), ("NVIDIA's MPS binaries", mps_binaries)):
        started = time.monotonic()
        try:
            found = get()
        except DevClusterError as error:
            print(f"nvidia: {error}", file=sys.stderr)
            return 1
        print(f"nvidia: {name}: {found} ({time.monotonic() - started:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
