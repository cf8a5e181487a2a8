"""Render in the three formats, budgets, policies, targets, and context stats."""

from __future__ import annotations

import json

import pytest

from ctxd_client import Budget, Client, ContextReport, InvalidArgument, Session


def tool_turn(client: Client, session: Session, n: int = 0, size: int = 200) -> None:
    """A user request, an assistant calling two tools, both results (one an error), an answer."""
    client.append_user(session, f"request {n}: what is in README.md?")
    client.append_assistant(
        session,
        "Let me read it.",
        tool_calls=[
            {"id": f"r{n}", "name": "read_file", "arguments": {"path": "README.md"}},
            {"id": f"g{n}", "name": "grep", "arguments": {"pattern": "ctxd"}},
        ],
    )
    client.append_tool_result(session, f"r{n}", f"file {n}: " + "x" * size)
    client.append_tool_result(session, f"g{n}", "grep: no match", is_error=True)
    client.append_assistant(session, f"answer {n}: it describes ctxd.")


def test_openai_document_pairs_tool_calls_with_tool_messages(
    client: Client, session: Session
) -> None:
    tool_turn(client, session)
    r = client.render(session)  # openai is the default
    assert r.format == "openai"
    messages = r.messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    calls = messages[1]["tool_calls"]
    assert [c["id"] for c in calls] == ["r0", "g0"]
    assert all(c["type"] == "function" for c in calls)
    assert calls[0]["function"]["name"] == "read_file"
    # OpenAI wants the arguments as a JSON string.
    assert json.loads(calls[0]["function"]["arguments"]) == {"path": "README.md"}
    assert [m["tool_call_id"] for m in messages[2:4]] == ["r0", "g0"]
    assert messages[2]["content"].startswith("file 0: xxx")
    assert messages[-1] == {"role": "assistant", "content": "answer 0: it describes ctxd."}
    json.dumps(messages)  # ready to send as it is
    assert r.head_id == client.get_session(session).branches[0].head_id
    assert r.total_tokens == r.report.total_tokens > 0
    assert r.tokenizer == "heuristic"


def test_anthropic_document_uses_tool_use_and_tool_result_blocks(
    client: Client, session: Session
) -> None:
    tool_turn(client, session)
    doc = client.render(session, format="anthropic").messages
    # No system message: no `system` key (an empty one is left out).
    assert set(doc) == {"messages"}
    messages = doc["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    uses = [b for b in messages[1]["content"] if b["type"] == "tool_use"]
    assert [(b["id"], b["name"]) for b in uses] == [("r0", "read_file"), ("g0", "grep")]
    # Anthropic wants the input as an object.
    assert uses[0]["input"] == {"path": "README.md"}
    # Consecutive results merge into one user message, in call order.
    results = messages[2]["content"]
    assert [(b["type"], b["tool_use_id"]) for b in results] == [
        ("tool_result", "r0"),
        ("tool_result", "g0"),
    ]
    assert results[1].get("is_error") is True
    assert not results[0].get("is_error")


def test_anthropic_document_lifts_system_messages(client: Client, session: Session) -> None:
    from ctxd_client import system_message, user_message

    client.append(session, [system_message("You are terse."), user_message("hi")])
    doc = client.render(session, format="anthropic").messages
    system = doc["system"]
    text = system if isinstance(system, str) else " ".join(b["text"] for b in system)
    assert "You are terse." in text
    assert [m["role"] for m in doc["messages"]] == ["user"]


def test_neutral_messages_are_simple_dicts(client: Client, session: Session) -> None:
    tool_turn(client, session)
    r = client.render(session, format="neutral")
    messages = r.messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert messages[1]["tool_calls"][0] == {
        "id": "r0",
        "name": "read_file",
        "arguments": json.dumps({"path": "README.md"}),
    }
    assert messages[3]["tool_call_id"] == "g0" and messages[3]["name"] == "grep"
    assert messages[3]["is_error"] is True
    assert all(len(m["node_ids"]) == 1 for m in messages)
    assert sum(m["tokens"] for m in messages) == r.report.total_tokens
    assert r.raw.messages_json == ""


def test_budgets_as_int_dict_or_dataclass(client: Client, session: Session) -> None:
    tool_turn(client, session)
    unbounded = client.render(session).report
    assert unbounded.budget is None and unbounded.history_budget == 0 and unbounded.fits

    as_int = client.render(session, budget=10_000).report
    assert as_int.budget == Budget(context_window=10_000)
    assert as_int.history_budget == 10_000

    parts = {
        "context_window": 10_000,
        "output_reserve": 1_000,
        "system_tokens": 500,
        "tools_tokens": 400,
        "schema_tokens": 100,
    }
    as_dict = client.render(session, budget=parts).report
    assert as_dict.history_budget == 8_000
    assert as_dict.budget == Budget(**parts)
    assert client.render(session, budget=Budget(**parts)).report == as_dict

    with pytest.raises(TypeError, match="output_reserved"):
        client.render(session, budget={"context_window": 1000, "output_reserved": 10})
    with pytest.raises(TypeError):
        client.render(session, budget="1000")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument) as nothing_left:
        client.render(session, budget={"context_window": 100, "output_reserve": 100})
    assert "budget" in nothing_left.value.message


