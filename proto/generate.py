"""Regenerate the Python code for the wire contract from ``holdfast.proto``.

Run ``python -m holdfast.proto.generate`` after editing the ``.proto`` (needs the
``test`` extra for ``grpcio-tools``). ``--check`` regenerates into a scratch folder
and exits 1 when the checked-in files differ; ``tests/test_proto_generated.py`` runs
the same check (``stale_files``), so stale generated code fails the tests.

Only the messages are generated (``holdfast_pb2.py`` and its stub): no gRPC service
module, since every peer calls the one method by name (``SESSION_METHOD``) with raw
bytes. The ``.proto`` is staged as ``holdfast/proto/holdfast.proto`` before ``protoc``
runs so the generated code names it by its installed path.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "holdfast.proto"
GENERATED = ("holdfast_pb2.py", "holdfast_pb2.pyi")


def generate(out_dir: Path, proto: Path = PROTO) -> None:
    """Run protoc on ``proto`` and write the generated files into ``out_dir``."""
    from grpc_tools import protoc  # only needed by developers, not at run time

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        staged = root / "src" / "holdfast" / "proto"
        staged.mkdir(parents=True)
        shutil.copy(proto, staged / PROTO.name)
        built = root / "out"
        built.mkdir()
        args = [
            "protoc",
            f"-I{root / 'src'}",
            f"--python_out={built}",
            f"--pyi_out={built}",
            "holdfast/proto/holdfast.proto",
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed on holdfast.proto")
        for name in GENERATED:
            shutil.copy(built / "holdfast" / "proto" / name, out_dir / name)


def stale_files(checked_in: Path = HERE, proto: Path = PROTO) -> list[str]:
    """Names of the generated files in ``checked_in`` that are missing or differ from
    a fresh generation from ``proto``."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh, proto)
        return [
            name
            for name in GENERATED
            if not (checked_in / name).exists()
            or (checked_in / name).read_bytes() != (fresh / name).read_bytes()
        ]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: regenerate, or with ``--check`` report stale files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if generated code is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: proto/{name} (run: python -m holdfast.proto.generate)")
        return 1 if stale else 0
    generate(HERE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
