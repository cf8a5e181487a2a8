"""The sub-agent context manager: the call on entering, the result on leaving, error on raise."""

from __future__ import annotations

import sys

import pytest

from ctxd_client import Client, FailedPrecondition, FunctionCall, Session


def delegate(client: Client, session: Session, call_id: str = "call_1") -> None:
    """A user turn whose assistant hands the work to a sub-agent."""
    client.append_user(session, "Find the bug in parse().")
    client.append_assistant(
        session,
        "I will ask a researcher.",
        tool_calls=[{"id": call_id, "name": "researcher", "arguments": {"task": "find the bug"}}],
    )


def test_a_completed_function_writes_its_chain_and_its_result(
    client: Client, session: Session
) -> None:
    delegate(client, session)
    with client.function(session, "call_1", "find the bug") as fn:
        assert isinstance(fn, FunctionCall) and fn.function_id
        fn.append_user("find the bug in parse()")
        fn.append_assistant(tool_calls=[{"id": "r1", "name": "read_file", "arguments": {}}])
        fn.append_tool_result("r1", "def parse(): return 1/0")
        fn.append_assistant("parse() divides by zero.")
        # Inside, the sub-agent's render shows the callers' context above its own chain ...
        inside = client.render(session, function_id=fn.function_id, format="neutral").messages
        assert [m["content"] for m in inside][-1] == "parse() divides by zero."
        assert inside[0]["content"] == "Find the bug in parse()."
        # ... or only its chain.
        own = client.render(session, function_id=fn.function_id, callers="none", format="neutral")
        assert own.messages[0]["content"] == "find the bug in parse()"
        fn.output = "parse() divides by zero"
    assert fn.result is not None

    nodes = client.log(session, limit=3)
    assert nodes[0].kind == "function_result" and nodes[0].id == fn.result.node_id
    assert nodes[0].content["status"] == "completed"
    assert nodes[0].content["output"] == "parse() divides by zero"
    assert nodes[0].content["function_id"] == fn.function_id
    assert nodes[1].kind == "function_call" and nodes[1].id == fn.function_id
    assert nodes[1].content["input"] == "find the bug" and nodes[1].content["expose"] == "io"
    # The chain lives under the function, not on the branch.
    chain = client.log(session, node_id=nodes[0].content["chain_head_id"], limit=4)
    assert {n.function_id for n in chain} == {fn.function_id}

    # expose=io: the caller sees the call and one tool message with the output.
    caller = client.render(session).messages
    assert caller[-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "parse() divides by zero",
    }
    assert caller[-2]["tool_calls"][0]["id"] == "call_1"

    # A closed function takes no more nodes.
    with pytest.raises(FailedPrecondition):
        fn.append_user("too late")
    # And the caller goes on.
    client.append_assistant(session, "Found it: parse() divides by zero.")


def test_an_exception_closes_the_function_as_an_error_and_propagates(
    client: Client, session: Session
) -> None:
    delegate(client, session)
    with pytest.raises(RuntimeError, match="model unavailable"):
        with client.function(session, "call_1", "find the bug") as fn:
            fn.append_user("find the bug")
            raise RuntimeError("model unavailable")
    result = client.log(session, limit=1)[0]
    assert result.kind == "function_result"
    assert result.content["status"] == "error"
    assert result.content["output"] == "RuntimeError: model unavailable"

    rendered = client.render(session, format="anthropic").messages["messages"]
    block = rendered[-1]["content"][-1]
    assert block["type"] == "tool_result" and block["tool_use_id"] == "call_1"
    assert block.get("is_error") is True


def test_an_output_set_before_the_exception_is_kept(client: Client, session: Session) -> None:
    delegate(client, session)
    with pytest.raises(KeyError):
        with client.function(session, "call_1", "find the bug") as fn:
            fn.output = "gave up after two files"
            raise KeyError("x")
    result = client.log(session, limit=1)[0].content
    assert (result["status"], result["output"]) == ("error", "gave up after two files")


