"""The committed stubs must be exactly what generate.sh makes of the current proto."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]
COMMITTED = HERE / "src" / "ctxd_client" / "_proto"
GENERATED = ("ctxd_pb2.py", "ctxd_pb2.pyi", "ctxd_pb2_grpc.py")


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    pytest.importorskip(
        "grpc_tools", reason="grpcio-tools is missing: pip install -e 'clients/python[test]'"
    )
    subprocess.run(
        ["bash", HERE / "generate.sh", tmp_path],
        env={**os.environ, "PYTHON": sys.executable},
        check=True,
    )
    stale = [
        name
        for name in GENERATED
        if (tmp_path / name).read_bytes() != (COMMITTED / name).read_bytes()
    ]
    assert not stale, (
        f"{', '.join(stale)} differ from what proto/ctxd/v1/ctxd.proto generates: "
        "run clients/python/generate.sh (with the grpcio-tools version pinned in pyproject.toml)"
    )
