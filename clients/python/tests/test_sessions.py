"""Sessions (listing filters, node counts), appends, log, branches and the mapping of errors to
exceptions."""

from __future__ import annotations

import json
import uuid

import grpc
import pytest

import ctxd_client
from ctxd_client import (
    AlreadyExists,
    Client,
    Conflict,
    CtxdError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Session,
    Unavailable,
)


def test_create_session_with_a_key_creates_once(client: Client) -> None:
    key = f"create-{uuid.uuid4()}"
    first = client.create_session({"agent": "a"}, idempotency_key=key)
    again = client.create_session({"agent": "a"}, idempotency_key=key)
    assert again.id == first.id
    with pytest.raises(FailedPrecondition, match="idempotency_key"):
        client.create_session({"agent": "b"}, idempotency_key=key)


def test_create_and_get_session(client: Client) -> None:
    s = client.create_session({"user": "ada", "project": "ctxd"})
    assert uuid.UUID(s.id)
    assert s.metadata == {"user": "ada", "project": "ctxd"}
    assert s.compaction_count == 0
    main = s.branch("main")
    assert main is not None and main.head_id == "" and main.head_hash == ""
    assert s.branch("nope") is None

    appended = client.append_user(s, "hello")
    again = client.get_session(s.id)  # an id works wherever a Session does
    assert again.id == s.id and again.metadata == s.metadata
    head = again.branch("main")
    assert head is not None
    assert (head.head_id, head.head_hash) == (appended.head_id, appended.head_hash)

    assert client.create_session().metadata == {}


def test_list_sessions_filters_by_metadata_and_id_prefix(client: Client) -> None:
    # Only this test's sessions carry `run`, whatever else the shared server holds.
    run = str(uuid.uuid4())
    a1 = client.create_session({"run": run, "team": "a", "shift": "1"})
    a2 = client.create_session({"run": run, "team": "a", "shift": "2"})
    b = client.create_session({"run": run, "team": "b"})

    def listed(id_prefix: str = "", metadata: dict[str, str] | None = None) -> list[str]:
        page = client.list_sessions(1000, id_prefix=id_prefix, metadata=metadata)
        return [s.id for s in page.sessions]

    assert listed(metadata={"run": run}) == [b.id, a2.id, a1.id]
    assert listed(metadata={"run": run, "team": "a"}) == [a2.id, a1.id]
    assert listed(metadata={"run": run, "team": "a", "shift": "1"}) == [a1.id]
    assert listed(metadata={"run": run, "team": "c"}) == []
    # A value matches exactly, not by prefix.
    assert listed(metadata={"run": run[:8]}) == []

    prefix = a1.id[:9]
    by_prefix = listed(prefix)
    assert a1.id in by_prefix and all(i.startswith(prefix) for i in by_prefix)
    # Sessions made in the same minute share their first characters, so the prefix may match
    # more than a1: exactly those of the three that start with it.
    mine = [b.id, a2.id, a1.id]
    assert listed(prefix, {"run": run}) == [i for i in mine if i.startswith(prefix)]
    assert listed(a1.id) == [a1.id]
    assert listed(a1.id.upper()) == [a1.id]
    assert listed(a1.id, {"team": "b"}) == []


def test_a_filtered_listing_pages_through_its_matches_and_no_others(client: Client) -> None:
    run = str(uuid.uuid4())
    matching = []
    for i in range(3):
        matching.append(client.create_session({"run": run, "i": str(i)}).id)
        client.create_session({"run": f"{run}-other", "i": str(i)})
    paged, token = [], ""
    for _ in range(10):
        page = client.list_sessions(page_size=1, page_token=token, metadata={"run": run})
        assert len(page.sessions) <= 1
        paged += [s.id for s in page.sessions]
        token = page.next_page_token
        if not token:
            break
    assert token == "" and paged == matching[::-1]


def test_a_bad_filter_is_invalid_argument_naming_the_field(client: Client) -> None:
    for prefix in ("xyz", "0193f2a1x", "0193-", "0" * 37):
        with pytest.raises(InvalidArgument) as bad:
            client.list_sessions(id_prefix=prefix)
        assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "id_prefix" in bad.value.message, prefix
    with pytest.raises(InvalidArgument) as empty_key:
        client.list_sessions(metadata={"": "x"})
    assert "metadata" in empty_key.value.message