def test_a_function_that_fails_mid_tool_call_is_still_closed(
    client: Client, session: Session
) -> None:
    delegate(client, session)
    with pytest.raises(ZeroDivisionError):
        with client.function(session, "call_1", "task") as fn:
            fn.append_assistant(
                tool_calls=[
                    {"id": "t1", "name": "fast_tool", "arguments": {}},
                    {"id": "t2", "name": "crashing_tool", "arguments": {}},
                ]
            )
            fn.append_tool_result("t1", "fine")
            1 / 0  # noqa: B018 (the second tool crashes)
    # The server closes a function only when its own calls are answered: the unanswered one got
    # an error result, so the function could close and the caller can go on.
    result = client.log(session, limit=1)[0].content
    assert (result["status"], result["output"]) == ("error", "ZeroDivisionError: division by zero")
    chain = client.log(session, node_id=result["chain_head_id"], limit=3)
    assert chain[0].content["call_id"] == "t2" and chain[0].content["is_error"]
    assert "ZeroDivisionError" in chain[0].content["content"]
    assert chain[1].content == {
        "call_id": "t1",
        "name": "fast_tool",
        "content": "fine",
        "is_error": False,
    }
    client.append_assistant(session, "The researcher failed.")


def test_a_function_left_with_pending_calls_on_a_clean_exit_raises(
    client: Client, session: Session
) -> None:
    delegate(client, session)
    with pytest.raises(FailedPrecondition, match="t1"):
        with client.function(session, "call_1", "task") as fn:
            fn.append_assistant(tool_calls=[{"id": "t1", "name": "tool", "arguments": {}}])
    # Nothing was swallowed: the host can still answer and close it itself.
    fn.append_tool_result("t1", "late")
    fn.__exit__(None, None, None)
    assert client.log(session, limit=1)[0].kind == "function_result"


def test_a_failure_to_close_never_hides_the_sub_agents_exception(
    client: Client, session: Session
) -> None:
    delegate(client, session)
    with pytest.raises(LookupError) as raised:
        with client.function(session, "call_1", "task") as fn:
            # Close it behind the context manager's back, so its own close fails.
            fn.__exit__(None, None, None)
            raise LookupError("the real problem")
    assert str(raised.value) == "the real problem"
    if sys.version_info >= (3, 11):  # exception notes
        assert any("could not be closed" in note for note in raised.value.__notes__)


def test_expose_full_and_none(client: Client, session: Session) -> None:
    for expose in ("full", "none"):
        call_id = f"call_{expose}"
        delegate(client, session, call_id)
        with client.function(session, call_id, "task", expose=expose) as fn:
            fn.append_user(f"inner {expose}")
            fn.append_assistant(f"inner answer {expose}")
            fn.output = f"output {expose}"
        client.append_assistant(session, f"done {expose}")

    messages = client.render(session, format="neutral").messages
    texts = [m["content"] for m in messages]
    # full: the call's result, then the function's own chain, marked with its id.
    full_at = texts.index("output full")
    assert texts[full_at + 1 : full_at + 3] == ["inner full", "inner answer full"]
    assert messages[full_at + 1]["function_id"]
    # none: neither the chain, nor the result, nor the call.
    assert "output none" not in texts and "inner none" not in texts
    calls = [c["id"] for m in messages for c in m.get("tool_calls", [])]
    assert "call_full" in calls and "call_none" not in calls

    with pytest.raises(ValueError, match="expose"):
        client.function(session, "x", "y", expose="some")  # type: ignore[arg-type]


def test_functions_nest(client: Client, session: Session) -> None:
    delegate(client, session)
    with client.function(session, "call_1", "outer task") as outer:
        outer.append_user("outer task")
        outer.append_assistant(tool_calls=[{"id": "inner_1", "name": "helper", "arguments": {}}])
        with outer.function("inner_1", "inner task") as inner:
            inner.append_user("inner task")
            inner.append_assistant("inner done")
            inner.output = "inner result"
        outer.append_assistant("outer done")
        outer.output = "outer result"
    chain = client.render(session, function_id=outer.function_id, callers="none", format="neutral")
    assert [m["content"] for m in chain.messages][-2:] == ["inner result", "outer done"]
    assert client.log(session, limit=1)[0].content["output"] == "outer result"
