#!/bin/sh
# The read-only GPU check, from a plain checkout: what gpuslice sees on this machine's NVIDIA GPUs
# (NVML and the NVIDIA Container Toolkit's CDI specs), written to the file given as $1.
#
#   hack/nvidia/device-check.sh /tmp/gpu-check.txt
#
# It never changes a GPU: `gpuslice agent --backend nvml --check` lets through only NVML queries
# (docs/nvidia.md lists them), and the nvidia-smi commands below only list. No cluster, no network:
# gpuslice is installed with `pip install .` into a virtual environment that sees the system's
# packages (nvidia-ml-py and the rest may already be there); without pip's dependencies at hand,
# install them first, or set GPUSLICE_PYTHON to a Python that has gpuslice. Run it as root (NVML's
# MIG placement query needs it). On a GPU Operator node the driver's root /run/nvidia/driver is used
# (NVML and nvidia-smi from there); NVIDIA_DRIVER_ROOT names another.
set -eu
out=${1:?usage: hack/nvidia/device-check.sh OUTPUT_FILE}
here=$(cd "$(dirname "$0")/../.." && pwd)
case $out in /*) ;; *) out="$(pwd)/$out" ;; esac

python=${GPUSLICE_PYTHON:-}
if [ -z "$python" ]; then
  if python3 -c 'import gpuslice.agent.check' 2>/dev/null; then
    python=python3
  else
    # `pip install .` into a venv that sees the system's packages; offline, without its dependencies
    # (the check needs only click, pydantic, structlog, pyyaml and nvidia-ml-py).
    venv=${GPUSLICE_CHECK_VENV:-$here/.venv-device-check}
    [ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
    "$venv/bin/python" -c 'import gpuslice.agent.check' 2>/dev/null \
      || "$venv/bin/python" -m pip install --quiet "$here" 2>/dev/null \
      || "$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation "$here" 2>/dev/null \
      || true
    python=$venv/bin/python
    if ! "$python" -c 'import gpuslice.agent.check' 2>/dev/null; then
      # No pip install possible here (no network, no setuptools): the checkout itself, on the system's packages.
      export PYTHONPATH="$here/operator${PYTHONPATH:+:$PYTHONPATH}"
      python=python3
    fi
  fi
fi
if ! "$python" -c 'import gpuslice.agent.check' 2>"$out"; then
  echo "gpuslice's check cannot start (see $out): it needs click, pydantic, structlog, pyyaml and nvidia-ml-py" >&2
  exit 1
fi

# The GPU Operator's containerised driver keeps libnvidia-ml.so.1 and nvidia-smi only under its root.
driver_root=${NVIDIA_DRIVER_ROOT:-}
if [ -z "$driver_root" ] && [ -d /run/nvidia/driver/usr ]; then
  driver_root=/run/nvidia/driver
fi
smi() {
  if [ -n "$driver_root" ] && [ "$driver_root" != / ] && [ -x "$driver_root/usr/bin/nvidia-smi" ]; then
    chroot "$driver_root" nvidia-smi "$@"
  else
    nvidia-smi "$@"
  fi
}

{
  echo "# gpuslice device check, $(date -u +%Y-%m-%dT%H:%M:%SZ), host $(uname -n), kernel $(uname -r)"
  echo "# checkout: $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown), python: $("$python" -V 2>&1)"
  echo
  echo "# driver root: ${driver_root:-/ (the driver installed on the host)}, user: $(id -u)"
  if [ "$(id -u)" != 0 ]; then
    echo "# NOT ROOT: NVML refuses the MIG placement query to other users (a PROBLEM line below); run with sudo"
  fi
  status=0
  "$python" -m gpuslice agent --backend nvml --check --node device-check \
    ${driver_root:+--nvidia-driver-root "$driver_root"} || status=$?
  echo
  echo "# exit status of the check: $status (0: nothing wrong)"
  if command -v nvidia-smi >/dev/null 2>&1 || [ -x "${driver_root:-/nonexistent}/usr/bin/nvidia-smi" ]; then
    # Listings only, to set the check's figures against nvidia-smi's own.
    for args in "-L" \
        "--query-gpu=index,name,uuid,pci.bus_id,memory.total,mig.mode.current,mig.mode.pending,driver_version,compute_mode,compute_cap --format=csv" \
        "--query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv" \
        "mig -lgip" "mig -lgipp" "mig -lgi" "mig -lci"; do
      echo
      echo "# nvidia-smi $args"
      # shellcheck disable=SC2086
      smi $args 2>&1 || true
    done
  fi
  echo
  # MPS (slicing.isolation: MPS): where the control binary is; it is not run, and no daemon is started.
  echo "# nvidia-cuda-mps-control: $(command -v nvidia-cuda-mps-control || echo 'not on PATH')"
  echo
  echo "# the host's devices (the check, in a container, judges them by /proc/devices and the specs)"
  grep -E ' (nvidia|drm)' /proc/devices 2>&1 || true
  # shellcheck disable=SC2012
  ls -ld /dev/nvidia* /dev/nvidia-caps/* /dev/dri /dev/dri/* /dev/dri/by-path/* /run/nvidia/driver/dev/nvidia* 2>&1 \
    | head -100 || true
  echo
  echo "# CDI specs: each one's driver, toolkit generation and device-node hook"
  for dir in /etc/cdi /var/run/cdi; do
    [ -d "$dir" ] || continue
    ls -l "$dir" 2>&1
    grep -H -o -E -- '--host-driver-version=[0-9.]+|libcuda\.so\.[0-9.]+[0-9]|NVIDIA_CTK_LIBCUDA_DIR|disable-device-node-modification' \
      "$dir"/*.yaml "$dir"/*.json 2>/dev/null | sort -u || true
  done
  for hook in /usr/bin/nvidia-cdi-hook /usr/local/nvidia/toolkit/nvidia-cdi-hook; do
    [ -x "$hook" ] && echo "$hook: $("$hook" --version 2>&1 | head -1)"
  done
  true
} > "$out" 2>&1
echo "device check written to $out"