def test_node_count_counts_every_branch_and_the_chains_of_functions(
    client: Client, session: Session
) -> None:
    assert session.node_count == 0 and client.get_session(session).node_count == 0
    written = [
        client.append_user(session, "Find the bug in parse()."),
        client.append_assistant(
            session, tool_calls=[{"id": "call_1", "name": "researcher", "arguments": {}}]
        ),
    ]
    with client.function(session, "call_1", "find the bug") as fn:
        written += [
            fn.append_user("find the bug in parse()"),
            fn.append_assistant(tool_calls=[{"id": "r1", "name": "read_file", "arguments": {}}]),
            fn.append_tool_result("r1", "def parse(): return 1/0"),
            fn.append_assistant("parse() divides by zero."),
        ]
        fn.output = "parse() divides by zero"
    assert fn.result is not None
    client.create_branch(session, "retry", from_node_id=written[0].node_id)
    written += [fn.result, client.append_assistant(session, "I will look myself.", branch="retry")]
    # The function_call node (its id is the function's) is written by `function()` itself.
    nodes = {fn.function_id} | {i for w in written for i in w.node_ids}
    assert len(nodes) == 9

    assert client.get_session(session).node_count == len(nodes)
    [listed] = client.list_sessions(id_prefix=session.id).sessions
    assert listed.id == session.id and listed.node_count == len(nodes)


