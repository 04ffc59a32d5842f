"""The checked-in generated code of the wire contract is what ``holdfast.proto``
generates today (``proto/generate.py --check``), and the check does catch staleness."""

from __future__ import annotations

import shutil
from pathlib import Path

from holdfast.proto import generate


def test_checked_in_generated_code_is_fresh() -> None:
    assert generate.stale_files() == [], "run: python -m holdfast.proto.generate"
    assert generate.main(["--check"]) == 0


def test_the_check_fails_when_the_proto_changed_without_regenerating(tmp_path: Path) -> None:
    edited = tmp_path / "holdfast.proto"
    text = generate.PROTO.read_text()
    marker = "message HelloReply {\n"
    assert marker in text
    edited.write_text(text.replace(marker, marker + "  string added_field = 99;\n"))
    assert generate.stale_files(proto=edited) == list(generate.GENERATED)


def test_the_check_fails_when_generated_code_is_missing_or_edited(tmp_path: Path) -> None:
    for name in generate.GENERATED:
        shutil.copy(generate.HERE / name, tmp_path / name)
    assert generate.stale_files(checked_in=tmp_path) == []
    (tmp_path / "holdfast_pb2.pyi").unlink()
    with (tmp_path / "holdfast_pb2.py").open("a") as file:
        file.write("# edited by hand\n")
    assert generate.stale_files(checked_in=tmp_path) == ["holdfast_pb2.py", "holdfast_pb2.pyi"]


def test_no_grpc_service_module_is_generated(tmp_path: Path) -> None:
    generate.generate(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(generate.GENERATED)
    assert not (generate.HERE / "holdfast_pb2_grpc.py").exists()
