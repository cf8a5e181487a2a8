"""`Client.append_many`: many appends over one AppendStream, each checked as `append` checks one,
the first refused ending the stream with what came before it stored."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import RpcRecorder, Server

from ctxd_client import (
    AppendBatch,
    Client,
    Conflict,
    CtxdError,
    FailedPrecondition,
    InvalidArgument,
    Session,
    Unavailable,
    assistant_message,
    pb,
    tool_result,
    user_message,
)


def conversation(turns: int) -> Iterator[list[pb.NodeInput]]:
    """One batch a message: user, assistant calling a tool, its result, assistant; the call and
    its result in separate batches, as an import of a provider log would send them."""
    for t in range(turns):
        yield [user_message(f"question {t}")]
        yield [assistant_message("", [{"id": f"c{t}", "name": "read_file", "arguments": {}}])]
        yield [tool_result(f"c{t}", f"contents {t}")]
        yield [assistant_message(f"answer {t}")]


def texts(client: Client, session: Session) -> list[str]:
    return [n.content.get("content", "") for n in reversed(client.log(session, limit=100_000))]


def test_every_batch_is_written_in_order(client: Client, session: Session) -> None:
    # More batches than one transaction of the server takes (256), from a generator.
    turns = 200
    written = client.append_many(session, conversation(turns))
    assert len(written) == 4 * turns

    nodes = list(reversed(client.log(session, limit=100_000)))
    assert [a.node_ids for a in written] == [[n.id] for n in nodes]
    # Each answer is the head right after its batch, and each batch follows the one before.
    assert [a.head_id for a in written] == [n.id for n in nodes]
    assert [a.head_hash for a in written] == [n.hash for n in nodes]
    assert [n.parent_id for n in nodes] == ["", *(n.id for n in nodes[:-1])]
    assert texts(client, session)[:4] == ["question 0", "", "contents 0", "answer 0"]
    assert nodes[2].content["call_id"] == "c0" and nodes[2].content["name"] == "read_file"
    head = client.get_session(session).branch("main")
    assert head is not None and head.head_id == written[-1].head_id


def test_one_call_is_one_stream(recorded: tuple[Client, RpcRecorder]) -> None:
    client, rpcs = recorded
    session = client.create_session()
    assert len(client.append_many(session, conversation(5))) == 20
    assert rpcs.writes() == ["AppendStream"]


def test_a_batch_of_several_nodes_is_one_append(client: Client, session: Session) -> None:
    written = client.append_many(
        session,
        [
            [user_message("hi"), assistant_message("", [{"id": "c", "name": "t"}])],
            [tool_result("c", "ok"), assistant_message("done")],
        ],
    )
    assert [len(a.node_ids) for a in written] == [2, 2]
    nodes = [n.id for n in reversed(client.log(session))]
    assert nodes == written[0].node_ids + written[1].node_ids


def test_a_refused_batch_raises_and_nothing_after_it_is_stored(
    client: Client, session: Session
) -> None:
    sent: list[int] = []

    def batches() -> Iterator[list[pb.NodeInput]]:
        yield [user_message("one")]
        yield [assistant_message("", [{"id": "c1", "name": "t"}])]
        yield [tool_result("c1", "ok")]
        yield [assistant_message("two")]
        yield [tool_result("nope", "answers no call")]  # requests[4]: refused
        for i in range(20):
            sent.append(i)
            yield [user_message(f"after {i}")]

    with pytest.raises(InvalidArgument) as refused:
        client.append_many(session, batches())
    err = refused.value
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.message.startswith("requests[4].nodes[0].tool_result.call_id: "), err.message
    assert "nope" in err.message
    assert str(err).startswith("INVALID_ARGUMENT: requests[4]")
    # The four before it were acknowledged, and are exactly what the branch holds.
    assert len(err.acknowledged) == 4
    nodes = list(reversed(client.log(session)))
    assert [n.id for n in nodes] == [a.node_id for a in err.acknowledged]
    assert texts(client, session) == ["one", "", "ok", "two"]

    # A pairing rule broken in the middle: a user message while a call is pending.
    with pytest.raises(FailedPrecondition) as pending:
        client.append_many(
            session,
            [
                [user_message("three")],
                [assistant_message("", [{"id": "c2", "name": "t"}])],
                [user_message("too early")],
                [tool_result("c2", "never written")],
            ],
        )
    assert pending.value.message.startswith("requests[2]"), pending.value.message
    assert "c2" in pending.value.message
    assert len(pending.value.acknowledged) == 2
    head = client.get_session(session).branch("main")
    assert head is not None and head.head_id == pending.value.acknowledged[-1].head_id


def test_compare_and_swap_per_batch(client: Client, session: Session) -> None:
    first = client.append_user(session, "one")
    written = client.append_many(
        session,
        [
            AppendBatch([assistant_message("two")], expected_head_id=first.head_id),
            [user_message("three")],
        ],
    )
    # Each head is checked as the stream finds it, after the batches before it: a stale one
    # loses, and the batch before it stays.
    with pytest.raises(Conflict) as lost:
        client.append_many(
            session,
            [
                AppendBatch([assistant_message("four")], expected_head_id=written[-1].head_id),
                AppendBatch([user_message("five")], expected_head_id=written[-1].head_id),
                [assistant_message("six")],
            ],
        )
    assert lost.value.code == grpc.StatusCode.ABORTED
    assert lost.value.message.startswith("requests[1]"), lost.value.message
    assert len(lost.value.acknowledged) == 1
    assert texts(client, session) == ["one", "two", "three", "four"]


def test_idempotency_keys_make_a_repeated_stream_write_nothing(
    client: Client, session: Session
) -> None:
    key = uuid.uuid4()

    def batches() -> list[AppendBatch]:
        return [
            AppendBatch(nodes, idempotency_key=f"{key}/{i}")
            for i, nodes in enumerate(conversation(3))
        ]

    first = client.append_many(session, batches())
    again = client.append_many(session, batches())
    assert again == first
    assert len(client.log(session)) == 12
    # A stream cut short and sent again whole: the keyed batches already stored are answered as
    # before, the rest written once.
    half = batches()[:5]
    other = client.create_session()
    cut = client.append_many(other, half)
    whole = client.append_many(other, batches())
    assert whole[:5] == cut
    assert texts(client, other) == texts(client, session)


def test_pinned_and_function_targets(client: Client, session: Session) -> None:
    written = client.append_many(
        session,
        [
            AppendBatch([user_message("keep this")], pinned=True),
            [assistant_message("", [{"id": "call_1", "name": "researcher"}])],
        ],
    )
    assert [n.id for n in client.log(session) if n.pinned] == [written[0].node_id]

    with client.function(session, "call_1", "find the bug") as fn:
        chain = client.append_many(
            session,
            [[user_message("find the bug")], [assistant_message("in parse()")]],
            function_id=fn.function_id,
        )
        fn.output = "in parse()"
    own = client.render(session, function_id=fn.function_id, callers="none", format="neutral")
    assert [m["content"] for m in own.messages] == ["find the bug", "in parse()"]
    in_chain = client.log(session, node_id=chain[-1].head_id, limit=3)
    assert [n.function_id for n in in_chain] == [fn.function_id] * 2 + [""]
    assert in_chain[-1].id == fn.function_id  # the chain hangs from the function_call


def test_batches_are_sent_as_the_generator_yields_them(client: Client, session: Session) -> None:
    def batches() -> Iterator[list[pb.NodeInput]]:
        yield [user_message("first")]
        # Stored while the generator is still running: append_many does not collect the
        # batches before sending them (else this would wait out its deadline).
        deadline = time.monotonic() + 20
        while not client.get_session(session).branches[0].head_id:
            assert time.monotonic() < deadline, "the first batch was not written in time"
            time.sleep(0.01)
        yield [assistant_message("second")]

    assert len(client.append_many(session, batches())) == 2
    assert texts(client, session) == ["first", "second"]


def test_an_exception_of_the_batches_ends_the_stream_after_what_they_yielded(
    client: Client, session: Session
) -> None:
    def batches() -> Iterator[list[pb.NodeInput]]:
        yield [user_message("one")]
        yield [assistant_message("two")]
        raise RuntimeError("the source file is truncated")

    with pytest.raises(RuntimeError, match="truncated"):
        client.append_many(session, batches())
    assert texts(client, session) == ["one", "two"]

    # A lone node where a batch belongs says so, rather than failing inside protobuf.
    with pytest.raises(TypeError, match="list of nodes"):
        client.append_many(session, [user_message("not in a list")])  # type: ignore[list-item]
    assert texts(client, session) == ["one", "two"]
    assert client.append_many(session, []) == []


def test_errors_of_an_unknown_session_carry_nothing_acknowledged(client: Client) -> None:
    unknown = str(uuid.uuid4())
    with pytest.raises(CtxdError) as missing:
        client.append_many(unknown, [[user_message("x")]])
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    assert missing.value.message.startswith("requests[0]"), missing.value.message
    assert missing.value.acknowledged == []


def test_a_server_shutting_down_ends_an_idle_stream_as_unavailable(
    ctxd_bin: Path, tmp_path: Path
) -> None:
    server = Server(ctxd_bin, tmp_path)
    stopped = threading.Event()
    failures: list[BaseException] = []
    try:
        with Client(server.address, timeout=30) as client:
            session = client.create_session()

            def batches() -> Iterator[list[pb.NodeInput]]:
                yield [user_message("before the shutdown")]
                stopped.wait(30)  # the stream stays open, idle, meanwhile
                yield [user_message("never sent")]

            def stop_once_written() -> None:
                try:
                    while not client.get_session(session).branches[0].head_id:
                        time.sleep(0.01)
                    server.stop()  # checks that the server exits cleanly, the stream open
                except BaseException as e:
                    failures.append(e)
                finally:
                    stopped.set()

            stopper = threading.Thread(target=stop_once_written)
            stopper.start()
            try:
                with pytest.raises(Unavailable) as shutdown:
                    client.append_many(session, batches())
            finally:
                stopper.join(60)
                stopped.set()
    finally:
        if server.process.poll() is None:
            server.stop()
    assert not stopper.is_alive() and not failures, failures
    assert len(shutdown.value.acknowledged) == 1
    assert "shutting down" in shutdown.value.message