def test_appends_write_messages_tool_calls_and_results(client: Client, session: Session) -> None:
    user = client.append_user(session, "What is in README.md?")
    assert len(user.node_ids) == 1 and user.node_id == user.head_id
    client.append_assistant(
        session,
        "Let me look.",
        tool_calls=[
            {"id": "c1", "name": "read_file", "arguments": {"path": "README.md"}},
            {"id": "c2", "name": "grep", "arguments": '{"pattern": "ctxd"}'},
            # What an OpenAI model returns can be passed as it is.
            {"id": "c3", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
        ],
    )
    client.append_tool_result(session, "c1", "# ctxd")
    client.append_tool_result(session, "c2", "no such pattern", is_error=True)
    last = client.append_tool_result(session, "c3", "README.md")

    nodes = client.log(session)
    assert [n.kind for n in nodes] == ["tool_result"] * 3 + ["message"] * 2
    assert nodes[0].id == last.node_id and nodes[0].parent_id == nodes[1].id
    assert nodes[-1].parent_id == ""
    assert nodes[-1].content["role"] == "user"
    assert nodes[-1].content["content"] == "What is in README.md?"
    assistant = nodes[-2].content
    assert assistant["role"] == "assistant" and assistant["content"] == "Let me look."
    calls = assistant["tool_calls"]
    assert [c["id"] for c in calls] == ["c1", "c2", "c3"]
    assert [c["name"] for c in calls] == ["read_file", "grep", "ls"]
    assert json.loads(calls[0]["arguments"]) == {"path": "README.md"}
    assert json.loads(calls[1]["arguments"]) == {"pattern": "ctxd"}
    grep = nodes[1].content
    # The server fills the tool's name in from the call.
    assert grep == {"call_id": "c2", "name": "grep", "content": "no such pattern", "is_error": True}


def test_log_follows_pages_up_to_the_limit(client: Client, session: Session) -> None:
    ids = [client.append_user(session, f"m{i}").node_id for i in range(3)]
    ids += [client.append_assistant(session, f"a{i}").node_id for i in range(1)]
    # Consecutive user messages are allowed: nothing is pending.
    assert [n.id for n in client.log(session)] == ids[::-1]
    assert [n.id for n in client.log(session, limit=2)] == ids[::-1][:2]
    assert [n.id for n in client.log(session, node_id=ids[1])] == ids[1::-1]


def test_a_batch_appends_atomically(client: Client, session: Session) -> None:
    appended = client.append(
        session,
        [
            ctxd_client.system_message("You are terse."),
            ctxd_client.user_message("hi"),
            ctxd_client.assistant_message("", [{"id": "c", "name": "t", "arguments": {}}]),
            ctxd_client.tool_result("c", "ok"),
            ctxd_client.assistant_message("hello"),
        ],
    )
    assert len(appended.node_ids) == 5
    # A bad node anywhere in the batch writes nothing.
    with pytest.raises(InvalidArgument):
        client.append(
            session, [ctxd_client.user_message("fine"), ctxd_client.tool_result("nope", "x")]
        )
    assert client.get_session(session).branches[0].head_id == appended.head_id


def test_compare_and_swap_and_idempotency(client: Client, session: Session) -> None:
    first = client.append_user(session, "one", expected_head_id="")
    with pytest.raises(Conflict) as lost:
        client.append_user(session, "two", expected_head_id="")
    assert lost.value.code == grpc.StatusCode.ABORTED
    second = client.append_assistant(session, "two", expected_head_id=first.head_id)

    retry = [client.append_user(session, "three", idempotency_key="k-3") for _ in range(2)]
    assert retry[0] == retry[1]
    assert [n.id for n in client.log(session)] == [retry[0].node_id, second.node_id, first.node_id]


def test_branches_fork_without_copying(client: Client, session: Session) -> None:
    first = client.append_user(session, "Write a poem.")
    client.append_assistant(session, "Roses are red.")
    fork = client.create_branch(session, "retry", from_node_id=first.node_id)
    assert fork.name == "retry" and fork.head_id == first.node_id
    client.append_assistant(session, "Violets are blue.", branch="retry")

    def texts(branch: str) -> list[str]:
        return [m["content"] for m in client.render(session, branch=branch).messages]

    assert texts("main") == ["Write a poem.", "Roses are red."]
    assert texts("retry") == ["Write a poem.", "Violets are blue."]
    assert {b.name for b in client.get_session(session).branches} == {"main", "retry"}

    empty = client.create_branch(session, "scratch")
    assert empty.head_id == ""
    with pytest.raises(AlreadyExists):
        client.create_branch(session, "retry")
    with pytest.raises(InvalidArgument) as bad:
        client.create_branch(session, "../escape")
    assert "name" in bad.value.message


def test_a_reset_moves_a_head_without_touching_nodes(client: Client, session: Session) -> None:
    first = client.append_user(session, "one")
    second = client.append_assistant(session, "two")
    back = client.reset_branch(session, "main", first.node_id, expected_head_id=second.head_id)
    assert back.head_id == first.node_id
    assert [m["content"] for m in client.render(session).messages] == ["one"]
    with pytest.raises(Conflict):
        client.reset_branch(session, "main", None, expected_head_id=second.head_id)
    assert client.reset_branch(session, "main", None).head_id == ""
    assert [n.id for n in client.log(session, node_id=second.node_id)] == [
        second.node_id,
        first.node_id,
    ]


def test_errors_keep_the_servers_status_and_message(client: Client, session: Session) -> None:
    unknown = str(uuid.uuid4())
    with pytest.raises(NotFound) as not_found:
        client.get_session(unknown)
    assert not_found.value.code == grpc.StatusCode.NOT_FOUND
    assert unknown in not_found.value.message
    assert str(not_found.value).startswith("NOT_FOUND: ")

    with pytest.raises(InvalidArgument) as malformed:
        client.get_session("not-a-uuid")
    assert "session_id" in malformed.value.message

    with pytest.raises(InvalidArgument) as not_json:
        client.append_assistant(
            session, tool_calls=[{"id": "c", "name": "t", "arguments": "{not json"}]
        )
    assert "arguments" in not_json.value.message

    client.append_user(session, "go")
    client.append_assistant(session, tool_calls=[{"id": "c1", "name": "t", "arguments": {}}])
    with pytest.raises(FailedPrecondition) as pending:
        client.append_user(session, "too early")
    assert "c1" in pending.value.message

    with pytest.raises(NotFound):
        client.append_user(session, "x", branch="no-such-branch")

    # Every class is a CtxdError, so one except clause catches them all.
    assert all(
        issubclass(cls, CtxdError)
        for cls in (NotFound, InvalidArgument, Conflict, FailedPrecondition, AlreadyExists)
    )


def test_an_unreachable_server_is_unavailable() -> None:
    with Client("127.0.0.1:1", timeout=10) as c, pytest.raises(Unavailable):
        c.create_session()


def test_leaving_the_with_block_closes_the_channel(server: str) -> None:
    with Client(server) as c:
        c.create_session()
    with pytest.raises(ValueError, match="closed channel"):
        c.create_session()


def test_a_channel_passed_in_stays_open(server: str) -> None:
    channel = grpc.insecure_channel(server)
    with Client(channel=channel) as c:
        c.create_session()
    # Still usable through the raw stub: the caller owns it.
    ctxd_client.pb_grpc.ContextStoreStub(channel).CreateSession(
        ctxd_client.pb.CreateSessionRequest()
    )
    channel.close()
