"""Every RPC of the proto has a method on `Client` and on `AsyncClient`, with the same
parameters: an RPC added to the proto without client methods fails here."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from ctxd_client import AsyncClient, Client

PROTO = Path(__file__).resolve().parents[3] / "proto" / "ctxd" / "v1" / "ctxd.proto"

# Where a method's name is not the RPC's in snake_case.
METHOD_OF = {"AppendStream": "append_many"}


def rpcs() -> list[str]:
    names = re.findall(r"^\s*rpc\s+(\w+)\s*\(", PROTO.read_text(), re.MULTILINE)
    assert "Watch" in names and "CreateSession" in names, f"no rpc lines found in {PROTO}"
    return names


def method_name(rpc: str) -> str:
    return METHOD_OF.get(rpc) or re.sub(r"(?<!^)(?=[A-Z])", "_", rpc).lower()


@pytest.mark.parametrize("rpc", rpcs())
def test_both_clients_have_a_method_for_the_rpc(rpc: str) -> None:
    name = method_name(rpc)
    sync, asynchronous = getattr(Client, name, None), getattr(AsyncClient, name, None)
    assert callable(sync), f"Client has no method {name} for rpc {rpc}"
    assert callable(asynchronous), f"AsyncClient has no method {name} for rpc {rpc}"
    assert sync.__doc__ and asynchronous.__doc__, f"{name} is not documented"


def test_the_async_client_has_every_method_of_the_sync_one_with_its_parameters() -> None:
    public = [n for n, m in vars(Client).items() if callable(m) and not n.startswith("_")]
    assert len(public) > len(rpcs())
    for name in public:
        assert hasattr(AsyncClient, name), f"AsyncClient lacks {name}"
        sync = inspect.signature(getattr(Client, name)).parameters
        asynchronous = inspect.signature(getattr(AsyncClient, name)).parameters
        assert list(sync) == list(asynchronous), name
        fn = getattr(AsyncClient, name)
        # Awaitable, or (the streams) an async iterator; `function` is an async context manager.
        if name not in ("export_session", "function"):
            assert inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn), name
