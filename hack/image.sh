#!/usr/bin/env bash
# make image: the gpuslice image, for amd64 and arm64 where Docker can build both, else for this
# host's architecture; either way it says what it built.
#
#   IMAGE       the tag (make passes gpuslice:<version>, the version of operator/gpuslice/__init__.py)
#   IMAGE_BASE  the Dockerfile's BASE (default there: python:3.12-slim-bookworm)
#   PLATFORMS   default linux/amd64,linux/arm64 (GH200 and GB200 nodes are arm64)
#   PUSH=1      push the multi-arch image to IMAGE's registry (a manifest list); without it the
#               multi-arch image is written as an OCI archive under dist/, and this host's
#               architecture is loaded into Docker as IMAGE (for docker run, kind load, ...)
#   ARCHIVES=DIR  (make release) one `docker save` tarball per platform built into DIR, named
#               after the platform (linux-amd64.tar); hack/oci makes the OCI layout from them
#   VERSION, REVISION, SOURCE  the image's OCI labels (the Dockerfile's ARGs); the base's digest
#               label comes from BASE (name@sha256:...) or, for a local base, its image ID
#
# Multi-arch needs `docker buildx` with a builder that is not the plain `docker` driver (one
# made by `docker buildx create --use`) and lists every platform asked for (QEMU's binfmt
# handlers, or native nodes). Otherwise this builds with `docker build` for the host only.
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKER=${DOCKER:-docker}
IMAGE=${IMAGE:?IMAGE is required, e.g. IMAGE=registry.example.com/gpuslice:0.1.0}
PLATFORMS=${PLATFORMS:-linux/amd64,linux/arm64}
say() { echo "image: $*"; }

build_args=()
[ -n "${IMAGE_BASE:-}" ] && build_args+=(--build-arg "BASE=$IMAGE_BASE")
for arg in VERSION REVISION SOURCE; do
  [ -n "${!arg:-}" ] && build_args+=(--build-arg "$arg=${!arg}")
done
if [ -n "${IMAGE_BASE:-}" ]; then
  case "$IMAGE_BASE" in
    *@sha256:*) base_digest=${IMAGE_BASE##*@} ;;
    *) base_digest=$($DOCKER image inspect --format '{{.Id}}' "$IMAGE_BASE" 2>/dev/null || true) ;;
  esac
  [ -n "$base_digest" ] && build_args+=(--build-arg "BASE_DIGEST=$base_digest")
elif [ -n "${VERSION:-}" ]; then
  base=$(sed -n 's/^ARG BASE=//p' Dockerfile)
  build_args+=(--build-arg "BASE_DIGEST=${base##*@}")
fi
host="linux/$($DOCKER version --format '{{.Server.Arch}}' 2>/dev/null || uname -m)"

# Why not multi-arch here, or nothing when it can be.
why_not_multiarch() {
  if ! $DOCKER buildx version >/dev/null 2>&1; then
    echo "docker buildx is not installed"; return
  fi
  local inspect driver platforms missing=()
  if ! inspect=$($DOCKER buildx inspect --bootstrap 2>&1); then
    echo "docker buildx inspect failed: $(echo "$inspect" | tail -1)"; return
  fi
  driver=$(echo "$inspect" | sed -n 's/^Driver: *//p' | head -1)
  platforms=$(echo "$inspect" | sed -n 's/^Platforms: *//p' | head -1)
  if [ "$driver" = docker ]; then
    echo "the current buildx builder uses the docker driver, which builds one platform (docker buildx create --use)"
    return
  fi
  for platform in ${PLATFORMS//,/ }; do
    case ", $platforms," in *", $platform,"* | *", $platform*,"*) ;; *) missing+=("$platform") ;; esac
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "the buildx builder cannot build ${missing[*]} (it lists: $platforms; install QEMU's binfmt handlers)"
  fi
}

reason=$(why_not_multiarch)
if [ -n "${ARCHIVES:-}" ]; then
  mkdir -p "$ARCHIVES"
  if [ -z "$reason" ]; then
    for platform in ${PLATFORMS//,/ }; do
      say "building $IMAGE for $platform with buildx into $ARCHIVES/${platform//\//-}.tar"
      $DOCKER buildx build --platform "$platform" "${build_args[@]}" -t "$IMAGE" \
        --output "type=docker,dest=$ARCHIVES/${platform//\//-}.tar" .
    done
    say "built $IMAGE for $PLATFORMS into $ARCHIVES"
  else
    say "building $IMAGE for this host's architecture only ($host): $reason"
    $DOCKER build "${build_args[@]}" -t "$IMAGE" .
    $DOCKER save -o "$ARCHIVES/${host//\//-}.tar" "$IMAGE"
    say "built $IMAGE for $host only (not multi-arch: $reason) into $ARCHIVES"
  fi
  exit 0
fi
if [ -z "$reason" ]; then
  if [ "${PUSH:-}" = 1 ]; then
    say "building $IMAGE for $PLATFORMS with buildx and pushing it"
    $DOCKER buildx build --platform "$PLATFORMS" "${build_args[@]}" -t "$IMAGE" --push .
    say "built and pushed $IMAGE for $PLATFORMS"
  else
    archive="dist/$(echo "$IMAGE" | tr '/:' '__').oci.tar"
    mkdir -p dist
    say "building $IMAGE for $PLATFORMS with buildx into $archive"
    $DOCKER buildx build --platform "$PLATFORMS" "${build_args[@]}" -t "$IMAGE" \
      --output "type=oci,dest=$archive" .
    say "loading this host's architecture ($host) into Docker as $IMAGE"
    $DOCKER buildx build --platform "$host" "${build_args[@]}" -t "$IMAGE" --load .
    say "built $IMAGE for $PLATFORMS: $archive (PUSH=1 pushes it); loaded $host as $IMAGE"
  fi
else
  [ "${PUSH:-}" = 1 ] && say "PUSH=1 without a multi-arch build: pushing $host only"
  say "building $IMAGE for this host's architecture only ($host): $reason"
  $DOCKER build "${build_args[@]}" -t "$IMAGE" .
  [ "${PUSH:-}" = 1 ] && $DOCKER push "$IMAGE"
  say "built $IMAGE for $host only (not multi-arch: $reason)"
fi
