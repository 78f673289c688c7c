"""A node of gpuslice's mock ``libnvidia-ml.so.1`` (``hack/nvidia/mocknvml``, go-nvml's DGX mocks
behind NVML's C ABI) under the real pynvml, for the unit tier.

The library is built once (cached by content hash, ``devcluster.nvidia_build``) and loaded into
this process; each node is a fake driver root of its own whose config the library reads through
GPUSLICE_MOCK_NVML_CONFIG at every ``nvmlInit``. What the library records of its callers
(GPUSLICE_MOCK_NVML_TRACE) says which C entry points were called, stubs included.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pynvml

from gpuslice.devcluster.mocknvml import (
    LIB_DIR,
    MockProcess,
    MockState,
    MockStateFile,
    environment,
    make_driver_root,
    node_config,
    state_file,
)
from gpuslice.devcluster.nvidia_build import mock_nvml_library


@functools.cache
def library() -> Path:
    return mock_nvml_library()


@dataclass
class MockNode:
    root: Path
    state: MockStateFile
    trace: Path

    @property
    def config(self) -> dict[str, object]:
        return self.state.config

    def calls(self) -> list[str]:
        """The C entry points called since the node was made (a stub's as ``stub:NAME``)."""
        return self.trace.read_text().split() if self.trace.exists() else []

    def use(self, gpu: int, *processes: MockProcess) -> None:
        def change(state: MockState) -> None:
            state.gpu(self.config, gpu).processes = list(processes)

        self.state.update(change)

    def lose(self, gpu: int) -> None:
        self.state.update(lambda s: setattr(s.gpu(self.config, gpu), "lost", True))

    def post(self, gpu: int, kind: int, data: int) -> None:
        self.state.update(lambda s: s.post(self.config, gpu, kind, data))


@contextlib.contextmanager
def mock_node(root: Path, models: str | list[str], count: int = 2, mig: bool = False,
              node: str = "node-a") -> Iterator[MockNode]:
    """A driver root at ``root`` with ``count`` GPUs of the model (or one GPU per model given), its
    library loaded as pynvml's for the duration."""
    if isinstance(models, str):
        config = node_config(node, models, count, mig)
    else:
        configs = [node_config(node, model, 1, mig) for model in models]
        config = {**configs[0], "gpus": [c["gpus"][0] for c in configs]}  # type: ignore[index]
    make_driver_root(root, config, library())
    trace = root / "trace"
    before_trace = os.environ.get("GPUSLICE_MOCK_NVML_TRACE")
    os.environ["GPUSLICE_MOCK_NVML_TRACE"] = str(trace)
    before = pynvml.nvmlLib
    pynvml.nvmlLib = ctypes.CDLL(str(library()), mode=ctypes.RTLD_GLOBAL)
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        with environment(root):
            yield MockNode(root, state_file(root), trace)
    finally:
        pynvml.nvmlLib = before
        pynvml._nvmlGetFunctionPointer_cache.clear()
        if before_trace is None:
            os.environ.pop("GPUSLICE_MOCK_NVML_TRACE", None)
        else:
            os.environ["GPUSLICE_MOCK_NVML_TRACE"] = before_trace


def lib_dir(root: Path) -> Path:
    return root / LIB_DIR
