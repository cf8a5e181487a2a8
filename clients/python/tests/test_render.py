"""Render in the three formats, budgets, policies, targets, and context stats."""

from __future__ import annotations

import json

import pytest

from ctxd_client import Budget, Client, ContextReport, InvalidArgument, Session, pb


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


# ---------------------------------------------------------------- rendering for a model

REASONING_MIME = "application/vnd.ctxd.anthropic-reasoning+json"
# A thinking block as Anthropic returns it (display omitted), in the canonical JSON ctxd keeps.
THINKING = b'{"signature":"s","thinking":"","type":"thinking"}'
BINDING_MODEL = "claude-opus-5-5"
# Results far over the window: a step is forced whatever it costs.
CALLS = 30
RESULT_CHARS = 8_000
WINDOW = 20_000


def thinking_loop(client: Client) -> Session:
    """A tool loop of a model that thinks before each call: every assistant message holds a
    thinking block and one call, each answered with an 8 KB result; the model has read them
    all (a last assistant message comes after the last result)."""
    from ctxd_client import tool_call, tool_result

    def thinking_message(calls: list[pb.ToolCall], text: str = "") -> pb.NodeInput:
        parts = [pb.ContentPart(media=pb.Media(mime_type=REASONING_MIME, data=THINKING))]
        if text:
            parts.append(pb.ContentPart(text=text))
        return pb.NodeInput(
            message=pb.Message(role=pb.ROLE_ASSISTANT, parts=parts, tool_calls=calls)
        )

    session = client.create_session({"test": "python-client"})
    client.append_user(session, "Read every file.")
    batches = []
    for k in range(CALLS):
        call_id = f"toolu_{k:02}"
        call = tool_call({"id": call_id, "name": "Read", "arguments": {"file_path": f"f{k}.rs"}})
        body = "".join(f"{k:04} line {n:05}: fn item_{n}() {{}}\n" for n in range(400))
        batches.append([thinking_message([call]), tool_result(call_id, body[:RESULT_CHARS])])
    batches.append([thinking_message([], "All read.")])
    client.append_many(session, batches)
    return session


def thinking_blocks(document: dict) -> int:
    return sum(
        1
        for m in document["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "thinking"
    )


def test_a_render_for_a_binding_model_steps_as_the_providers_edit(client: Client) -> None:
    session = thinking_loop(client)
    r = client.render(session, budget=WINDOW, format="anthropic", model=BINDING_MODEL)
    report = r.report
    assert report.priced_by == BINDING_MODEL
    assert report.edit_clear > 0 and report.edit_clear + report.edit_keep == CALLS
    assert report.thinking_dropped == 0
    assert r.betas == ["context-management-2025-06-27"]
    # The document goes unreduced, every thinking block with it, and asks the provider to clear.
    document = r.messages
    assert thinking_blocks(document) == CALLS + 1
    edit = document["context_management"]["edits"][0]
    assert edit["type"] == "clear_tool_uses_20250919"
    assert edit["trigger"]["value"] == report.edit_clear
    assert edit["keep"]["value"] == report.edit_keep
    # "keep" is the default, by name or by the enum; context_stats gives the same report.
    for policy in ({"reasoning": "keep"}, {"reasoning": pb.REASONING_KEEP}):
        kept = client.render(
            session, budget=WINDOW, format="anthropic", model=BINDING_MODEL, policy=policy
        )
        assert kept.report == report and kept.betas == r.betas
    assert client.context_stats(session, budget=WINDOW, model=BINDING_MODEL) == report
    # Without a model nothing is bound: no edit, no betas, no pricing entry.
    plain = client.render(session, budget=WINDOW, format="anthropic")
    assert plain.report.priced_by == "" and plain.report.edit_clear == 0
    assert plain.betas == [] and "context_management" not in plain.messages


def test_a_render_that_drops_reasoning_leaves_out_what_a_step_invalidated(
    client: Client,
) -> None:
    session = thinking_loop(client)
    r = client.render(
        session,
        budget=WINDOW,
        format="anthropic",
        model=BINDING_MODEL,
        policy={"reasoning": "drop"},
    )
    report = r.report
    assert report.priced_by == BINDING_MODEL
    assert report.thinking_dropped > 0
    assert report.edit_clear == 0 and report.edit_keep == 0
    assert r.betas == [] and "context_management" not in r.messages
    assert report.results_cleared > 0, "the step is ctxd's own"
    assert thinking_blocks(r.messages) == CALLS + 1 - report.thinking_dropped
    stats = client.context_stats(
        session, budget=WINDOW, model=BINDING_MODEL, policy={"reasoning": pb.REASONING_DROP}
    )
    assert stats == report


def test_model_prices_and_reasoning_are_checked(client: Client, session: Session) -> None:
    tool_turn(client, session)
    # Prices of the policy's own, within 0 and 100, are taken.
    priced = client.render(
        session,
        budget=10_000,
        model="gpt-5",
        policy={"cache_read_price": 0.1, "cache_write_price": 1.0},
    )
    assert priced.report.priced_by == "gpt-5" and priced.report.fits
    # An unknown model is priced by the fallback entry, named after it.
    assert client.context_stats(session, model="no-such-model").priced_by.startswith("unknown:")

    for field, value in (("cache_read_price", -0.5), ("cache_write_price", 101.0)):
        with pytest.raises(InvalidArgument, match=f"policy.{field}"):
            client.render(session, budget=10_000, model=BINDING_MODEL, policy={field: value})
        with pytest.raises(InvalidArgument, match=f"policy.{field}"):
            client.context_stats(session, policy={field: value})
    # A reasoning by a name the client does not know never leaves it; a number the server does
    # not know is refused there.
    with pytest.raises(ValueError, match="reasoning"):
        client.render(session, model=BINDING_MODEL, policy={"reasoning": "forget"})
    with pytest.raises(InvalidArgument, match="policy.reasoning"):
        client.render(session, model=BINDING_MODEL, policy={"reasoning": 7})
