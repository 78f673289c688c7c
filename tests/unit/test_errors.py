"""errors.py's tree is the code's: every exception class of the package sits under GpusliceError or
KubeError, or is one of the two internal ones the tree names; every class is named in the tree; and
no module outside kube/ compares an HTTP status code."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import gpuslice
from gpuslice import errors
from gpuslice.errors import GpusliceError
from gpuslice.kube.client import KubeError

INTERNAL = {"ApiError", "_PassPhrase"}
PACKAGE = Path(gpuslice.__file__).parent


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in pkgutil.walk_packages(gpuslice.__path__, "gpuslice."):
        if ".proto" in module.name or module.name.endswith("__main__"):
            continue
        loaded = importlib.import_module(module.name)
        for value in vars(loaded).values():
            if (isinstance(value, type) and issubclass(value, BaseException)
                    and value.__module__ == module.name):
                found[value.__name__] = value
    return found


def test_every_exception_class_is_under_a_root_and_in_the_tree() -> None:
    tree = errors.__doc__ or ""
    for name, kind in _exception_classes().items():
        assert name in INTERNAL or issubclass(kind, (GpusliceError, KubeError)), f"{kind.__module__}.{name}"
        assert re.search(rf"\b{re.escape(name)}\b", tree), f"{kind.__module__}.{name} is not in errors.py's tree"


def test_no_status_code_is_compared_outside_the_client() -> None:
    compared: list[str] = []
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[0] == "kube":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                    isinstance(side, ast.Attribute) and side.attr == "status"
                    and isinstance(other, ast.Constant) and isinstance(other.value, int) and 400 <= other.value < 600
                    for side in (node.left, *node.comparators) for other in (node.left, *node.comparators)):
                compared.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert compared == [], "catch kube.client's class for the status instead"
