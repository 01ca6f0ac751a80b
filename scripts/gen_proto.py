"""Regenerate the Python modules of steprec's .proto files, or check they are current.

    python scripts/gen_proto.py          # rewrite the generated modules
    python scripts/gen_proto.py --check  # exit 1 if the committed ones are stale

Generation uses the grpcio-tools pinned in constraints.txt, so the output is
byte-for-byte reproducible and a stale module is a real difference.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

SOURCE_ROOT = Path(__file__).resolve().parent.parent / "proto" / "src"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[Path]:
    return sorted(SOURCE_ROOT.rglob("*.proto"))


def generate(out_dir: Path) -> None:
    """Run protoc over every .proto under proto/src into out_dir."""
    for proto in proto_files():
        args = [
            "protoc",
            f"-I{SOURCE_ROOT}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(proto.relative_to(SOURCE_ROOT)),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")


def generated_files(root: Path) -> dict[Path, bytes]:
    return {
        path.relative_to(root): path.read_bytes()
        for path in root.rglob("*")
        if path.is_file() and path.name.endswith(GENERATED_SUFFIXES)
    }


def stale_files() -> list[str]:
    """Generated modules that differ from what protoc makes now (or are missing or extra)."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = generated_files(Path(tmp))
    committed = generated_files(SOURCE_ROOT)
    return sorted(str(p) for p in fresh.keys() | committed.keys() if fresh.get(p) != committed.get(p))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report stale generated modules")
    options = parser.parse_args()
    if options.check:
        stale = stale_files()
        for path in stale:
            print(f"stale generated module: proto/src/{path}", file=sys.stderr)
        if stale:
            print("run: python scripts/gen_proto.py", file=sys.stderr)
        return 1 if stale else 0
    generate(SOURCE_ROOT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
