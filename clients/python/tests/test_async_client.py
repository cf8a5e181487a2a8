"""`AsyncClient`: every method once against a live server, awaited (streams as async
iterators), with the same answers and the same `CtxdError` subclasses as `Client`; and its watch
resuming after the connection drops mid-stream."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sqlite3
import uuid
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest
from conftest import Server
from tcp_proxy import TcpProxy

from ctxd_client import (
    AppendBatch,
    AsyncClient,
    AsyncFunctionCall,
    Conflict,
    CtxdError,
    InvalidArgument,
    NotFound,
    Unauthenticated,
    WatchEvent,
    pb,
    user_message,
)

T = TypeVar("T")
BUDGET = {"context_window": 2_500, "output_reserve": 500}
# Only a hang fails at this: every call here answers in milliseconds.
SECONDS = 30


def run(main: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(main, SECONDS))


async def take(events: AsyncIterator[WatchEvent], n: int) -> list[WatchEvent]:
    return [await anext(events) for _ in range(n)]


def node_ids(events: list[WatchEvent]) -> list[str]:
    assert [e.kind for e in events] == ["node"] * len(events), [e.kind for e in events]
    return [e.node.id for e in events if e.node is not None]


async def four_turns(ctxd: AsyncClient, session: Any) -> None:
    for t in range(4):
        await ctxd.append_user(session, f"request number {t}: please look at file {t}")
        await ctxd.append_assistant(
            session, "looking", [{"id": f"call-{t}", "name": "read_file", "arguments": {}}]
        )
        await ctxd.append_tool_result(session, f"call-{t}", f"contents of file {t} " * 150)
        await ctxd.append_assistant(session, f"file {t} is fine")


def test_sessions_appends_reading_and_branches(server: str) -> None:
    async def main() -> None:
        async with AsyncClient(server, timeout=30) as ctxd:
            key = f"async-{uuid.uuid4()}"
            session = await ctxd.create_session({"via": "aio"}, idempotency_key=key)
            assert (await ctxd.create_session({"via": "aio"}, idempotency_key=key)).id == session.id
            assert (await ctxd.list_sessions(page_size=1)).sessions[0].id == session.id
            mine = await ctxd.list_sessions(id_prefix=session.id, metadata={"via": "aio"})
            assert [s.id for s in mine.sessions] == [session.id]

            user = await ctxd.append_user(session, "hi", pinned=True)
            call = await ctxd.append_assistant(
                session, "", [{"id": "t1", "name": "grep", "arguments": {}}]
            )
            result = await ctxd.append_tool_result(session, "t1", "found")
            with pytest.raises(Conflict):
                await ctxd.append(session, [user_message("late")], expected_head_id=user.head_id)

            async def batches() -> AsyncIterator[Any]:
                yield [user_message("one")]
                yield AppendBatch([user_message("two")], idempotency_key=f"b-{uuid.uuid4()}")

            many = await ctxd.append_many(session, batches())
            assert (
                len(many) == 2
                and many[-1].head_id == (await ctxd.get_session(session)).branch("main").head_id
            )  # type: ignore[union-attr]

            log = await ctxd.log(session, limit=10)
            assert [n.id for n in log][2:5] == [result.node_id, call.node_id, user.node_id]
            nodes = await ctxd.get_nodes(session, user.node_id, result.node_id)
            assert [n.kind for n in nodes] == ["message", "tool_result"] and nodes[0].pinned

            assert await ctxd.unpin(session, user.node_id) == []
            assert await ctxd.pin(session, result.node_id) == [result.node_id]

            await ctxd.create_branch(session, "alt", user.node_id)
            moved = await ctxd.reset_branch(session, "alt", None, expected_head_id=user.node_id)
            assert moved.head_id == ""
            assert sorted(b.name for b in await ctxd.list_branches(session)) == ["alt", "main"]
            await ctxd.delete_branch(session, "alt")
            with pytest.raises(NotFound):
                await ctxd.delete_branch(session, "alt")

            gone = await ctxd.delete_session(session)
            assert gone.tombstone.nodes == 5 and not gone.already_deleted
            with pytest.raises(NotFound) as raised:
                await ctxd.get_session(session)
            assert raised.value.message  # the server's words, as with Client

    run(main())


def test_functions_render_recall_and_summaries(server: str, summarizing_server: str) -> None:
    async def main() -> None:
        async with AsyncClient(server, timeout=30) as ctxd:
            session = await ctxd.create_session()
            await ctxd.append_user(session, "find the bug")
            await ctxd.append_assistant(session, "", [{"id": "f1", "name": "agent"}])
            async with ctxd.function(session, "f1", "find it") as fn:
                assert isinstance(fn, AsyncFunctionCall) and fn.function_id
                await fn.append_user("find it")
                await fn.append_assistant("", [{"id": "r1", "name": "read", "arguments": {}}])
                await fn.append_tool_result("r1", "1/0")
                fn.output = "it divides by zero"
            assert fn.result is not None
            (last,) = await ctxd.log(session, limit=1)
            assert last.content["output"] == "it divides by zero"
            # An exception inside closes the call as an error (its pending call answered first)
            # and propagates.
            await ctxd.append_assistant(session, "", [{"id": "f2", "name": "agent"}])
            with pytest.raises(ZeroDivisionError):
                async with ctxd.function(session, "f2", "again") as failing:
                    await failing.append_assistant("", [{"id": "r2", "name": "read"}])
                    1 / 0  # noqa: B018
            (last,) = await ctxd.log(session, limit=1)
            assert (
                last.content["status"] == "error" and "ZeroDivisionError" in last.content["output"]
            )

            session = await ctxd.create_session()
            await four_turns(ctxd, session)
            context = await ctxd.render(session, format="neutral")
            tool = next(m for m in context.messages if m["role"] == "tool")
            node = (await ctxd.get_nodes(session, tool["node_ids"][0]))[0]
            recalled = await ctxd.recall(session, node.hash[:12], max_chars=10)
            assert recalled.truncated and recalled.content == "contents o"
            assert (await ctxd.recall_tool()).name == "recall"
            stats = await ctxd.context_stats(session, BUDGET)
            assert stats.total_tokens == (await ctxd.render(session, BUDGET)).report.total_tokens

            dropped = await ctxd.prepare_compaction(session, BUDGET)
            await ctxd.cancel_compaction(dropped, "not now")
            plan = await ctxd.prepare_compaction(session, BUDGET, format="neutral")
            assert plan.needed and plan.summary_input[0]["role"] == "user"
            outcome = await ctxd.commit_summary(plan, "Four files were read; all fine.", "m")
            assert outcome.applied, outcome
            audit = await ctxd.list_summaries(session)
            assert [e.kind for e in audit.events] == [
                "prepared",
                "cancelled",
                "prepared",
                "committed",
            ]
            assert audit.active is not None and audit.active.summary_id == outcome.summary_id

        async with AsyncClient(summarizing_server, timeout=30) as ctxd:
            session = await ctxd.create_session()
            await four_turns(ctxd, session)
            assert (await ctxd.compact(session, BUDGET)).applied

    run(main())


def test_import_export_and_admin(server: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncClient(server, timeout=30) as ctxd:
            session = await ctxd.create_session()
            await four_turns(ctxd, session)
            data = b"".join([c.data async for c in ctxd.export_session(session)])
            written = await ctxd.export_session_to(session, tmp_path / "s.jsonl")
            assert (tmp_path / "s.jsonl").read_bytes() == data and written.bytes == len(data)
            buffer = io.BytesIO()
            await ctxd.export_session_to(session, buffer, "openai_messages")
            assert len(json.loads(buffer.getvalue())) == 16

            imported = await ctxd.import_session(tmp_path / "s.jsonl")
            assert imported.format == "ctxd_jsonl" and imported.nodes == 16
            head = (await ctxd.get_session(session)).branch("main")
            assert imported.session.branch("main").head_hash == head.head_hash  # type: ignore[union-attr]
            with pytest.raises(InvalidArgument):
                await ctxd.import_session(b"{not json\n", "neutral_jsonl")

            backup = await ctxd.backup_database(str(tmp_path / "backup.db"))
            with contextlib.closing(sqlite3.connect(backup.path)) as db:
                assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert (await ctxd.collect_garbage()).database_bytes > 0

    run(main())


def test_watch_resumes_after_the_connection_drops(server: str) -> None:
    async def main() -> None:
        proxy = TcpProxy(server)
        try:
            async with (
                AsyncClient(server, timeout=30) as ctxd,
                AsyncClient(proxy.address, timeout=30) as watcher,
            ):
                session = await ctxd.create_session()
                async with contextlib.aclosing(watcher.watch(session)) as events:
                    assert (await anext(events)).kind == "started"
                    before = [(await ctxd.append_user(session, "a")).node_id for _ in range(2)]
                    assert node_ids(await take(events, 2)) == before

                    proxy.drop()
                    during = [(await ctxd.append_user(session, "b")).node_id for _ in range(3)]
                    assert node_ids(await take(events, 3)) == during
                    assert proxy.accepted == 2, "the watch did not reconnect"
                    after = (await ctxd.append_user(session, "c")).node_id
                    assert node_ids(await take(events, 1)) == [after]

                    await ctxd.delete_session(session)
                    assert (await anext(events)).kind == "deleted"
                    with pytest.raises(StopAsyncIteration):
                        await anext(events)
        finally:
            proxy.close()

    run(main())


def test_api_keys_and_admin_rpcs(ctxd_bin: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("acme acme-1b6f0c9e4d2a7f35\nops ops-8e2d5a1c7b3f9046 admin\n")
    server = Server(ctxd_bin, tmp_path, "--api-keys-file", str(keys))

    async def main() -> None:
        async with AsyncClient(server.address, api_key="acme-1b6f0c9e4d2a7f35") as acme:
            session = await acme.create_session()
            # The channel's interceptor sends the key with the generated stub's calls too.
            got = await acme.stub.GetSession(pb.GetSessionRequest(session_id=session.id))
            assert got.session_id == session.id
            with pytest.raises(CtxdError) as refused:
                await acme.collect_garbage()
            assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        async with AsyncClient(server.address) as anonymous:
            with pytest.raises(Unauthenticated):
                await anonymous.create_session()
        channel = grpc.aio.insecure_channel(server.address)
        async with AsyncClient(channel=channel, api_key="ops-8e2d5a1c7b3f9046") as admin:
            assert (await admin.collect_garbage()).sessions == 1
        await channel.close()

    try:
        run(main())
    finally:
        server.stop()