def test_a_tight_budget_snips_old_turns_and_says_so(client: Client, session: Session) -> None:
    for n in range(4):
        tool_turn(client, session, n, size=2000)
    full = client.render(session).report
    r = client.render(session, budget=full.total_tokens // 2)
    report = r.report
    assert report.turns_snipped >= 1 and report.snipped_node_ids
    assert report.fits and report.total_tokens <= report.history_budget
    # The newest turn is always there, whole.
    assert r.messages[-1]["content"] == "answer 3: it describes ctxd."
    assert r.messages[0]["role"] == "user"

    over = client.render(session, budget=60, policy={"snip": False}).report
    assert not over.fits and over.over_by > 0


def test_policy_and_reactive(client: Client, session: Session) -> None:
    for n in range(3):
        tool_turn(client, session, n, size=3000)
    # Results newer than the last step keep up to the recent cap.
    cut = client.render(session, budget=100_000, policy={"recent_tool_result_chars": 500})
    assert cut.report.results_truncated == 3
    assert "characters cut" in cut.messages[2]["content"]

    reactive = client.render(session, budget=100_000, reactive=True)
    assert reactive.report.microcompact_trigger == "reactive"
    assert reactive.report.results_cleared > 0
    cleared = {m["tool_call_id"] for m in reactive.messages if m["role"] == "tool"}
    assert {"r2", "g2"} <= cleared  # the newest turn's results are kept as they are
    newest = [m for m in reactive.messages if m.get("tool_call_id") == "r2"][0]
    assert newest["content"].startswith("file 2: ")

    with pytest.raises(ValueError):
        client.render(session, policy={"no_such_field": 1})
    with pytest.raises(ValueError, match="format"):
        client.render(session, format="gemini")  # type: ignore[arg-type]


def test_render_at_a_node_and_with_real_tokenizers(client: Client, session: Session) -> None:
    first = client.append_user(session, "first")
    client.append_assistant(session, "second")
    at_first = client.render(session, node_id=first.node_id)
    assert at_first.messages == [{"role": "user", "content": "first"}]
    assert at_first.head_id == first.node_id

    for tokenizer in ("o200k_base", "cl100k_base"):
        assert client.render(session, tokenizer=tokenizer).report.tokenizer == tokenizer
    with pytest.raises(InvalidArgument, match="tokenizer"):
        client.render(session, tokenizer="gpt-9")


def test_context_stats_is_the_report_of_render(client: Client, session: Session) -> None:
    for n in range(3):
        tool_turn(client, session, n, size=1500)
    budget = {"context_window": 2_000, "output_reserve": 200}
    stats = client.context_stats(session, budget=budget, now_unix_ms=1)
    assert isinstance(stats, ContextReport)
    assert stats == client.render(session, budget=budget, now_unix_ms=1).report
    tokens = stats.tokens
    assert stats.total_tokens == sum(
        (
            tokens.system,
            tokens.user,
            tokens.assistant_text,
            tokens.tool_calls,
            tokens.tool_results,
            tokens.summaries,
            tokens.markers,
        )
    )
    assert client.context_stats(session).budget is None
    reactive = client.context_stats(session, budget=100_000, reactive=True)
    assert reactive.microcompact_trigger == "reactive"


def test_a_part_the_format_cannot_carry_is_named(client: Client, session: Session) -> None:
    from ctxd_client import pb

    zip_part = pb.ContentPart(media=pb.Media(mime_type="application/zip", data=b"PK"))
    node = pb.NodeInput(
        message=pb.Message(role=pb.ROLE_USER, parts=[pb.ContentPart(text="see"), zip_part])
    )
    sent = client.append(session, [node])
    rendered = client.render(session, format="anthropic")
    assert [(u.node_id, u.part_index, u.mime_type) for u in rendered.uncarried] == [
        (sent.node_ids[0], 1, "application/zip")
    ]
    with pytest.raises(InvalidArgument) as refused:
        client.render(session, format="openai", strict_format=True)
    assert sent.node_ids[0] in refused.value.message
    assert "strict_format" in refused.value.message
