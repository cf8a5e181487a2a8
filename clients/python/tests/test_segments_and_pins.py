"""Segment summaries (prepare/commit with `from_node_id`/`to_node_id`), their evidence ledger,
and pins: a pinned node is never reduced and shows verbatim after a summary that covers it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from conftest import FakeSummarizer

from ctxd_client import (
    Client,
    EvidenceLedger,
    InvalidArgument,
    Session,
    assistant_message,
    tool_result,
    user_message,
)

SUMMARY_PREFIX = "[Summary of the earlier conversation"
# Large enough that nothing is reduced: a segment summary is judged on the whole context.
ROOMY = 100_000
APP_PY = "def total(items):\n    return sum(items[1:])  # skips the first item\n" * 60
ASK = "Please fix the bug in src/app.py."
FIXED = "Found it: total() skipped the first item; fixed."
# A test run's log, long enough that summarizing its turn pays for the summary and its ledger.
PYTEST_LOG = "tests/test_app.py::test_total PASSED\n" * 40 + "3 passed in 0.02s"


@dataclass
class Coding:
    """The node ids of `coding_session`, in path order."""

    ask: str
    read_call: str
    read_result: str
    fixed: str
    next_ask: str
    bash_call: str
    bash_result: str
    last: str


def coding_session(client: Client, session: Session) -> Coding:
    """Two turns: the first reads src/app.py (a long result) and fixes it; the second runs the
    tests."""
    appended = client.append(
        session,
        [
            user_message(ASK),
            assistant_message(
                "Reading it.",
                [{"id": "call-read", "name": "Read", "arguments": {"file_path": "src/app.py"}}],
            ),
            tool_result("call-read", APP_PY),
            assistant_message(FIXED),
            user_message("Now run the tests."),
            assistant_message(
                "Running them.",
                [{"id": "call-bash", "name": "Bash", "arguments": {"command": "pytest -q"}}],
            ),
            tool_result("call-bash", PYTEST_LOG),
            assistant_message("All three tests pass."),
        ],
    )
    return Coding(*appended.node_ids)


def test_a_segment_summary_via_prepare_and_commit(client: Client, session: Session) -> None:
    c = coding_session(client, session)
    before = client.render(session, format="neutral")

    plan = client.prepare_compaction(
        session, ROOMY, from_node_id=c.ask, to_node_id=c.fixed, format="neutral"
    )
    assert plan.needed, plan.reason
    assert plan.kind == "segment"
    assert plan.covers_ids == [c.ask, c.read_call, c.read_result, c.fixed]
    assert plan.rolls_over_ids == [] and plan.prior_summary_id == ""
    assert isinstance(plan.ledger, EvidenceLedger)
    assert isinstance(plan.ledger_text, str)
    # The summarizer reads exactly the segment.
    assert [m["content"] for m in plan.summary_input][0] == ASK
    assert plan.summary_input[-1]["content"] == FIXED

    outcome = client.commit_summary(plan, "Fixed total() in src/app.py.", "test-model")
    assert outcome.applied, outcome
    assert outcome.tokens_after < outcome.tokens_before

    audit = client.list_summaries(session)
    [record] = audit.summaries
    assert record.summary_id == outcome.summary_id
    assert record.kind == "segment"
    assert (record.from_node_id, record.to_node_id) == (c.ask, c.fixed)
    assert record.covers_ids == plan.covers_ids
    assert record.rolls_over_ids == []
    assert record.ledger == plan.ledger
    assert record.active and audit.all_active == [record]

    after = client.render(session, format="neutral")
    first = after.messages[0]
    assert first["content"].startswith(SUMMARY_PREFIX)
    assert "Fixed total() in src/app.py." in first["content"]
    # The second turn renders as it did.
    assert [m["content"] for m in after.messages[1:]] == [m["content"] for m in before.messages[4:]]
    assert after.report.summary_ids == [outcome.summary_id]
    assert after.report.total_tokens < before.report.total_tokens

    # A second segment is a summary of its own: both are active, disjoint.
    second = client.prepare_compaction(session, ROOMY, from_node_id=c.next_ask, to_node_id=c.last)
    assert second.needed and second.kind == "segment" and second.rolls_over_ids == []
    assert client.commit_summary(second, "The tests pass.", "test-model").applied
    audit = client.list_summaries(session)
    assert [s.kind for s in audit.all_active] == ["segment", "segment"]
    assert client.context_stats(session).summary_ids == [s.summary_id for s in audit.all_active]

    # A segment over both rolls them over.
    rolled = client.prepare_compaction(session, ROOMY, from_node_id=c.ask, to_node_id=c.last)
    assert rolled.needed
    assert rolled.rolls_over_ids == [s.summary_id for s in audit.all_active]
    assert rolled.prior_summary_id == rolled.rolls_over_ids[0]
    assert len(rolled.covers_ids) == 8


def test_the_ledger_reflects_the_segment(client: Client, session: Session) -> None:
    """Depends on the server's ledger derivation."""
    c = coding_session(client, session)
    plan = client.prepare_compaction(session, ROOMY, from_node_id=c.ask, to_node_id=c.fixed)
    ledger = plan.ledger
    assert ledger is not None and not ledger.is_empty, f"an empty ledger for a read: {ledger}"
    [read] = ledger.files_read
    assert (read.path, read.tools, read.count) == ("src/app.py", ["Read"], 1)
    assert ledger.files_modified == [] and ledger.commands == []
    assert ledger.user_requests == [ASK]
    assert ledger.paths == ["src/app.py"]
    assert "src/app.py" in plan.ledger_text

    outcome = client.commit_summary(plan, "Fixed total().", "test-model")
    assert outcome.applied, outcome
    [record] = client.list_summaries(session).summaries
    assert record.ledger == ledger
    # The render carries the evidence after the summary text.
    summary = client.render(session, format="neutral").messages[0]["content"]
    assert summary.startswith(SUMMARY_PREFIX) and "src/app.py" in summary

    tests = client.prepare_compaction(session, ROOMY, from_node_id=c.next_ask, to_node_id=c.last)
    assert [cmd.command for cmd in tests.ledger.commands] == ["pytest -q"]
    assert not tests.ledger.commands[0].is_error
    assert tests.ledger.user_requests == ["Now run the tests."]


