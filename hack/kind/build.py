#!/usr/bin/env python3
"""Build, here and without any registry, everything the kind tier runs; cached by content hash.

No container registry is reachable from the machines gpuslice is tested on, so nothing can
be pulled, and `kind build node-image` pulls etcd, coredns, pause and kindnetd. This builds
what kind's own builder would, from the Go module proxy and Debian's packages only:

- Go binaries (under ``~/.cache/gpuslice/kind/go/``): kind, containerd (+ shim, ctr), the
  CNI plugins, crictl, coredns (``hack/kind/coredns``), the node's Kubernetes binaries (``hack/kube/nodebins``:
  kubelet, kubeadm, kubectl, kube-proxy), ``hack/kind``'s pause and podnet, and helm (the chart's
  install, upgrade and uninstall); the Prometheus Operator's CRDs from its module;
- Debian root filesystems from debootstrap, imported into Docker: the node's base, a Python
  base (for the gpuslice ``Dockerfile``) and a busybox base (for the tenant image);
- the images kubeadm expects, tagged as it expects them (control plane and etcd from the
  dev cluster's multi-call binary), saved in one tarball;
- the node image: the node base + kind's base files from the kind module + the binaries,
  with those images preloaded into containerd's ``k8s.io`` namespace, as kind's builder does.

Every step is keyed by a hash of what goes into it (inputs, versions, the Go toolchain and
the step's own recipe below), so a warm run only checks. The result is written to
``~/.cache/gpuslice/kind/build.json`` (and printed with ``--print``). Heavy work runs
under ``nice -n 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import fcntl
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KIND_VERSION = "v0.33.0"
CONTAINERD_VERSION = "v2.4.2"
CNI_PLUGINS_VERSION = "v1.10.0"
CRI_TOOLS_VERSION = "v1.37.0"
HELM_VERSION = "v3.22.0"
# The newest release of the Prometheus Operator's main module the Go module proxy lists.
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
MONITORING_CRDS = ("servicemonitors", "podmonitors", "prometheusrules")
# Release tools (make release, the monitoring checks): each pinned, built from its Go module.
PROMETHEUS_VERSION = "v0.316.0"  # the Go module's version of Prometheus 3.16.0: promtool
COSIGN_VERSION = "v3.1.3"
SYFT_VERSION = "v1.57.2"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
CNI_PLUGINS = ("main/bridge", "main/loopback", "main/ptp", "ipam/host-local", "meta/portmap")
NODE_PACKAGES = (
    # What kind's base image installs (images/base/Dockerfile), from Debian; runc too.
    "systemd,systemd-sysv,dbus,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,"
    "ebtables,kmod,libseccomp2,pigz,bash,ca-certificates,jq,procps,socat,ipset,e2fsprogs,runc"
)
PYTHON_PACKAGES = "python3,python3-venv,ca-certificates"
ENTRYPOINT = '["/usr/local/bin/entrypoint", "/sbin/init"]'
HOOK = "/kind/bin/mount-product-files.sh"  # kind's createContainer hook, in cri-base.json

_print_lock = threading.Lock()


class BuildError(Exception):
    """A step failed; the message says which, and what it printed last."""


def log(step: str, message: str) -> None:
    with _print_lock:
        print(f"kind-build [{step}] {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    explicit = os.environ.get("GPUSLICE_CACHE_DIR")
    if explicit:
        return Path(explicit) / "kind"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "gpuslice" / "kind"


CACHE = cache_root()


def run(
    step: str,
    command: Sequence[str | Path],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    stdin: Path | None = None,
    heavy: bool = False,
    capture: bool = False,
) -> str:
    """Run a command, reporting every 30 s while it runs; on failure show its tail."""
    args = [str(part) for part in command]
    if heavy:
        args = ["nice", "-n", "10", *args]
    tail: list[str] = []
    with contextlib.ExitStack() as stack:
        source = stack.enter_context(open(stdin, "rb")) if stdin else subprocess.DEVNULL
        process = subprocess.Popen(
            args, cwd=cwd, env={**os.environ, **(env or {})}, stdin=source,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE if capture else subprocess.STDOUT,
        )
        if capture:
            out, err = process.communicate()
            if process.returncode != 0:
                raise BuildError(f"{step}: `{' '.join(args)}` failed:\n{err.decode(errors='replace')[-3000:]}")
            return out.decode()
        assert process.stdout is not None
        stream = process.stdout

        def read() -> None:
            for raw in stream:
                tail.append(raw.decode(errors="replace").rstrip())
                del tail[:-40]

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        started = time.monotonic()
        while True:
            try:
                process.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                last = tail[-1][:160] if tail else "(no output yet)"
                log(step, f"still running ({int(time.monotonic() - started)} s): {last}")
        reader.join()
        if process.returncode != 0:
            raise BuildError(f"{step}: `{' '.join(args)}` failed; its last lines:\n" + "\n".join(tail))
    return "\n".join(tail)


def digest(*parts: object) -> str:
    """sha256 over strings, bytes and files or trees (names, modes and contents)."""
    hasher = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            files = sorted(p for p in part.rglob("*") if p.is_file()) if part.is_dir() else [part]
            for path in files:
                name = str(path.relative_to(part)) if part.is_dir() else path.name
                mode = path.stat().st_mode & 0o111
                hasher.update(f"{name}\0{mode}\0".encode() + path.read_bytes() + b"\0")
        elif isinstance(part, bytes):
            hasher.update(part + b"\0")
        else:
            hasher.update(str(part).encode() + b"\0")
    return hasher.hexdigest()


def recipe(function: Callable[..., object]) -> str:
    """A step's own source is part of its key: changing how it builds rebuilds it."""
    return _RECIPES.get(function.__qualname__) or inspect.getsource(function)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


