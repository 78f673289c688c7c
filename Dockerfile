# gpuslice: one image, two entry points (`gpuslice controller`, `gpuslice agent`).
#   make image              (docker build -t gpuslice:<version> ., or buildx for amd64 and arm64: hack/image.sh)
# BASE is any Debian-based image with Python 3.11+ and its venv module; the default is the
# public Python image. gpuslice's own tests build this same file on a base made with
# debootstrap (no registry is reachable there): --build-arg BASE=<that image>.
ARG BASE=python:3.12-slim-bookworm

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