def test_pin_and_unpin(client: Client, session: Session) -> None:
    c = coding_session(client, session)
    assert client.pin(session, c.fixed) == [c.fixed]
    # Idempotent, and the answer is every pin of the session, oldest first.
    assert client.pin(session, c.read_result, c.fixed) == [c.fixed, c.read_result]

    pinned = {n.id for n in client.log(session) if n.pinned}
    assert pinned == {c.fixed, c.read_result}

    report = client.context_stats(session, ROOMY)
    assert sorted(report.pinned_node_ids) == sorted([c.fixed, c.read_result])
    assert report.pinned_tokens > 0 and not report.pins_exceed_budget
    rendered = client.render(session, format="neutral").messages
    assert [m["node_ids"] for m in rendered if m.get("pinned")] == [[c.read_result], [c.fixed]]

    # Pins are never reduced: alone over a budget, the report says so.
    tight = client.context_stats(session, report.pinned_tokens // 2)
    assert tight.pins_exceed_budget and not tight.fits

    assert client.unpin(session, c.read_result) == [c.fixed]
    assert client.unpin(session, c.fixed, c.fixed) == []
    assert not any(n.pinned for n in client.log(session))
    assert client.context_stats(session).pinned_node_ids == []

    with pytest.raises(InvalidArgument, match="node_ids"):
        client.pin(session)


def test_pinned_on_append(client: Client, session: Session) -> None:
    note = client.append_user(session, "Always use tabs in this project.", pinned=True)
    plain = user_message("not pinned")
    batch = client.append(session, [plain, assistant_message("noted")], pinned=True)
    assert not plain.pinned, "the caller's node is left as it was"
    reply = client.append_assistant(session, "ok")
    assert client.pin(session, reply.node_id) == [note.node_id, *batch.node_ids, reply.node_id]
    by_id = {n.id: n for n in client.log(session)}
    assert by_id[note.node_id].pinned and all(by_id[i].pinned for i in batch.node_ids)

    client.append_assistant(
        session, tool_calls=[{"id": "call-agent", "name": "researcher", "arguments": {}}]
    )
    with client.function(session, "call-agent", "look around") as fn:
        task = fn.append_user("look around", pinned=True)
        fn.output = "done"
    assert task.node_id in client.unpin(session, reply.node_id)


def test_a_pinned_node_survives_a_segment_summary(client: Client, session: Session) -> None:
    c = coding_session(client, session)
    client.pin(session, c.fixed)
    plan = client.prepare_compaction(session, ROOMY, from_node_id=c.ask, to_node_id=c.fixed)
    assert client.commit_summary(plan, "Fixed total().", "test-model").applied

    messages = client.render(session, format="neutral").messages
    # Verbatim, right before the summary covering it: what does not change comes first, so a
    # provider's cached prefix reaches through it.
    assert messages[0]["content"] == FIXED
    assert messages[0]["pinned"] and messages[0]["node_ids"] == [c.fixed]
    assert messages[1]["content"].startswith(SUMMARY_PREFIX)
    assert messages[2]["content"] == "Now run the tests."
    report = client.context_stats(session)
    assert report.pinned_node_ids == [c.fixed] and report.pinned_tokens > 0

    # Unpinned, the summary alone stands for it.
    client.unpin(session, c.fixed)
    messages = client.render(session, format="neutral").messages
    assert messages[1]["content"] == "Now run the tests."


def test_a_pinned_node_survives_a_rolling_summary(client: Client, session: Session) -> None:
    asks = []
    for t in range(4):
        asks.append(client.append_user(session, f"request number {t}: look at file {t}").node_id)
        client.append_assistant(
            session,
            "looking",
            tool_calls=[{"id": f"call-{t}", "name": "read_file", "arguments": {"path": f"f{t}"}}],
        )
        client.append_tool_result(session, f"call-{t}", f"contents of file {t} " * 150)
        client.append_assistant(session, f"file {t} is fine")
    client.pin(session, asks[0])
    budget = {"context_window": 2_500, "output_reserve": 500}
    plan = client.prepare_compaction(session, budget, retain_turns=1)
    assert plan.needed and plan.kind == "rolling" and asks[0] in plan.covers_ids
    assert client.commit_summary(plan, "Files 0 to 2 are fine.", "test-model").applied

    messages = client.render(session, format="neutral").messages
    at = next(i for i, m in enumerate(messages) if m["content"].startswith(SUMMARY_PREFIX))
    assert messages[at - 1]["content"] == "request number 0: look at file 0"
    assert messages[at - 1]["pinned"]
    [record] = client.list_summaries(session).summaries
    assert record.kind == "rolling"
    assert record.from_node_id == plan.covers_ids[0]


def test_segments_that_are_not_whole_are_invalid(client: Client, session: Session) -> None:
    c = coding_session(client, session)
    # The call without its result.
    with pytest.raises(InvalidArgument, match="to_node_id") as split:
        client.prepare_compaction(session, ROOMY, from_node_id=c.ask, to_node_id=c.read_call)
    assert c.read_call in split.value.message
    # The result without its call.
    with pytest.raises(InvalidArgument, match="from_node_id"):
        client.prepare_compaction(session, ROOMY, from_node_id=c.read_result, to_node_id=c.fixed)
    # Both or neither; in path order.
    with pytest.raises(InvalidArgument, match="to_node_id"):
        client.prepare_compaction(session, ROOMY, from_node_id=c.ask)
    with pytest.raises(InvalidArgument, match="from_node_id"):
        client.prepare_compaction(session, ROOMY, to_node_id=c.fixed)
    with pytest.raises(InvalidArgument, match="to_node_id"):
        client.prepare_compaction(session, ROOMY, from_node_id=c.fixed, to_node_id=c.ask)
    # Off the branch's path.
    client.create_branch(session, "early", c.fixed)
    with pytest.raises(InvalidArgument, match="to_node_id"):
        client.prepare_compaction(
            session, ROOMY, branch="early", from_node_id=c.ask, to_node_id=c.last
        )
    # Overlapping a summary partly.
    plan = client.prepare_compaction(session, ROOMY, from_node_id=c.ask, to_node_id=c.fixed)
    assert client.commit_summary(plan, "Fixed total().", "test-model").applied
    with pytest.raises(InvalidArgument, match="from_node_id"):
        client.prepare_compaction(session, ROOMY, from_node_id=c.fixed, to_node_id=c.last)
    # Nothing was planned by the refused requests.
    assert [e.kind for e in client.list_summaries(session).events] == ["prepared", "committed"]


def test_compact_a_segment_with_the_servers_summarizer(
    summarizing_server: str, summarizer: FakeSummarizer
) -> None:
    with Client(summarizing_server, timeout=60) as client:
        session = client.create_session()
        c = coding_session(client, session)
        with pytest.raises(InvalidArgument, match="to_node_id"):
            client.compact(session, ROOMY, from_node_id=c.ask, to_node_id=c.read_call)
        outcome = client.compact(session, ROOMY, from_node_id=c.ask, to_node_id=c.fixed)
        assert outcome.applied, outcome
        [record] = client.list_summaries(session).summaries
        assert record.kind == "segment" and record.text == summarizer.reply
        assert (record.from_node_id, record.to_node_id) == (c.ask, c.fixed)
