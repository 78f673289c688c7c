#!/usr/bin/env bash
# Regenerates go.mod for the Kubernetes version given (default: the one in
# go.mod), or with --beside, go.1.MINOR.mod: the control plane and pod runner of
# another minor, built from this directory with -modfile and -tags kube1MINOR
# (devcluster/binaries.py; kubelet_1_*.go hold what differs between minors). k8s.io/kubernetes requires its staging modules at v0.0.0 and
# resolves them with local replaces that consumers never see; we read its own
# go.mod from the module proxy and pin every such requirement to the matching
# published v0.MINOR.PATCH tag, so the block is generated, never hand-edited.
set -euo pipefail
cd "$(dirname "$0")"
export GOTOOLCHAIN=local GOFLAGS=-modcacherw
beside=
if [ "${1:-}" = --beside ]; then beside=1; shift; fi
version=${1:-$(go mod edit -json | python3 -c 'import json,sys; print(next(r["Version"] for r in json.load(sys.stdin)["Require"] if r["Path"]=="k8s.io/kubernetes"))')}
staging=v0.${version#v1.}
echo "hack/kube: generating go.mod for k8s.io/kubernetes ${version} (staging modules ${staging})" >&2
upstream=$(go mod download -json "k8s.io/kubernetes@${version}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
goline=$(go mod edit -json "$upstream" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Go"])')
# gen DIR MODULE: one module requiring k8s.io/kubernetes at $version with the staging replaces.
gen() {
  local dir=$1 module=$2
  (
    cd "$dir"
    [ -f go.mod ] || go mod init "$module" >/dev/null 2>&1
    go mod edit -dropreplace=k8s.io/kubernetes -go="$goline" -require="k8s.io/kubernetes@${version}"
    # The main module's godebug line sets runtime defaults; match upstream's build.
    go mod edit -godebug="default=go${goline%.*}"
    for path in $staging_paths; do
      go mod edit -replace="${path}=${path}@${staging}"
    done
    go mod tidy
  )
}
staging_paths=$(go mod edit -json "$upstream" | python3 -c '
import json, sys
for r in json.load(sys.stdin)["Require"]:
    if r["Path"].startswith("k8s.io/") and r["Version"] == "v0.0.0":
        print(r["Path"])')
# The control plane (and pod runner), and the node binaries of the kind image in a module of
# their own: what the node binaries add to go.sum does not move the control plane's cache key.
if [ -n "$beside" ]; then
  # From nothing, so that tidy picks what this version's own graph requires (its etcd, grpc,
  # otel), not the default minor's newer versions.
  minor=${version#v1.}; modfile=go.1.${minor%%.*}.mod
  printf 'module gpuslice.dev/hack/kube\n' > "$modfile"
  rm -f "${modfile%.mod}.sum"
  go mod edit -go="$goline" -require="k8s.io/kubernetes@${version}" -godebug="default=go${goline%.*}" "$modfile"
  for path in $staging_paths; do
    go mod edit -replace="${path}=${path}@${staging}" "$modfile"
  done
  GOFLAGS="$GOFLAGS -modfile=$modfile" go mod tidy
  echo "hack/kube: $modfile now pins $(go mod edit -json "$modfile" | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("Replace") or []))') staging replaces" >&2
  exit 0
fi
gen . gpuslice.dev/hack/kube
gen nodebins gpuslice.dev/hack/kube/nodebins
echo "hack/kube: go.mod now pins $(go mod edit -json | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("Replace") or []))') staging replaces" >&2
