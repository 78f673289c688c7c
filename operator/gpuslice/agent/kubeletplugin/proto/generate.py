"""``make protos``: regenerate the Python code of the ``.proto`` files in this package.

The files are compiled with the source root (``operator/``) as include path, so the
generated gRPC modules import their messages as ``gpuslice.agent.kubeletplugin.proto``
and never as top-level modules. grpcio-tools is pinned in ``pyproject.toml``: the output
names the tool's version, and the freshness test compares it byte for byte.
"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
SOURCE_ROOT = PACKAGE.parents[3]  # operator/
PROTOS = ("dra.proto", "drahealth.proto", "pluginregistration.proto", "podresources.proto")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out: Path) -> list[Path]:
    """Compile every proto of this package into ``out`` (a source root); the files written."""
    from grpc_tools import protoc  # a development tool, not needed at run time

    relative = PACKAGE.relative_to(SOURCE_ROOT)
    for name in PROTOS:
        code = protoc.main(["protoc", f"-I{SOURCE_ROOT}", f"--python_out={out}", f"--pyi_out={out}",
                            f"--grpc_python_out={out}", str(relative / name)])
        if code != 0:
            raise SystemExit(f"protoc failed on {relative / name} (exit {code})")
    return sorted(out / relative / f"{Path(name).stem}{suffix}" for name in PROTOS for suffix in GENERATED_SUFFIXES)


def main() -> None:
    for path in generate(SOURCE_ROOT):
        print(f"wrote {path.relative_to(SOURCE_ROOT.parent)}", file=sys.stderr)


if __name__ == "__main__":
    main()
