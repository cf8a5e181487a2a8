"""`ctxd_client.openai_agents.CtxdSession` against a live server: the SDK's session contract
(order, limit, pop, clear), exact round trips of every kind of item, how the items render, the
rendered mode, `Runner.run` across two processes with a fake model, and bad addresses and keys."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from agents import Runner, set_tracing_disabled
from agents_fake import FakeModel, agent
from conftest import RpcRecorder, Server
from test_security import KEY, write_keys

from ctxd_client import Client, Unauthenticated, Unavailable
from ctxd_client.openai_agents import MARKER, CtxdSession

HERE = Path(__file__).resolve().parent


def new_session(client: Client, **kwargs) -> CtxdSession:
    return CtxdSession(f"sdk-{uuid.uuid4()}", client=client, **kwargs)


def run(coro):
    return asyncio.run(coro)


USER = {"role": "user", "content": "What is in README.md?"}
USER_PARTS = {
    "type": "message",
    "role": "user",
    "content": [
        {"type": "input_text", "text": "Describe this"},
        {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"},
    ],
}
REASONING = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "Need to read the file."}],
    "encrypted_content": "gAAAA...",
}
ASSISTANT = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "Let me read it.", "annotations": []}],
}


def call(n: int, name: str = "read_file") -> dict:
    return {
        "id": f"fc_{n}",
        "type": "function_call",
        "call_id": f"call_{n}",
        "name": name,
        "arguments": json.dumps({"path": f"f{n}.txt"}),
        "status": "completed",
    }


def output(n: int) -> dict:
    return {"type": "function_call_output", "call_id": f"call_{n}", "output": f"contents {n}"}


# ---------------------------------------------------------------- the Session contract


def test_items_come_back_in_order_and_limit_takes_the_latest(client: Client) -> None:
    s = new_session(client)
    assert run(s.get_items()) == []
    first = [USER, ASSISTANT]
    second = [{"role": "user", "content": "and then?"}, {"role": "assistant", "content": "done"}]
    run(s.add_items(first))
    run(s.add_items(second))
    run(s.add_items([]))
    assert run(s.get_items()) == first + second
    assert run(s.get_items(limit=3)) == (first + second)[-3:]
    assert run(s.get_items(limit=1)) == second[-1:]
    assert run(s.get_items(limit=10)) == first + second
    assert run(s.get_items(limit=0)) == []


def test_pop_returns_and_removes_the_latest_then_none(client: Client) -> None:
    s = new_session(client)
    assert run(s.pop_item()) is None
    items = [USER, ASSISTANT, {"role": "user", "content": "thanks"}]
    run(s.add_items(items))
    assert run(s.pop_item()) == items[2]
    assert run(s.get_items()) == items[:2]
    # Adding after a pop continues from the new head.
    run(s.add_items([{"role": "user", "content": "instead"}]))
    assert run(s.get_items()) == items[:2] + [{"role": "user", "content": "instead"}]
    assert run(s.pop_item())["content"] == "instead"
    assert run(s.pop_item()) == ASSISTANT
    assert run(s.pop_item()) == USER
    assert run(s.pop_item()) is None
    assert run(s.get_items()) == []


def test_clear_empties_the_branch_but_keeps_every_node(client: Client) -> None:
    s = new_session(client)
    run(s.add_items([USER, ASSISTANT]))
    head = client.get_session(s.ctxd_session_id).branch("main").head_id
    run(s.clear_session())
    assert run(s.get_items()) == []
    assert run(s.pop_item()) is None
    run(s.add_items([{"role": "user", "content": "fresh start"}]))
    assert run(s.get_items()) == [{"role": "user", "content": "fresh start"}]
    # Nothing was deleted: the old head is still a node, and its history is intact.
    old = client.log(s.ctxd_session_id, node_id=head)
    assert [n.kind for n in old] == ["message", "message"]


def test_one_sdk_id_is_one_ctxd_session_across_clients(server: str) -> None:
    sdk_id = f"shared-{uuid.uuid4()}"
    with Client(server, timeout=30) as a, Client(server, timeout=30) as b:
        one, two = CtxdSession(sdk_id, client=a), CtxdSession(sdk_id, client=b)
        run(one.add_items([USER]))
        assert run(two.get_items()) == [USER]
        assert one.ctxd_session_id == two.ctxd_session_id
        stored = a.get_session(one.ctxd_session_id)
        assert stored.metadata == {"openai_agents.session_id": sdk_id}
        assert CtxdSession(f"other-{uuid.uuid4()}", client=a).ctxd_session_id != two.ctxd_session_id


# ---------------------------------------------------------------- exact round trips


def test_every_kind_of_item_round_trips_exactly(client: Client) -> None:
    s = new_session(client)
    items = [
        {"role": "system", "content": "Be terse."},
        {"role": "developer", "content": "Use tools."},
        USER,
        USER_PARTS,
        REASONING,
        ASSISTANT,
        call(1),
        output(1),
        # Parallel calls and their outputs, answered out of order.
        call(2),
        call(3),
        output(3),
        output(2),
        {"type": "function_call_output", "call_id": "call_9", "output": "no call made this"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "x"}},
        {
            "type": "function_call_output",
            "call_id": "call_x",
            "output": [{"type": "input_text", "text": "a list output"}],
        },
        {"role": "assistant", "content": ""},
        {"role": "user", "content": MARKER + "looks like a marker"},
        {**call(4), "arguments": "not json"},
        output(4),
        {"role": "assistant", "content": "ünïcødé ✓"},
    ]
    run(s.add_items(items))
    assert run(s.get_items()) == items
    # Popping walks back through every item exactly, parallel calls included.
    for n in range(len(items), 0, -1):
        assert run(s.get_items(limit=2)) == items[max(0, n - 2) : n]
        assert run(s.pop_item()) == items[n - 1]
    assert run(s.get_items()) == []


def test_calls_and_outputs_in_separate_writes(client: Client) -> None:
    s = new_session(client)
    run(s.add_items([USER, call(1), call(2)]))
    run(s.add_items([output(1)]))
    run(s.add_items([output(2), ASSISTANT]))
    expected = [USER, call(1), call(2), output(1), output(2), ASSISTANT]
    assert run(s.get_items()) == expected
    # Rendered as a paired tool exchange.
    messages = client.render(s.ctxd_session_id).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["call_1", "call_2"]


def test_one_add_of_many_items_is_one_append(recorded: tuple[Client, RpcRecorder]) -> None:
    client, rpcs = recorded
    s = new_session(client)
    run(s.add_items([USER]))
    rpcs.methods.clear()
    # Parallel calls, their outputs and a reply: one unary Append, all or nothing, rather than
    # one per item or group (or a stream, which may split into transactions) ...
    items = [REASONING, call(1), call(2), output(1), output(2), ASSISTANT]
    run(s.add_items(items))
    assert rpcs.writes() == ["Append"]
    # ... and so is the rewrite of a call group left open, written again before the new items.
    run(s.add_items([call(3)]))
    rpcs.methods.clear()
    run(s.add_items([{"role": "user", "content": "never mind"}, ASSISTANT]))
    assert rpcs.writes() == ["Append"]
    assert "ResetBranch" in rpcs.methods
    assert run(s.get_items()) == [
        USER,
        *items,
        call(3),
        {"role": "user", "content": "never mind"},
        ASSISTANT,
    ]


def test_a_call_left_without_output_does_not_block_the_conversation(client: Client) -> None:
    s = new_session(client)
    run(s.add_items([USER, call(1)]))
    # The run was interrupted: the next input comes without the call's output.
    follow_up = {"role": "user", "content": "never mind"}
    run(s.add_items([follow_up]))
    assert run(s.get_items()) == [USER, call(1), follow_up]
    run(s.add_items([output(1)]))  # a late output is kept too
    assert run(s.get_items()) == [USER, call(1), follow_up, output(1)]
    assert run(s.pop_item()) == output(1)
    assert run(s.pop_item()) == follow_up
    assert run(s.get_items()) == [USER, call(1)]


def test_pop_inside_parallel_calls_keeps_the_rest(client: Client) -> None:
    s = new_session(client)
    items = [USER, call(1), call(2), output(1), output(2)]
    run(s.add_items(items))
    assert run(s.pop_item()) == output(2)
    run(s.add_items([output(2)]))
    assert run(s.get_items()) == items
    for _ in range(3):
        run(s.pop_item())
    assert run(s.get_items()) == [USER, call(1)]
    run(s.add_items([output(1), ASSISTANT]))
    assert run(s.get_items()) == [USER, call(1), output(1), ASSISTANT]


# ---------------------------------------------------------------- rendering


def test_items_render_as_messages_tool_calls_and_results(client: Client) -> None:
    s = new_session(client)
    run(s.add_items([USER, REASONING, ASSISTANT, call(1), output(1)]))
    openai = client.render(s.ctxd_session_id).messages
    assert [m["role"] for m in openai] == ["user", "assistant", "assistant", "assistant", "tool"]
    assert openai[0] == {"role": "user", "content": USER["content"]}  # no marker needed
    assert openai[1]["content"].startswith(MARKER)  # reasoning: kept verbatim, as text
    assert openai[2]["content"].startswith("Let me read it.\n" + MARKER)
    assert openai[3]["tool_calls"][0]["function"] == {
        "name": "read_file",
        "arguments": call(1)["arguments"],
    }
    assert openai[4] == {"role": "tool", "tool_call_id": "call_1", "content": "contents 1"}
    anthropic = client.render(s.ctxd_session_id, format="anthropic").messages
    assert anthropic["messages"][-1]["content"][0]["type"] == "tool_result"


def test_rendered_mode_returns_the_budgeted_context(client: Client) -> None:
    raw = new_session(client)
    big = {"type": "function_call_output", "call_id": "call_1", "output": "line\n" * 4000}
    items = [USER, call(1), big, {"role": "assistant", "content": "It is long."}]
    run(raw.add_items(items))
    rendered = CtxdSession(raw.session_id, client=client, render_budget=2_000)
    got = run(rendered.get_items())
    assert got[:2] == items[:2] and got[-1] == items[-1]
    assert got[2]["type"] == "function_call_output" and got[2]["call_id"] == "call_1"
    assert len(got[2]["output"]) < len(big["output"])
    assert run(rendered.get_items(limit=1)) == items[-1:]
    # What the render keeps whole comes back exactly as stored, reasoning and ids included.
    whole = new_session(client)
    small = [USER, REASONING, ASSISTANT, call(1), output(1)]
    run(whole.add_items(small))
    assert run(CtxdSession(whole.session_id, client=client, render_budget=10**6).get_items()) == (
        small
    )


# ---------------------------------------------------------------- Runner.run


def test_runner_persists_to_ctxd(client: Client) -> None:
    set_tracing_disabled(True)
    model = FakeModel()
    s = new_session(client)
    result = run(Runner.run(agent(model), "hello", session=s))
    assert result.final_output == "turn 1: the tool said <hello>"
    stored = run(s.get_items())
    assert [i.get("type", "message") for i in stored] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert stored[0] == {"role": "user", "content": "hello"}
    messages = client.render(s.ctxd_session_id).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]


def run_process(address: str, session_id: str, text: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(HERE / "agents_fake.py"), address, session_id, text],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_conversation_resumes_in_another_process(server: str) -> None:
    session_id = f"two-processes-{uuid.uuid4()}"
    first = run_process(server, session_id, "first question")
    assert first["final_output"] == "turn 1: the tool said <first question>"
    second = run_process(server, session_id, "second question")
    assert second["final_output"] == "turn 2: the tool said <second question>"
    with Client(server, timeout=30) as ctxd:
        stored = run(CtxdSession(session_id, client=ctxd).get_items())
    assert len(stored) == 8  # per turn: user, function_call, function_call_output, message
    assert stored[1] == {
        "arguments": '{"query": "first question"}',
        "call_id": "call_1",
        "name": "lookup",
        "type": "function_call",
        "id": "fc_1",
        "status": "completed",
    }
    assert stored[3]["id"] == "msg_1" and stored[3]["content"][0]["text"] == first["final_output"]
    # The second process's model saw the first process's turn exactly as the SDK stored it.
    assert second["inputs"][0] == stored[:5]
    assert stored[4] == {"role": "user", "content": "second question"}


# ---------------------------------------------------------------- bad input


def test_a_wrong_address_fails_at_first_use() -> None:
    s = CtxdSession("x", address="127.0.0.1:1")  # nothing listens on port 1
    try:
        with pytest.raises(Unavailable, match="127.0.0.1:1"):
            run(s.get_items())
    finally:
        s.close()


def test_a_wrong_key_says_so(ctxd_bin: Path, tmp_path: Path) -> None:
    keyed = Server(ctxd_bin, tmp_path, "--api-keys-file", str(write_keys(tmp_path)))
    try:
        s = CtxdSession("keyed", address=keyed.address, api_key="not-" + KEY)
        with pytest.raises(Unauthenticated, match="invalid API key"):
            run(s.add_items([USER]))
        s.close()
        ok = CtxdSession("keyed", address=keyed.address, api_key=KEY)
        run(ok.add_items([USER]))
        assert run(ok.get_items()) == [USER]
        ok.close()
    finally:
        keyed.stop()
