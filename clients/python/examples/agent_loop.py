#!/usr/bin/env python3
"""An agent loop on ctxd, with a scripted stand-in for the model.

Every turn is appended to a ctxd session; before every model call the context is rendered under
a token budget as an OpenAI chat `messages` list. When the history nears the budget (or the
engine already had to drop old turns to fit, or says a summary is needed), the loop prepares a
compaction, lets the model write the summary, and commits it: the next renders carry the summary
instead of the old turns, and nothing in the store is rewritten.

The stand-in model returns canned turns (text, and calls of a fake `read_file` tool whose results
are long) and checks each request the way a provider would, so the loop needs no network or API
key. Start a server and run:

    cargo run --release -- serve --db agent.db &
    python clients/python/examples/agent_loop.py --address 127.0.0.1:50051
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

from ctxd_client import Client, ContextReport, Session

# The model's window and what its answer may take: the history may use the other 3,000 tokens
# (ctxd's heuristic tokenizer counts 4 characters a token).
BUDGET = {"context_window": 4_000, "output_reserve": 1_000}
HISTORY = BUDGET["context_window"] - BUDGET["output_reserve"]
# Compact once the history uses this share of its budget, down to a target that leaves room for
# the next turns, so the engine never has to drop a turn unsummarized.
COMPACT_AT = 0.7
TARGET = {"context_window": int(HISTORY * 0.5)}
# A window this small holds few results whole (by default a result is cut only at a step, a
# policy sized for 200k windows): once the model has read it, a result keeps 4,000 characters.
POLICY = {"recent_tool_result_chars": 4_000}


# ---------------------------------------------------------------- the stand-in model


@dataclass
class Turn:
    """One canned assistant turn: some text, and tool calls as `(name, arguments)`."""

    text: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


# What the user asks, and how the "model" answers each request, in order.
SCRIPT: list[tuple[str, list[Turn]]] = [
    (
        "What does the parser do?",
        [
            Turn("Let me read the parser.", [("read_file", {"path": "src/parser.py"})]),
            Turn("It uses the lexer; reading that too.", [("read_file", {"path": "src/lexer.py"})]),
            Turn("The parser turns the lexer's tokens into an expression tree."),
        ],
    ),
    (
        "And the evaluator?",
        [
            Turn("", [("read_file", {"path": "src/eval.py"})]),
            Turn("The evaluator walks the tree; division does not check for zero."),
        ],
    ),
    (
        "Is division by zero tested?",
        [
            Turn(
                "Checking the tests.",
                [("read_file", {"path": "tests/test_eval.py"}), ("read_file", {"path": "NOTES"})],
            ),
            Turn("No: the tests never divide by zero, and NOTES lists it as a known bug."),
        ],
    ),
    (
        "Write the fix.",
        [
            Turn("", [("read_file", {"path": "src/eval.py"})]),
            Turn("Add `if right == 0: raise ZeroDivisionError(node)` before dividing in eval.py."),
        ],
    ),
]


class ProviderError(Exception):
    """What a real provider would answer to a malformed request."""


class ScriptedModel:
    """Returns the canned turns in order, after checking the request like a provider would."""

    name = "scripted-stand-in"

    def __init__(self, turns: list[Turn]) -> None:
        self.turns = iter(turns)
        self.calls = 0

    def complete(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """An OpenAI-style assistant message for `messages`."""
        check_openai_request(messages)
        self.calls += 1
        turn = next(self.turns)
        message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
        if turn.calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{self.calls}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for i, (name, args) in enumerate(turn.calls)
            ]
        return message

    def summarize(self, messages: list[dict[str, Any]]) -> str:
        """A "summary" of the summary input: earlier summary, requests, files read, answers."""
        check_openai_request(messages, summary=True)
        self.calls += 1
        lines = []
        for m in messages:
            content = m.get("content") or ""
            if content.startswith("[Summary of the earlier conversation"):
                lines.append(content.split("\n", 1)[-1].strip())
            elif m["role"] == "user":
                lines.append(f"The user asked: {content}")
            elif m["role"] == "assistant":
                for call in m.get("tool_calls", []):
                    path = json.loads(call["function"]["arguments"]).get("path", "?")
                    lines.append(f"I read {path}.")
                if content and not m.get("tool_calls"):
                    lines.append(f"I answered: {content}")
        return "\n".join(lines)


def check_openai_request(messages: list[dict[str, Any]], summary: bool = False) -> None:
    """The pairing rules of chat completions: every tool call answered right after its assistant
    message, every tool message answering one. ctxd guarantees them; a provider enforces them."""
    if not messages:
        raise ProviderError("messages must not be empty")
    pending: set[str] = set()
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            if m.get("tool_call_id") not in pending:
                raise ProviderError(f"messages[{i}]: tool message answers no pending call")
            pending.remove(m["tool_call_id"])
            continue
        if pending:
            raise ProviderError(f"messages[{i}]: tool calls {sorted(pending)} have no result")
        if role not in ("system", "developer", "user", "assistant"):
            raise ProviderError(f"messages[{i}]: unknown role {role!r}")
        pending = {c["id"] for c in m.get("tool_calls", [])}
    if pending and not summary:
        raise ProviderError(f"tool calls {sorted(pending)} have no result")


def read_file(path: str) -> str:
    """The fake tool: a long, deterministic "file" (longer than ctxd keeps of a result)."""
    lines = [
        f"{path}:{n:03}: def step_{n}(tree): return walk(tree, {n}) # pad pad" for n in range(90)
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- the loop


def compact(ctxd: Client, session: Session, model: ScriptedModel, why: str) -> bool:
    """Prepare, summarize with the model, commit. True if a summary now applies."""
    plan = ctxd.prepare_compaction(session, TARGET, format="openai")
    if not plan.needed:
        print(f"  compaction ({why}): not needed: {plan.reason}")
        return False
    print(
        f"  compaction ({why}): summarizing {len(plan.covers_ids)} nodes,"
        f" {plan.input_tokens} tokens of input"
    )
    text = model.summarize(plan.summary_input)
    outcome = ctxd.commit_summary(plan, text, model.name)
    verdict = "applied" if outcome.applied else f"rejected ({outcome.reason}: {outcome.message})"
    print(f"  summary {verdict}: {outcome.tokens_before} -> {outcome.tokens_after} tokens")
    return outcome.applied


def compaction_reason(report: ContextReport) -> str:
    """Why the context should be summarized now, or "" if it need not be."""
    if report.summary_needed:
        return "the engine says a summary is needed"
    if report.turns_snipped:
        return "old turns had to be dropped to fit"
    if report.total_tokens > COMPACT_AT * report.history_budget:
        return f"over {COMPACT_AT:.0%} of the budget"
    return ""


def run(address: str) -> None:
    turns = [turn for _, answers in SCRIPT for turn in answers]
    model = ScriptedModel(turns)
    applied = 0
    with Client(address, timeout=30) as ctxd:
        session = ctxd.create_session({"example": "agent_loop"})
        print(f"session {session.id}")
        for number, (request, _) in enumerate(SCRIPT, 1):
            print(f"[task {number}] user: {request}")
            ctxd.append_user(session, request)
            while True:
                context = ctxd.render(session, budget=BUDGET, policy=POLICY, format="openai")
                report = context.report
                print(
                    f"  context: {report.total_tokens} of {report.history_budget} tokens in"
                    f" {report.messages} messages ({report.results_truncated} results truncated,"
                    f" {report.turns_snipped} turns snipped)"
                )
                if why := compaction_reason(report):
                    if compact(ctxd, session, model, why):
                        applied += 1
                        context = ctxd.render(session, budget=BUDGET, policy=POLICY, format="openai")
                        print(f"  context now: {context.report.total_tokens} tokens")
                reply = model.complete(context.messages)
                calls = reply.get("tool_calls", [])
                ctxd.append_assistant(session, reply["content"] or "", calls)
                if reply["content"]:
                    print(f"  assistant: {reply['content']}")
                if not calls:
                    break
                for call in calls:
                    args = json.loads(call["function"]["arguments"])
                    result = read_file(**args)
                    ctxd.append_tool_result(session, call["id"], result)
                    print(f"  tool read_file({args['path']}): {len(result)} characters")
        final = ctxd.context_stats(session, budget=BUDGET, policy=POLICY)
        audit = ctxd.list_summaries(session)
        print(
            f"done: {len(SCRIPT)} tasks, {model.calls} model calls, {applied} summaries applied"
            f" ({len(audit.events)} compaction events), final context {final.total_tokens}"
            f" of {final.history_budget} tokens"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default="127.0.0.1:50051", help="the ctxd server")
    run(parser.parse_args().address)


if __name__ == "__main__":
    main()
