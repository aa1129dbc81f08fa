"""Generate the Python protobuf/gRPC code for the raftcoord.v1 protocol.

Usage: python proto/generate.py [--out DIR]

Compiles every .proto file under proto/raftcoord/protocol/v1 with grpc_tools.protoc
(--python_out, --grpc_python_out, --pyi_out) into DIR (default: the repository
root, so the code lands in raftcoord/protocol/v1/). Generated files of protos that no
longer exist are removed; the output depends only on the .proto files and the
grpcio-tools version.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent
PACKAGE_DIR = Path("raftcoord", "protocol", "v1")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
INIT_TEXT = (
    '"""Generated protobuf/gRPC code for the raftcoord.v1 protocol'
    ' (do not edit; run `make proto`)."""\n'
)


def proto_files() -> list[Path]:
    """All .proto files of the package, sorted so protoc sees a stable order."""
    return sorted((PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))


def is_generated(path: Path) -> bool:
    return path.name.endswith(GENERATED_SUFFIXES)


def run_protoc(files: list[Path], out: Path) -> int:
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--pyi_out={out}",
        *(str(f.relative_to(PROTO_ROOT)) for f in files),
    ]
    return int(protoc.main(args))


def generate(out: Path) -> None:
    """Compile the protos into a scratch directory, then replace the generated
    files under out/raftcoord/protocol/v1 (so a failed run leaves out untouched)."""
    files = proto_files()
    if not files:
        raise SystemExit(f"generate.py: no .proto files under {PROTO_ROOT / PACKAGE_DIR}")
    with tempfile.TemporaryDirectory() as scratch:
        rc = run_protoc(files, Path(scratch))
        if rc != 0:
            raise SystemExit(f"generate.py: protoc failed with exit code {rc} (see errors above)")
        target = out / PACKAGE_DIR
        target.mkdir(parents=True, exist_ok=True)
        for old in target.iterdir():
            if is_generated(old):
                old.unlink()
        for new in sorted((Path(scratch) / PACKAGE_DIR).iterdir()):
            shutil.copyfile(new, target / new.name)
    (target / "__init__.py").write_text(INIT_TEXT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Generate the Python protobuf/gRPC code for the raftcoord.v1 protocol."
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT,
        help="output root; code goes to OUT/raftcoord/protocol/v1 (default: the repository root)",
    )
    args = parser.parse_args(argv)
    generate(args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
