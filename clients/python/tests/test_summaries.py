"""Two-phase summaries (prepare, commit, cancel), the audit trail, and the server's summarizer."""

from __future__ import annotations

import pytest
from conftest import FakeSummarizer

from ctxd_client import Client, Compaction, FailedPrecondition, InvalidArgument, NotFound, Session

# The history may use 2,000 tokens; four turns with 3,000-character results need more.
BUDGET = {"context_window": 2_500, "output_reserve": 500}
SUMMARY_PREFIX = "[Summary of the earlier conversation"


def four_turns(client: Client, session: Session) -> None:
    for t in range(4):
        client.append_user(session, f"request number {t}: please look at file {t}")
        client.append_assistant(
            session,
            "looking",
            tool_calls=[{"id": f"call-{t}", "name": "read_file", "arguments": {"path": f"f{t}"}}],
        )
        client.append_tool_result(session, f"call-{t}", f"contents of file {t} " * 150)
        client.append_assistant(session, f"file {t} is fine")


def test_prepare_and_commit_lay_a_summary_over_older_turns(
    client: Client, session: Session
) -> None:
    four_turns(client, session)
    before = client.render(session)
    plan = client.prepare_compaction(session, BUDGET)
    assert isinstance(plan, Compaction)
    assert plan.needed and plan.compaction_id and plan.covers_ids
    assert plan.base_head_id == before.head_id
    assert plan.tokens_before > plan.history_budget == 2_000
    assert plan.retained_turns >= 1 and plan.prior_summary_id == ""
    # The summary input is an OpenAI document the host can send to its summarizer as it is.
    assert plan.format == "openai"
    assert plan.summary_input[0] == {
        "role": "user",
        "content": "request number 0: please look at file 0",
    }
    assert any(m["role"] == "tool" for m in plan.summary_input)

    outcome = client.commit_summary(plan, "Files 0 and 1 were read; both are fine.", "test-model")
    assert outcome.applied and outcome.reason == "applied" and outcome.summary_id
    assert outcome.tokens_after < outcome.tokens_before
    assert outcome.compaction_id == plan.compaction_id

    after = client.render(session)
    assert after.messages[0]["role"] == "user"
    assert after.messages[0]["content"].startswith(SUMMARY_PREFIX)
    assert "Files 0 and 1 were read" in after.messages[0]["content"]
    assert after.report.tokens.summaries > 0
    assert after.report.total_tokens < before.report.total_tokens
    assert client.get_session(session).compaction_count == 1

    audit = client.list_summaries(session)
    assert [s.summary_id for s in audit.summaries] == [outcome.summary_id]
    active = audit.active
    assert active is not None and active.applies and active.model == "test-model"
    assert active.covers_ids == plan.covers_ids and active.compaction_id == plan.compaction_id
    assert [(e.kind, e.reason) for e in audit.events] == [
        ("prepared", "unspecified"),
        ("committed", "applied"),
    ]
    # History is never rewritten: the log still holds every node.
    assert len(client.log(session, limit=1000)) == 16


def test_prepare_in_the_other_formats(client: Client, session: Session) -> None:
    four_turns(client, session)
    anthropic = client.prepare_compaction(session, BUDGET, format="anthropic")
    assert anthropic.needed
    blocks = [b["type"] for m in anthropic.summary_input["messages"] for b in m["content"]]
    assert "tool_use" in blocks and "tool_result" in blocks
    neutral = client.prepare_compaction(session, BUDGET, format="neutral", retain_turns=1)
    assert neutral.summary_input[0]["content"] == "request number 0: please look at file 0"
    assert neutral.retained_turns == 1
    assert len(neutral.covers_ids) > len(anthropic.covers_ids)


def test_a_history_that_fits_needs_no_summary(client: Client, session: Session) -> None:
    client.append_user(session, "hello")
    plan = client.prepare_compaction(session, 100_000)
    assert not plan.needed and plan.compaction_id == "" and plan.summary_input == []
    assert "fits" in plan.reason


def test_commits_that_do_not_help_are_answered_not_raised(client: Client, session: Session) -> None:
    four_turns(client, session)
    plan = client.prepare_compaction(session, BUDGET)
    empty = client.commit_summary(plan.compaction_id, "   ", "m")
    assert (empty.applied, empty.reason) == (False, "empty")
    no_gain = client.commit_summary(plan.compaction_id, "very long summary " * 2_000, "m")
    assert (no_gain.applied, no_gain.reason) == (False, "no_gain")
    assert no_gain.tokens_after >= no_gain.tokens_before

    client.cancel_compaction(plan, "the host gave up")
    with pytest.raises(FailedPrecondition, match="cancelled"):
        client.commit_summary(plan, "short", "m")
    audit = client.list_summaries(session)
    assert audit.summaries == [] and audit.active is None
    assert [(e.kind, e.reason) for e in audit.events] == [
        ("prepared", "unspecified"),
        ("rejected", "empty"),
        ("rejected", "no_gain"),
        ("cancelled", "cancelled"),
    ]
    assert audit.events[-1].message == "the host gave up"
    assert client.get_session(session).compaction_count == 0


def test_bad_compaction_requests_raise(client: Client, session: Session) -> None:
    with pytest.raises(NotFound, match="branch"):
        client.prepare_compaction(session, BUDGET, branch="nope")
    with pytest.raises(InvalidArgument, match="compaction_id"):
        client.commit_summary("not-a-uuid", "x", "m")
    with pytest.raises(NotFound):
        client.cancel_compaction("01a22742-c12c-7099-bb41-22e2108db8f5")


def test_compact_without_a_summarizer_is_a_failed_precondition(
    client: Client, session: Session
) -> None:
    four_turns(client, session)
    with pytest.raises(FailedPrecondition):
        client.compact(session, BUDGET)


def test_compact_with_the_servers_summarizer(
    summarizing_server: str, summarizer: FakeSummarizer
) -> None:
    with Client(summarizing_server, timeout=60) as client:
        session = client.create_session()
        four_turns(client, session)
        outcome = client.compact(session, BUDGET, instructions="Keep file names.")
        assert outcome.applied and outcome.reason == "applied", outcome
        assert summarizer.requests and summarizer.requests[-1]["body"]["model"] == "fake-model"
        first = client.render(session).messages[0]["content"]
        assert first.startswith(SUMMARY_PREFIX) and summarizer.reply in first
        assert client.compact(session, 100_000).reason == "not_needed"
