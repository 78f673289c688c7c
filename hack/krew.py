"""The krew plugin of a release (`make release`): ``kubectl krew install --manifest=gpuslice.krew.yaml
--archive=kubectl-gpuslice-VERSION.tar.gz``, or from a custom index once the release is published.

gpuslice's CLI is Python with compiled dependencies (pydantic-core, cryptography, grpcio), so no one
archive runs everywhere as a binary would. The archive holds the release's wheel and a POSIX
launcher, ``kubectl-gpuslice``, which on first use installs that wheel with its ``cli`` extra into a
virtualenv of its own (``$XDG_DATA_HOME/kubectl-gpuslice/VERSION``: Python 3.11+ and PyPI needed
once) and from then on runs it. The same archive serves Linux and macOS on amd64 and arm64.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

import yaml

PLATFORMS = [("linux", "amd64"), ("linux", "arm64"), ("darwin", "amd64"), ("darwin", "arm64")]
LAUNCHER = """#!/bin/sh
# kubectl gpuslice, as krew installs it: the gpuslice wheel beside this script, installed on first use
# into a virtualenv of its own with its cli extra (Python 3.11+ and PyPI are needed that once).
set -eu
here=$(cd "$(dirname "$0")" && pwd -P)
version=@VERSION@
venv="${XDG_DATA_HOME:-$HOME/.local/share}/kubectl-gpuslice/$version"
if [ ! -e "$venv/.installed" ]; then
  python=${KUBECTL_GPUSLICE_PYTHON:-python3}
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "kubectl gpuslice needs Python 3.11 or newer: $python is not (set KUBECTL_GPUSLICE_PYTHON)" >&2
    exit 1
  fi
  echo "kubectl gpuslice: installing gpuslice $version into $venv (once)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$here/gpuslice-$version-py3-none-any.whl[cli]"
  touch "$venv/.installed"
fi
exec "$venv/bin/kubectl-gpuslice" "$@"
"""


def archive(version: str, wheel: Path, license_file: Path, dist: Path) -> Path:
    """kubectl-gpuslice-VERSION.tar.gz: the launcher, the wheel and the license, byte for byte the
    same for the same inputs (sorted, no owners, no times; gzip without a name or time)."""
    members = {"kubectl-gpuslice": (LAUNCHER.replace("@VERSION@", version).encode(), 0o755),
               wheel.name: (wheel.read_bytes(), 0o644), "LICENSE": (license_file.read_bytes(), 0o644)}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    out = dist / f"kubectl-gpuslice-{version}.tar.gz"
    with open(out, "wb") as handle, gzip.GzipFile(filename="", mode="wb", fileobj=handle, mtime=0) as gz:
        gz.write(raw.getvalue())
    return out


def manifest(version: str, source: str, packed: Path) -> str:
    """The krew Plugin manifest for the archive, as it will be downloaded from the release's page."""
    sha256 = hashlib.sha256(packed.read_bytes()).hexdigest()
    uri = f"{source}/releases/download/v{version}/{packed.name}"
    plugin = {
        "apiVersion": "krew.googlecontainertools.github.com/v1alpha2", "kind": "Plugin",
        "metadata": {"name": "gpuslice"},
        "spec": {
            "version": f"v{version}", "homepage": source,
            "shortDescription": "Why a pod waits for a GPU slice, and each tenant's GPU use",
            "description": ("gpuslice turns per-tenant GPU slicing policy into Kubernetes Dynamic Resource"
                            " Allocation. kubectl gpuslice status shows each policy's devices and tenants, why"
                            " says why a pod waits, plan previews a policy against the cluster.\nNeeds Python"
                            " 3.11 or newer: the first run installs the plugin's Python package into a"
                            " virtualenv of its own (PyPI is needed that once)."),
            "caveats": "The first run of kubectl gpuslice installs its Python package (Python 3.11+, PyPI).",
            "platforms": [{"selector": {"matchLabels": {"os": os_, "arch": arch}}, "uri": uri, "sha256": sha256,
                           "bin": "kubectl-gpuslice",
                           "files": [{"from": "*", "to": "."}]}
                          for os_, arch in PLATFORMS],
        },
    }
    header = "# kubectl krew install --manifest=gpuslice.krew.yaml --archive=" + packed.name + "\n"
    return header + yaml.safe_dump(plugin, sort_keys=False, width=120)
