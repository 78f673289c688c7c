#!/usr/bin/env bash
# Make sure a Docker Engine is running here, and that it can run kind's
# privileged nodes. Idempotent; leaves a working Docker alone.
#
#   - installs docker.io and debootstrap from Debian when they are missing;
#   - when no daemon answers: installs the runc shim (hack/kind/runc-shim) as
#     Docker's default runtime in /etc/docker/daemon.json (other keys kept) and
#     starts dockerd in the background (log: /var/log/gpuslice-dockerd.log);
#   - when a daemon answers on a machine whose capability bounding set is not
#     full but without the shim, says so and fails: privileged containers
#     would fail there, and restarting someone's Docker is not ours to do.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

SHIM=/usr/local/libexec/gpuslice/runc-shim
RUNTIME=gpuslice-runc
LOG=/var/log/gpuslice-dockerd.log
say() { echo "docker.sh: $*"; }
die() { echo "docker.sh: $*" >&2; exit 1; }

sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || die "needs root (or sudo) to install and start Docker"
  sudo="sudo"
fi

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
[ -x /usr/bin/python3 ] || missing+=(python3-minimal)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]} from Debian"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  # No init system runs on these machines: keep the packages' scripts from starting services.
  $sudo sh -c 'printf "#!/bin/sh\nexit 101\n" > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d'
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  $sudo rm -f /usr/sbin/policy-rc.d
fi

full_bounding_set() {
  local bnd
  bnd=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
  # Every capability the kernel knows (cap_last_cap) is in the bounding set.
  local last
  last=$(cat /proc/sys/kernel/cap_last_cap)
  [ "$(( 16#$bnd ))" -eq "$(( (1 << (last + 1)) - 1 ))" ]
}

if $sudo docker info >/dev/null 2>&1; then
  runtime=$($sudo docker info --format '{{.DefaultRuntime}}' 2>/dev/null || true)
  if full_bounding_set || [ "$runtime" = "$RUNTIME" ]; then
    say "Docker is running (default runtime: $runtime)"
    exit 0
  fi
  die "Docker is running, but this machine's capability bounding set lacks some capabilities
  and Docker's default runtime is '$runtime': kind's privileged nodes would fail with
  'unable to apply caps'. Stop dockerd and run this script again (it installs a runc shim as
  the default runtime), or register $here/runc-shim in /etc/docker/daemon.json yourself."
fi

say "installing the runc shim at $SHIM"
$sudo install -D -m 0755 /dev/null "$SHIM"
sed '1s|.*|#!/usr/bin/python3|' "$here/runc-shim" | $sudo tee "$SHIM" >/dev/null
$sudo mkdir -p /etc/docker
$sudo /usr/bin/python3 - "$SHIM" "$RUNTIME" <<'EOF'
import json, os, sys
shim, name = sys.argv[1:]
path = "/etc/docker/daemon.json"
config = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
config.setdefault("runtimes", {})[name] = {"path": shim}
config["default-runtime"] = name
with open(path + ".tmp", "w") as handle:
    json.dump(config, handle, indent=2)
os.replace(path + ".tmp", path)
EOF

say "starting dockerd (log: $LOG)"
# setsid: the daemon outlives this script and the shell that ran it.
$sudo setsid sh -c "exec dockerd >>'$LOG' 2>&1" </dev/null &
for _ in $(seq 1 120); do
  if $sudo docker info >/dev/null 2>&1; then
    say "Docker is running (default runtime: $($sudo docker info --format '{{.DefaultRuntime}}'))"
    exit 0
  fi
  sleep 0.5
done
tail -n 30 "$LOG" >&2 || true
die "dockerd did not answer within 60 s; its log is above ($LOG)"