# ---------------------------------------------------------------- Go


def go_env() -> dict[str, str]:
    return {"GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-modcacherw -trimpath"}


def go_version() -> str:
    return run("go", ["go", "env", "GOVERSION", "GOOS", "GOARCH"], capture=True).replace("\n", " ").strip()


@dataclass(frozen=True)
class GoTool:
    """Binaries from ``go install PACKAGE@VERSION`` (modules the proxy serves)."""

    name: str
    packages: tuple[str, ...]
    ldflags: str = "-s -w"
    tags: str = ""

    def build(self, toolchain: str) -> Path:
        key = digest(self.name, self.packages, self.ldflags, self.tags, toolchain, recipe(GoTool.build))
        directory = CACHE / "go" / f"{self.name}-{key[:16]}"
        if (directory / ".complete").exists():
            log(self.name, f"cached in {directory}")
            return directory
        log(self.name, f"building {' '.join(self.packages)} (go install)")
        partial = directory.with_name(directory.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        # `go install` builds packages of one module at a time.
        for package in self.packages:
            args = ["go", "install", "-v", "-ldflags", self.ldflags]
            if self.tags:
                args += ["-tags", self.tags]
            run(self.name, [*args, package], cwd=CACHE, env={**go_env(), "GOBIN": str(partial)}, heavy=True)
        (partial / ".complete").touch()
        shutil.rmtree(directory, ignore_errors=True)
        partial.rename(directory)
        log(self.name, f"done: {directory}")
        return directory


@dataclass(frozen=True)
class GoModule:
    """Binaries built from a module of this repository (``go build -o NAME ./PACKAGE``)."""

    name: str
    module: Path
    packages: tuple[str, ...]
    ldflags: str = "-s -w"

    def sources(self) -> list[Path]:
        """go.mod, go.sum and the Go files of this module (not of modules nested in it)."""
        nested = {p.parent for p in self.module.rglob("go.mod") if p.parent != self.module}
        files = [p for p in self.module.rglob("*.go") if not any(n in p.parents for n in nested)]
        return sorted([*files, *(p for p in (self.module / "go.mod", self.module / "go.sum") if p.exists())])

    def build(self, toolchain: str) -> Path:
        key = digest(self.name, *self.sources(), self.packages, self.ldflags, toolchain, recipe(GoModule.build))
        directory = CACHE / "go" / f"{self.name}-{key[:16]}"
        if (directory / ".complete").exists():
            log(self.name, f"cached in {directory}")
            return directory
        log(self.name, f"building {', '.join(self.packages)} in {self.module.relative_to(REPO)}")
        partial = directory.with_name(directory.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for package in self.packages:
            out = partial / Path(package).name if package != "." else partial / self.name
            run(self.name, ["go", "build", "-v", "-ldflags", self.ldflags, "-o", out, package],
                cwd=self.module, env=go_env(), heavy=True)
        (partial / ".complete").touch()
        shutil.rmtree(directory, ignore_errors=True)
        partial.rename(directory)
        log(self.name, f"done: {directory}")
        return directory


def kubernetes_version() -> str:
    gomod = json.loads(run("go", ["go", "mod", "edit", "-json"], cwd=REPO / "hack/kube/nodebins", capture=True))
    return str(next(r["Version"] for r in gomod["Require"] if r["Path"] == "k8s.io/kubernetes"))


def kube_ldflags(version: str) -> str:
    """As the dev cluster's build: without them nodes report v0.0.0-master."""
    major, minor = re.fullmatch(r"v(\d+)\.(\d+)\.\d+.*", version).groups()  # type: ignore[union-attr]
    pkg = "k8s.io/component-base/version"
    return (f"-s -w -X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor}"
            f" -X {pkg}.gitTreeState=clean")


def control_plane() -> Path:
    """The dev cluster's multi-call binary (kube-apiserver, -scheduler, -controller-manager, etcd)."""
    from gpuslice.devcluster import binaries  # the repository's own build and cache

    kube = asyncio.run(binaries.describe_build(REPO / "hack/kube"))
    built = asyncio.run(binaries.build(kube, report=lambda line: log("control-plane", line)))
    return built["kube-apiserver"].resolve()


# ---------------------------------------------------------------- Docker


def docker_has(image: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0


def docker_import(step: str, tag: str, tarball: Path, changes: Sequence[str] = ()) -> None:
    args: list[str | Path] = ["docker", "import"]
    for change in changes:
        args += ["--change", change]
    run(step, [*args, "-", tag], stdin=tarball)


def local_cas() -> list[Path]:
    """This machine's own CA certificates (Debian's place for them): some networks reach PyPI
    only through a TLS-inspecting proxy whose CA is among them."""
    return sorted(Path("/usr/local/share/ca-certificates").glob("**/*.crt"))


def debootstrap_image(name: str, packages: str, *, trust_local_cas: bool = False) -> str:
    """A Debian root filesystem from debootstrap, imported as a Docker image.

    With ``trust_local_cas`` it also trusts this machine's local CAs (and tells pip to use the
    system's bundle), so that a ``docker build`` on it reaches PyPI where the host does.
    """
    cas = local_cas() if trust_local_cas else []
    key = digest(name, DEBIAN_SUITE, DEBIAN_MIRROR, packages, *cas, recipe(debootstrap_image))
    tag = f"gpuslice-kind/{name}:{key[:16]}"
    if docker_has(tag):
        log(name, f"cached: {tag}")
        return tag
    log(name, f"debootstrap {DEBIAN_SUITE} with {packages} (a few minutes; Debian's mirror)")
    work = CACHE / "tmp" / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rootfs = work / "rootfs"
    run(name, ["debootstrap", "--variant=minbase", f"--include={packages}", DEBIAN_SUITE, rootfs, DEBIAN_MIRROR],
        heavy=True)
    changes = []
    if cas:
        target = rootfs / "usr/local/share/ca-certificates"
        for ca in cas:
            shutil.copy2(ca, target / f"host-{ca.name}")
        run(name, ["chroot", rootfs, "update-ca-certificates"])
        bundle = "/etc/ssl/certs/ca-certificates.crt"
        changes = [f"ENV PIP_CERT={bundle} SSL_CERT_FILE={bundle} REQUESTS_CA_BUNDLE={bundle}"]
        log(name, f"trusts this machine's CAs: {', '.join(ca.name for ca in cas)}")
    for leftover in ("var/lib/apt/lists", "var/cache/apt/archives", "var/log"):
        for child in (rootfs / leftover).glob("*"):
            if child.is_file():
                child.unlink()
    run(name, ["sh", "-c", f"tar -C '{rootfs}' --numeric-owner -cf '{work}/rootfs.tar' ."], heavy=True)
    docker_import(name, tag, work / "rootfs.tar", changes)
    shutil.rmtree(work, ignore_errors=True)
    log(name, f"done: {tag}")
    return tag


def busybox_image() -> str:
    """A busybox base (Debian's busybox-static) for the tenant image; users get busybox from Docker Hub."""
    policy = run("busybox", ["apt-cache", "policy", "busybox-static"], capture=True)
    version = re.search(r"Candidate:\s*(\S+)", policy)
    if version is None or version.group(1) == "(none)":
        run("busybox", ["apt-get", "update", "-qq"])
        version = re.search(r"Candidate:\s*(\S+)", run("busybox", ["apt-cache", "policy", "busybox-static"],
                                                         capture=True))
    if version is None:
        raise BuildError("busybox: apt knows no busybox-static package")
    key = digest(version.group(1), recipe(busybox_image))
    tag = f"gpuslice-kind/busybox:{key[:16]}"
    if docker_has(tag):
        log("busybox", f"cached: {tag}")
        return tag
    work = CACHE / "tmp" / "busybox"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    run("busybox", ["apt-get", "download", f"busybox-static={version.group(1)}"], cwd=work)
    deb = next(work.glob("busybox-static_*.deb"))
    run("busybox", ["dpkg-deb", "-x", deb, work / "x"])
    binary = work / "x/bin/busybox"
    applets = run("busybox", [binary, "--list"], capture=True).split()
    with tarfile.open(work / "rootfs.tar", "w") as tar:
        tar.add(binary, "bin/busybox")
        for applet in applets:
            if applet != "busybox":
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(link)
        for directory in ("tmp", "etc", "proc", "sys", "dev"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
    docker_import("busybox", tag, work / "rootfs.tar", ['ENV PATH=/bin', 'CMD ["sh"]'])
    shutil.rmtree(work, ignore_errors=True)
    log("busybox", f"done: {tag}")
    return tag


def scratch_tarball(path: Path, files: dict[str, Path], links: dict[str, str]) -> None:
    """A root filesystem of static binaries (and symlinks to them), owned by root."""
    with tarfile.open(path, "w") as tar:
        for directory in ("tmp", "etc", "usr", "usr/local", "usr/local/bin"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        for name, source in files.items():
            info = tar.gettarinfo(str(source), name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = 0o755
            with open(source, "rb") as handle:
                tar.addfile(info, handle)
        for name, target in links.items():
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, target
            tar.addfile(link)


def docker_build(step: str, tag: str, context: Path, dockerfile: str) -> None:
    (context / "Dockerfile").write_text(dockerfile)
    run(step, ["docker", "build", "--quiet", "-t", tag, context], env={"DOCKER_BUILDKIT": "0"})


@dataclass(frozen=True)
class Pieces:
    kind: Path
    containerd: Path
    cni: Path
    crictl: Path
    coredns: Path
    nodebins: Path
    helpers: Path
    control_plane: Path
    node_base: str
    kubernetes: str


def required_images(pieces: Pieces) -> dict[str, str]:
    """Image references kubeadm asks for (its own list), plus kind's sandbox image, by component."""
    listed = run("kubeadm", [pieces.nodebins / "nodebins", "kubeadm", "config", "images", "list",
                             "--kubernetes-version", pieces.kubernetes], capture=True).split()
    config = (kind_module() / "images/base/files/etc/containerd/config.toml").read_text()
    sandbox = re.search(r'sandbox_image\s*=\s*"([^"]+)"', config)
    images: dict[str, str] = {}
    for reference in listed + ([sandbox.group(1)] if sandbox else []):
        component = reference.rsplit("/", 1)[-1].split(":")[0]
        images[reference] = component
    return images


def kind_module() -> Path:
    out = run("go", ["go", "mod", "download", "-json", f"sigs.k8s.io/kind@{KIND_VERSION}"], cwd=CACHE,
              env=go_env(), capture=True)
    return Path(json.loads(out)["Dir"])


def cluster_images(pieces: Pieces) -> tuple[Path, list[str], str]:
    """The images the node preloads, saved in one tarball; and podnet's image reference."""
    images = required_images(pieces)
    # Built pieces enter keys by their cache paths, which carry their own content keys.
    key = digest(sorted(images.items()), str(pieces.control_plane), str(pieces.coredns), str(pieces.nodebins),
                 str(pieces.helpers), pieces.node_base, recipe(cluster_images))
    tarball = CACHE / "images" / f"preload-{key[:16]}.tar"
    podnet = f"gpuslice-kind/podnet:{digest(str(pieces.helpers))[:16]}"
    references = [*images, podnet]
    if tarball.exists() and all(docker_has(r) for r in references):
        log("images", f"cached: {tarball}")
        return tarball, references, podnet
    work = CACHE / "tmp" / "images"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    by_component: dict[str, list[str]] = {}
    for reference, component in images.items():
        by_component.setdefault(component, []).append(reference)

    def scratch(component: str, files: dict[str, Path], links: dict[str, str], changes: list[str]) -> str:
        tag = f"gpuslice-kind/{component}:{key[:16]}"
        scratch_tarball(work / f"{component}.tar", files, links)
        docker_import("images", tag, work / f"{component}.tar",
                      ["ENV PATH=/usr/local/bin:/usr/bin:/bin", *changes])
        return tag

    log("images", f"making {', '.join(images)} and {podnet}")
    control = scratch(
        "control-plane", {"usr/local/bin/kubebins": pieces.control_plane},
        {f"usr/local/bin/{c}": "kubebins"
         for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")}, [])
    made = {
        "kube-apiserver": control, "kube-controller-manager": control, "kube-scheduler": control, "etcd": control,
        "coredns": scratch("coredns", {"coredns": pieces.coredns / "coredns"}, {}, ['ENTRYPOINT ["/coredns"]']),
        "pause": scratch("pause", {"pause": pieces.helpers / "pause"}, {}, ['ENTRYPOINT ["/pause"]']),
    }
    context = work / "kube-proxy"
    context.mkdir()
    shutil.copy2(pieces.nodebins / "nodebins", context / "nodebins")
    proxy = f"gpuslice-kind/kube-proxy:{key[:16]}"
    docker_build("images", proxy, context, (
        f"FROM {pieces.node_base}\n"
        "COPY nodebins /usr/local/bin/nodebins\n"
        "RUN ln -s nodebins /usr/local/bin/kube-proxy\n"))
    made["kube-proxy"] = proxy
    for component, references_of in by_component.items():
        if component not in made:
            raise BuildError(f"kubeadm asks for {references_of}, which this build does not make")
        for reference in references_of:
            run("images", ["docker", "tag", made[component], reference])
    scratch_podnet = scratch("podnet", {"podnet": pieces.helpers / "podnet"}, {}, ['ENTRYPOINT ["/podnet"]'])
    run("images", ["docker", "tag", scratch_podnet, podnet])
    tarball.parent.mkdir(parents=True, exist_ok=True)
    for old in tarball.parent.glob("preload-*.tar"):
        old.unlink()
    log("images", f"saving {len(references)} images to {tarball}")
    run("images", ["docker", "save", "-o", f"{tarball}.partial", *references], heavy=True)
    Path(f"{tarball}.partial").rename(tarball)
    shutil.rmtree(work, ignore_errors=True)
    return tarball, references, podnet


def node_image(pieces: Pieces, preload: Path) -> str:
    """kind's node image, assembled as `kind build node-image` does, from what was built here."""
    files = kind_module() / "images/base/files"
    key = digest(pieces.node_base, files, str(pieces.containerd), str(pieces.cni), str(pieces.crictl),
                 str(pieces.nodebins), preload.name, recipe(node_image))
    tag = f"gpuslice-kind/node:{pieces.kubernetes}-{key[:16]}"
    if docker_has(tag):
        log("node-image", f"cached: {tag}")
        return tag
    log("node-image", f"assembling {tag}")
    context = CACHE / "tmp" / "node-image"
    shutil.rmtree(context, ignore_errors=True)
    shutil.copytree(files, context / "files")
    for path in (context / "files").rglob("*"):
        executable = path.is_dir() or "bin" in path.relative_to(context / "files").parts
        path.chmod(0o755 if executable else 0o644)
    (context / "bin").mkdir()
    for source in (*(pieces.containerd / n for n in ("containerd", "containerd-shim-runc-v2", "ctr")),
                   pieces.crictl / "crictl", pieces.nodebins / "nodebins"):
        shutil.copy2(source, context / "bin" / source.name)
    shutil.copytree(pieces.cni, context / "cni", ignore=shutil.ignore_patterns(".complete"))
    docker_build("node-image", f"{tag}-base", context, f"""\
FROM {pieces.node_base}
COPY files/usr/local/bin/ /usr/local/bin/
COPY files/kind/ /kind/
COPY files/etc/ /etc/
COPY bin/containerd bin/containerd-shim-runc-v2 bin/ctr bin/crictl /usr/local/bin/
COPY bin/nodebins /usr/bin/nodebins
COPY cni/ /opt/cni/bin/
# kind's base Dockerfile, after its package install; runc is Debian's (/usr/sbin/runc).
RUN find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \\
 && rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \\
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \\
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/* \\
 && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \\
 && ln -sf /usr/lib/systemd/systemd /sbin/init \\
 && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \\
 && systemctl mask systemd-binfmt.service \\
 && mkdir -p /etc/kubernetes/manifests \\
 && for c in kubelet kubeadm kubectl; do ln -s nodebins /usr/bin/$c; done \\
 && printf %s {pieces.kubernetes} > /kind/version \\
 && ctr oci spec \\
    | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {{"path": "{HOOK}"}}' \\
    | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json \\
 && containerd --version && runc --version && kubelet --version
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT {ENTRYPOINT}
""")
    # Preload, as kind's builder: containerd in the build container, `ctr images import`, commit.
    name = f"gpuslice-kind-build-{os.getpid()}"
    run("node-image", ["docker", "run", "-d", "--entrypoint=sleep", f"--name={name}",
                       "--security-opt", "seccomp=unconfined", f"{tag}-base", "infinity"])
    try:
        run("node-image", ["docker", "exec", name, "bash", "-c", "nohup containerd >/dev/null 2>&1 &"])
        run("node-image", ["docker", "exec", name, "bash", "-c",
                           "for i in $(seq 1 60); do ctr version >/dev/null 2>&1 && exit 0; sleep 0.5; done;"
                           " echo containerd did not start >&2; exit 1"])
        log("node-image", f"preloading {preload.name} into containerd's k8s.io namespace")
        run("node-image", ["docker", "exec", "-i", name, "ctr", "--namespace=k8s.io", "images", "import",
                           "--label=io.cri-containerd.pinned=pinned", "--all-platforms", "--no-unpack",
                           "--digests", "-"], stdin=preload, heavy=True)
        log("node-image", run("node-image", ["docker", "exec", name, "ctr", "--namespace=k8s.io", "images",
                                             "list", "-q"], capture=True).replace("\n", " "))
        # Stopped before the commit, so its database is closed; it stays a zombie (sleep reaps nothing).
        run("node-image", ["docker", "exec", name, "bash", "-c",
                           "pkill containerd; for i in $(seq 1 60); do"
                           " ps -C containerd -o stat= | grep -qv Z || exit 0; sleep 0.5; done;"
                           " echo containerd did not stop >&2; exit 1"])
        run("node-image", ["docker", "commit", "--change", f"ENTRYPOINT {ENTRYPOINT}", name, tag])
    finally:
        subprocess.run(["docker", "rm", "-f", "-v", name], capture_output=True)
        subprocess.run(["docker", "rmi", f"{tag}-base"], capture_output=True)
    shutil.rmtree(context, ignore_errors=True)
    log("node-image", f"done: {tag}")
    return tag


# ---------------------------------------------------------------- main


def prune_images(keep: set[str]) -> None:
    """Remove the gpuslice-kind/* images of earlier builds (each is hundreds of MB): those whose
    reference is not kept, nor tagged with the current key of the cluster images."""
    listed = run("prune", ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture=True).split()
    stale = [image for image in listed if image.startswith("gpuslice-kind/") and image not in keep
             and image.rsplit(":", 1)[-1] not in keep]
    if stale:
        log("prune", f"removing images of earlier builds: {' '.join(stale)}")
        subprocess.run(["docker", "rmi", *stale], capture_output=True)


def build() -> dict[str, str]:
    CACHE.mkdir(parents=True, exist_ok=True)
    toolchain = go_version()
    kubernetes = kubernetes_version()
    started = time.monotonic()
    tools = {
        "kind": GoTool("kind", (f"sigs.k8s.io/kind@{KIND_VERSION}",)),
        "containerd": GoTool(
            "containerd",
            tuple(f"github.com/containerd/containerd/v2/cmd/{c}@{CONTAINERD_VERSION}"
                  for c in ("containerd", "containerd-shim-runc-v2", "ctr")),
            ldflags=f"-s -w -X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION}",
            tags="no_aufs no_zfs no_btrfs no_devmapper"),
        "cni": GoTool("cni-plugins", tuple(f"github.com/containernetworking/plugins/plugins/{p}@{CNI_PLUGINS_VERSION}"
                                           for p in CNI_PLUGINS)),
        "crictl": GoTool("crictl", (f"sigs.k8s.io/cri-tools/cmd/crictl@{CRI_TOOLS_VERSION}",),
                         ldflags=f"-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version={CRI_TOOLS_VERSION}"),
    }
    # Two lanes: compiling (CPU) and debootstrap (network, disk) overlap.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as lanes:
        def compile_all() -> dict[str, Path]:
            built = {name: tool.build(toolchain) for name, tool in tools.items()}
            built["helpers"] = GoModule("kind-helpers", REPO / "hack/kind", ("./pause", "./podnet")).build(toolchain)
            # CoreDNS with kubeadm's plugins only (hack/kind/coredns/go.mod pins the version).
            built["coredns"] = GoModule("coredns", REPO / "hack/kind/coredns", (".",)).build(toolchain)
            built["nodebins"] = GoModule("nodebins", REPO / "hack/kube/nodebins", (".",),
                                         kube_ldflags(kubernetes)).build(toolchain)
            built["control-plane"] = control_plane()
            built["helm"] = alone("helm")  # the tier installs the chart with it
            return built

        def bases() -> dict[str, str]:
            return {
                "node": debootstrap_image("base-node", NODE_PACKAGES),
                "python": debootstrap_image("base-python", PYTHON_PACKAGES, trust_local_cas=True),
                "busybox": busybox_image(),
            }

        compiled_future, bases_future = lanes.submit(compile_all), lanes.submit(bases)
        compiled, base = compiled_future.result(), bases_future.result()
    pieces = Pieces(
        kind=compiled["kind"], containerd=compiled["containerd"], cni=compiled["cni"], crictl=compiled["crictl"],
        coredns=compiled["coredns"], nodebins=compiled["nodebins"], helpers=compiled["helpers"],
        control_plane=compiled["control-plane"], node_base=base["node"], kubernetes=kubernetes)
    preload, _, podnet = cluster_images(pieces)
    node = node_image(pieces, preload)
    bin_dir = CACHE / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, target in (("kind", pieces.kind / "kind"), ("kubectl", pieces.nodebins / "nodebins"),
                         ("helm", compiled["helm"])):
        link = bin_dir / name
        link.unlink(missing_ok=True)
        link.symlink_to(target)  # nodebins dispatches on the name it is called by
    result = {
        "kubernetes": kubernetes,
        "nodeImage": node,
        "podnetImage": podnet,
        "pythonBase": base["python"],
        "busyboxBase": base["busybox"],
        "binDir": str(bin_dir),
        "kind": str(bin_dir / "kind"),
        "kubectl": str(bin_dir / "kubectl"),
        "helm": str(bin_dir / "helm"),
        "monitoringCrds": str(alone("monitoring-crds")),
    }
    (CACHE / "build.json").write_text(json.dumps(result, indent=2) + "\n")
    prune_images(keep={node, podnet, base["node"], base["python"], base["busybox"], preload.stem.split("-")[-1]})
    log("done", f"in {int(time.monotonic() - started)} s; {CACHE / 'build.json'}")
    return result


def helm() -> Path:
    """Helm, from the Go module proxy, with the version ldflags of its own Makefile (the Kubernetes
    minor of its client-go is what `helm template` and `helm lint` assume without a cluster)."""
    downloaded = json.loads(run("go", ["go", "mod", "download", "-json", f"helm.sh/helm/v3@{HELM_VERSION}"],
                                cwd=CACHE, env=go_env(), capture=True))
    module = json.loads(run("go", ["go", "mod", "edit", "-json", downloaded["GoMod"]], capture=True))
    client = next(r["Version"] for r in module["Require"] if r["Path"] == "k8s.io/client-go")
    minor = client.split(".")[1]  # client-go v0.37.x is Kubernetes 1.37
    flags = [f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
             "-X helm.sh/helm/v3/internal/version.gitTreeState=clean"]
    for package in ("pkg/lint/rules", "pkg/chartutil"):
        flags += [f"-X helm.sh/helm/v3/{package}.k8sVersionMajor=1",
                  f"-X helm.sh/helm/v3/{package}.k8sVersionMinor={minor}"]
    tool = GoTool("helm", (f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}",), ldflags=" ".join(["-s -w", *flags]))
    return tool.build(go_version()) / "helm"


def monitoring_crds() -> Path:
    """The Prometheus Operator's CRDs for ServiceMonitors, PodMonitors and PrometheusRules, from its
    module on the Go module proxy (checked against the checksum database, as every module is),
    cached under the module's own content hash. Tests install them; none is committed."""
    module = f"github.com/prometheus-operator/prometheus-operator@{PROMETHEUS_OPERATOR_VERSION}"
    downloaded = json.loads(run("go", ["go", "mod", "download", "-json", module], cwd=CACHE, env=go_env(),
                                capture=True))
    directory = CACHE / "prometheus-operator" / f"{PROMETHEUS_OPERATOR_VERSION}-{digest(downloaded['Sum'])[:16]}"
    if (directory / ".complete").exists():
        return directory
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in MONITORING_CRDS:
        shutil.copy2(Path(downloaded["Dir"]) / "example/prometheus-operator-crd" / f"monitoring.coreos.com_{name}.yaml",
                     partial / f"{name}.yaml")
    (partial / ".complete").touch()
    shutil.rmtree(directory, ignore_errors=True)
    partial.rename(directory)
    return directory


def kustomize() -> Path:
    """kustomize, at the version kubectl v1.37 embeds (hack/kube/nodebins/go.mod): no Docker needed."""
    gomod = json.loads(run("go", ["go", "mod", "edit", "-json"], cwd=REPO / "hack/kube/nodebins", capture=True))
    version = next(r["Version"] for r in gomod["Require"] if r["Path"] == "sigs.k8s.io/kustomize/kustomize/v5")
    tool = GoTool("kustomize", (f"sigs.k8s.io/kustomize/kustomize/v5@{version}",))
    return tool.build(go_version()) / "kustomize"


def promtool() -> Path:
    """promtool (Prometheus's rule checker and rule unit tests), with Prometheus's own version ldflags."""
    release = prometheus_release()
    tool = GoTool("promtool", (f"github.com/prometheus/prometheus/cmd/promtool@{PROMETHEUS_VERSION}",),
                  ldflags=f"-s -w -X github.com/prometheus/common/version.Version={release}",
                  tags="netgo remove_all_sd")  # no service discovery: promtool needs none for rules
    return tool.build(go_version()) / "promtool"


def prometheus_release() -> str:
    """Prometheus 3.x.y is its Go module's v0.3xx.y (v0.316.0 is 3.16.0)."""
    minor, patch = re.fullmatch(r"v0\.3(\d\d)\.(\d+)", PROMETHEUS_VERSION).groups()  # type: ignore[union-attr]
    return f"3.{int(minor)}.{patch}"


def cosign() -> Path:
    """cosign (Sigstore): signs and verifies the release, key-based (keyless needs the Internet)."""
    pkg = "sigs.k8s.io/release-utils/version"
    tool = GoTool("cosign", (f"github.com/sigstore/cosign/v3/cmd/cosign@{COSIGN_VERSION}",),
                  ldflags=f"-s -w -X {pkg}.gitVersion={COSIGN_VERSION} -X {pkg}.gitTreeState=clean")
    return tool.build(go_version()) / "cosign"


def syft() -> Path:
    """syft (Anchore): the image's SBOM, from its Debian packages and Python distributions."""
    tool = GoTool("syft", (f"github.com/anchore/syft/cmd/syft@{SYFT_VERSION}",),
                  ldflags=f"-s -w -X main.version={SYFT_VERSION}")
    return tool.build(go_version()) / "syft"


def oci() -> Path:
    """hack/oci (go-containerregistry): OCI layouts, pushes, and the kind tier's registry."""
    return GoModule("oci", REPO / "hack/oci", (".",)).build(go_version()) / "oci"


# What `build.py TARGET` builds alone, with Go only (no Docker): the cluster tier's and the release's tools.
ALONE: dict[str, Callable[[], Path]] = {"kustomize": kustomize, "helm": helm, "monitoring-crds": monitoring_crds,
                                        "promtool": promtool, "cosign": cosign, "syft": syft, "oci": oci}

def alone(target: str) -> Path:
    """One of ALONE, under its own lock: the cluster tier's `build.py helm` may run beside a full
    build (.ci/run starts the kind images early), and both would write the same cache slot."""
    with locked(CACHE / f".{target}.lock"):
        return ALONE[target]()


# Read at import: a step's key must not change because this file was edited while it ran.
_RECIPES = {f.__qualname__: inspect.getsource(f) for f in (
    GoTool.build, GoModule.build, debootstrap_image, busybox_image, cluster_images, node_image)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="?", choices=["all", *ALONE], default="all",
                        help="all (default), or only one of these (prints its path; needs Go only)")
    parser.add_argument("--print", dest="print_json", action="store_true", help="print build.json when done")
    args = parser.parse_args()
    tools = ("go",) if args.target in ALONE else ("go", "docker", "debootstrap", "apt-get", "dpkg-deb")
    for tool in tools:
        if shutil.which(tool) is None:
            print(f"kind-build: {tool} is required (hack/kind/docker.sh installs Docker and debootstrap)",
                  file=sys.stderr)
            return 1
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        if args.target in ALONE:
            print(alone(args.target))
            return 0
        with locked(CACHE / ".build.lock"):
            result = build()
    except BuildError as error:
        print(f"kind-build: FAILED: {error}", file=sys.stderr)
        return 1
    if args.print_json:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
