# gpuslice: one image, two entry points (`gpuslice controller`, `gpuslice agent`).
#   make image              (docker build -t gpuslice:<version> ., or buildx for amd64 and arm64: hack/image.sh)
# BASE is any Debian-based image with Python 3.11+ and its venv module; the default is the
# public Python image, pinned by the digest of its multi-platform index (`make pin-base` resolves
# the tag again and rewrites it here). gpuslice's own tests build this same file on a base made with
# debootstrap (no registry is reachable there): --build-arg BASE=<that image>.
ARG BASE=python:3.12-slim-bookworm@sha256:a116514e19457bcb7af7efe9c3dd0b9b71e85b317694e7882a1c52aa15a78134

FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/gpuslice
# The dependencies first, in a layer that changes only with pyproject.toml and the pins. No extras:
# the controller and the agent need neither rich nor kubernetes-asyncio (see pyproject.toml).
COPY pyproject.toml constraints.txt /src/
# (pyproject.toml reads the version from gpuslice/__init__.py: a stand-in keeps this layer version-free.)
RUN mkdir -p /src/operator/gpuslice && echo '__version__ = "0"' > /src/operator/gpuslice/__init__.py \
 && touch /src/README.md \
 && /opt/gpuslice/bin/pip install -c /src/constraints.txt /src \
 && /opt/gpuslice/bin/pip uninstall --yes gpuslice \
 && rm -rf /src/operator /src/build /src/README.md
COPY README.md /src/
COPY operator /src/operator
RUN /opt/gpuslice/bin/pip install --no-deps /src \
 && /opt/gpuslice/bin/pip uninstall --yes pip setuptools \
 && /opt/gpuslice/bin/gpuslice --version

FROM ${BASE}
# A named user: Kopf derives its identity from the user name, and Python's getpass needs an entry.
RUN echo 'gpuslice:x:65532:65532:gpuslice:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'gpuslice:x:65532:' >> /etc/group
COPY --from=build /opt/gpuslice /opt/gpuslice
ENV PATH=/opt/gpuslice/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# The controller runs as this user; the agent's DaemonSet runs it as root (host directories).
USER 65532:65532
ENTRYPOINT ["gpuslice"]
CMD ["--help"]
# OCI labels (hack/image.sh passes the version, the commit and the base's digest; make release
# copies them onto the OCI index and manifests as annotations). Last: they change with each commit.
ARG BASE
ARG BASE_DIGEST=""
ARG VERSION=unreleased
ARG REVISION=unknown
ARG SOURCE=https://github.com/gpuslice/gpuslice
LABEL org.opencontainers.image.title="gpuslice" \
      org.opencontainers.image.description="Per-tenant GPU slicing policy turned into native Kubernetes Dynamic Resource Allocation" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.url="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${BASE}" \
      org.opencontainers.image.base.digest="${BASE_DIGEST}"
