"""Plain, typed values returned by the client.

They are frozen dataclasses rather than protobuf messages so that callers get attribute names and
types their editor knows, equality and a readable repr, and never depend on the generated code.
Every value that came from a response also keeps it as `raw`, for the fields not copied here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._proto import ctxd_pb2 as pb

# ---------------------------------------------------------------- helpers


def enum_name(enum: Any, value: int, prefix: str) -> str:
    """`COMPACTION_REASON_NO_GAIN` -> `no_gain`: the short lower-case names used everywhere here."""
    try:
        name: str = enum.Name(value)
    except ValueError:  # a value newer than these stubs
        return str(value)
    return name.removeprefix(prefix).lower()


def parts_text(parts: Any) -> str:
    """The text of content parts, one part a line (media parts contribute nothing)."""
    return "\n".join(p.text for p in parts if p.WhichOneof("part") == "text")


def parts_media(parts: Any) -> list[dict[str, Any]]:
    """Media parts as `{mime_type, url}` or `{mime_type, data}`."""
    media = []
    for p in parts:
        if p.WhichOneof("part") == "media":
            source = p.media.WhichOneof("source")
            media.append({"mime_type": p.media.mime_type, source: getattr(p.media, source)})
    return media


def tool_calls_dicts(calls: Any) -> list[dict[str, str]]:
    """Tool calls as `{id, name, arguments}`, arguments as the JSON string stored."""
    return [{"id": c.call_id, "name": c.name, "arguments": c.arguments_json} for c in calls]


# ---------------------------------------------------------------- sessions and appends


@dataclass(frozen=True)
class Branch:
    """A named ref to a head node; `head_id` is empty while the branch has no node."""

    name: str
    head_id: str
    head_hash: str
    updated_at_unix_ms: int

    @classmethod
    def from_pb(cls, b: pb.Branch) -> Branch:
        return cls(b.name, b.head_id, b.head_hash, b.updated_at_unix_ms)


@dataclass(frozen=True)
class Session:
    """A session with its branches. Every method taking a session also takes its id."""

    id: str
    created_at_unix_ms: int
    metadata: dict[str, str]
    compaction_count: int
    branches: list[Branch]
    node_count: int
    """Every node stored for the session, on all branches and in its functions' internal chains;
    set by `get_session` and `list_sessions` (0 in what other calls answer)."""
    raw: pb.Session = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, s: pb.Session) -> Session:
        return cls(
            id=s.session_id,
            created_at_unix_ms=s.created_at_unix_ms,
            metadata=dict(s.metadata),
            compaction_count=s.compaction_count,
            branches=[Branch.from_pb(b) for b in s.branches],
            node_count=s.node_count,
            raw=s,
        )

    def branch(self, name: str = "main") -> Branch | None:
        """The branch called `name`, if the session has one."""
        return next((b for b in self.branches if b.name == name), None)


@dataclass(frozen=True)
class Appended:
    """What an append wrote: the new node ids in order, and the target's new head."""

    node_ids: list[str]
    head_id: str
    head_hash: str

    @property
    def node_id(self) -> str:
        """The last node written (the only one for the single-node helpers)."""
        return self.node_ids[-1]


@dataclass(frozen=True)
class AppendBatch:
    """One request of `Client.append_many` that needs more than its nodes: the options
    `Client.append` takes, for this request alone.

    `expected_head_id` makes it a compare-and-swap on the target's head as the server finds it
    when it reaches this request, after the requests before it in the stream (`""`: no head yet);
    `idempotency_key` lets the request be sent again (in this stream or another) without being
    written twice; `pinned=True` pins each of its nodes.
    """

    nodes: Sequence[pb.NodeInput]
    expected_head_id: str | None = None
    idempotency_key: str = ""
    pinned: bool = False


@dataclass(frozen=True)
class Node:
    """One stored node. `content` is a plain dict whose keys depend on `kind`:

    - message: `role`, `content` (text), `tool_calls` (`[{id, name, arguments}]`), `media`
    - tool_result: `call_id`, `name`, `content`, `is_error`
    - function_call: `call_id`, `name`, `input`, `expose`
    - function_result: `call_id`, `output`, `status`, `function_id`, `chain_head_id`
    """

    id: str
    parent_id: str
    kind: str
    content: dict[str, Any]
    created_at_unix_ms: int
    hash: str
    function_id: str
    pinned: bool
    """Pinned now (by `Client.pin`, or on append with `pinned=True`, and not unpinned since)."""
    raw: pb.Node = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, n: pb.Node) -> Node:
        c = n.content
        kind = c.WhichOneof("kind") or ""
        content: dict[str, Any]
        if kind == "message":
            content = {
                "role": enum_name(pb.Role, c.message.role, "ROLE_"),
                "content": parts_text(c.message.parts),
                "tool_calls": tool_calls_dicts(c.message.tool_calls),
                "media": parts_media(c.message.parts),
            }
        elif kind == "tool_result":
            r = c.tool_result
            content = {
                "call_id": r.call_id,
                "name": r.name,
                "content": parts_text(r.parts),
                "is_error": r.is_error,
            }
        elif kind == "function_call":
            call = c.function_call
            content = {
                "call_id": call.call_id,
                "name": call.name,
                "input": call.input,
                "expose": enum_name(pb.Expose, call.expose, "EXPOSE_"),
            }
        elif kind == "function_result":
            result = c.function_result
            content = {
                "call_id": result.call_id,
                "output": result.output,
                "status": enum_name(pb.FunctionStatus, result.status, "FUNCTION_STATUS_"),
                "function_id": result.function_id,
                "chain_head_id": result.chain_head_id,
            }
        else:
            content = {}
        return cls(
            id=n.node_id,
            parent_id=n.parent_id,
            kind=kind,
            content=content,
            created_at_unix_ms=n.created_at_unix_ms,
            hash=n.hash,
            function_id=n.function_id,
            pinned=n.pinned,
            raw=n,
        )


# ---------------------------------------------------------------- rendering


@dataclass(frozen=True)
class Budget:
    """The next request's token budget; the history may use what the other four parts leave."""

    context_window: int
    output_reserve: int = 0
    system_tokens: int = 0
    tools_tokens: int = 0
    schema_tokens: int = 0

    @classmethod
    def from_pb(cls, b: pb.Budget) -> Budget:
        return cls(
            b.context_window, b.output_reserve, b.system_tokens, b.tools_tokens, b.schema_tokens
        )

    def to_pb(self) -> pb.Budget:
        return pb.Budget(
            context_window=self.context_window,
            output_reserve=self.output_reserve,
            system_tokens=self.system_tokens,
            tools_tokens=self.tools_tokens,
            schema_tokens=self.schema_tokens,
        )


BudgetLike = int | Mapping[str, int] | Budget
"""A context window in tokens, a dict of `Budget`'s five parts, or a `Budget`."""


def budget_pb(budget: BudgetLike) -> pb.Budget:
    """Accepts the three spellings of a budget; anything else is a TypeError, not a silent 0."""
    if isinstance(budget, Budget):
        return budget.to_pb()
    if isinstance(budget, int) and not isinstance(budget, bool):
        return pb.Budget(context_window=budget)
    if isinstance(budget, Mapping):
        unknown = set(budget) - set(Budget.__dataclass_fields__)
        if unknown:
            raise TypeError(f"unknown budget parts: {', '.join(sorted(unknown))}")
        return pb.Budget(**budget)
    raise TypeError(f"budget must be an int, a dict or a Budget, not {type(budget).__name__}")


@dataclass(frozen=True)
class TokenBreakdown:
    """Tokens by what they are; the parts add up to the report's total."""

    system: int
    user: int
    assistant_text: int
    tool_calls: int
    tool_results: int
    summaries: int
    markers: int

    @classmethod
    def from_pb(cls, t: pb.TokenBreakdown) -> TokenBreakdown:
        return cls(
            t.system, t.user, t.assistant_text, t.tool_calls, t.tool_results, t.summaries, t.markers
        )


@dataclass(frozen=True)
class ContextReport:
    """What a render did and where the tokens went (docs/api.md, "Rendering under a budget")."""

    total_tokens: int
    tokens: TokenBreakdown
    messages: int
    tokenizer: str
    budget: Budget | None
    history_budget: int
    fits: bool
    over_by: int
    summary_needed: bool
    results_truncated: int
    truncated_node_ids: list[str]
    results_cleared: int
    cleared_node_ids: list[str]
    turns_snipped: int
    snipped_node_ids: list[str]
    microcompact_trigger: str
    microcompact_boundary: int
    stable_prefix_messages: int
    pinned_tokens: int
    """Tokens of the pinned messages rendered; pins are never reduced."""
    pinned_node_ids: list[str]
    pins_exceed_budget: bool
    """The pins alone take more than the history budget: unpin, or raise the budget."""
    summary_ids: list[str]
    """Every summary laid over the rendered path, in render order."""
    payback_calls: int = 0
    """For a `count` step: the later calls its saving needed to pay back the rewrite of the
    cached tail; 0 for a step the budget forced."""
    priced_by: str = ""
    """The model table's entry that priced the steps (`claude-opus-5-5`; `unknown:NAME` for a
    model the table does not know); "" when the render named no `model`."""
    edit_clear: int = 0
    """For a model that binds its thinking, with reasoning `keep`: the oldest tool uses the
    document's `context_management` edit asks the provider to clear (0: no edit)."""
    edit_keep: int = 0
    """The newest tool uses that edit keeps."""
    thinking_dropped: int = 0
    """For a model that binds its thinking, with reasoning `drop`: the thinking blocks left out
    because a step changed what came before them."""

    @classmethod
    def from_pb(cls, r: pb.ContextReport) -> ContextReport:
        return cls(
            total_tokens=r.total_tokens,
            tokens=TokenBreakdown.from_pb(r.tokens),
            messages=r.messages,
            tokenizer=r.tokenizer,
            budget=Budget.from_pb(r.budget) if r.HasField("budget") else None,
            history_budget=r.history_budget,
            fits=r.fits,
            over_by=r.over_by,
            summary_needed=r.summary_needed,
            results_truncated=r.results_truncated,
            truncated_node_ids=list(r.truncated_node_ids),
            results_cleared=r.results_cleared,
            cleared_node_ids=list(r.cleared_node_ids),
            turns_snipped=r.turns_snipped,
            snipped_node_ids=list(r.snipped_node_ids),
            microcompact_trigger=r.microcompact_trigger,
            microcompact_boundary=r.microcompact_boundary,
            stable_prefix_messages=r.stable_prefix_messages,
            pinned_tokens=r.pinned_tokens,
            pinned_node_ids=list(r.pinned_node_ids),
            pins_exceed_budget=r.pins_exceed_budget,
            summary_ids=list(r.summary_ids),
            payback_calls=r.payback_calls,
            priced_by=r.priced_by,
            edit_clear=r.edit_clear,
            edit_keep=r.edit_keep,
            thinking_dropped=r.thinking_dropped,
        )


_ROLE_NAMES = {v.number: v.name.removeprefix("ROLE_").lower() for v in pb.Role.DESCRIPTOR.values}


def neutral_message(m: pb.RenderedMessage) -> dict[str, Any]:
    """A rendered message as a simple dict: `role` and `content` always, the rest when set."""
    # Every field read of a parsed message builds a Python object, so each is read once: a
    # long context is thousands of them.
    texts = []
    media = []
    for p in m.parts:
        kind = p.WhichOneof("part")
        if kind == "text":
            texts.append(p.text)
        elif kind == "media":
            source = p.media.WhichOneof("source")
            media.append({"mime_type": p.media.mime_type, source: getattr(p.media, source)})
    role = m.role
    d: dict[str, Any] = {
        "role": _ROLE_NAMES.get(role) or enum_name(pb.Role, role, "ROLE_"),
        "content": texts[0] if len(texts) == 1 else "\n".join(texts),
    }
    if media:
        d["media"] = media
    calls = m.tool_calls
    if calls:
        d["tool_calls"] = tool_calls_dicts(calls)
    if tool_call_id := m.tool_call_id:
        d["tool_call_id"] = tool_call_id
    if name := m.name:
        d["name"] = name
    if m.is_error:
        d["is_error"] = True
    if function_id := m.function_id:
        d["function_id"] = function_id
    if m.truncated:
        d["truncated"] = True
    if m.cleared:
        d["cleared"] = True
    if m.pinned:
        d["pinned"] = True
    d["tokens"] = m.tokens
    d["node_ids"] = list(m.node_ids)
    return d


@dataclass(frozen=True)
class RenderResult:
    """A rendered context.

    `messages` is ready to send: for `openai` the chat-completions `messages` list, for
    `anthropic` the `{"system", "messages"}` dict of the Messages API, for `neutral` a list of
    simple dicts (see `neutral_message`). `raw.messages` keeps the server's per-message details
    (node ids, tokens) whatever the format.
    """

    messages: Any
    report: ContextReport
    format: str
    head_id: str
    head_hash: str
    total_tokens: int
    tokenizer: str
    raw: pb.RenderResponse = field(repr=False, compare=False)
    #: Media parts the format sent only as `[<mime> attachment]` text.
    uncarried: list[UncarriedPart] = field(default_factory=list)
    #: The `anthropic-beta` values to send with the document (`context-management-2025-06-27`
    #: when it carries a `context_management` edit).
    betas: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class UncarriedPart:
    """A media part a provider format cannot carry where it stands (`node_id` empty for a
    summary)."""

    node_id: str
    part_index: int
    mime_type: str


# ---------------------------------------------------------------- summaries


@dataclass(frozen=True)
class FileUse:
    """A file a summarized range read or modified: its normalised path, the tools that touched it
    (in order of first use) and how many times."""

    path: str
    tools: list[str]
    count: int

    @classmethod
    def from_pb(cls, f: pb.FileUse) -> FileUse:
        return cls(f.path, list(f.tools), f.count)


@dataclass(frozen=True)
class CommandRun:
    """A command a summarized range ran (its first line); `exit_code` is None when the result
    stated none."""

    command: str
    exit_code: int | None
    is_error: bool

    @classmethod
    def from_pb(cls, c: pb.CommandRun) -> CommandRun:
        return cls(c.command, c.exit_code if c.HasField("exit_code") else None, c.is_error)


@dataclass(frozen=True)
class ErrorSeen:
    """A failure in a summarized range: the tool, and the first line saying what went wrong."""

    tool: str
    line: str

    @classmethod
    def from_pb(cls, e: pb.ErrorSeen) -> ErrorSeen:
        return cls(e.tool, e.line)


@dataclass(frozen=True)
class FunctionUse:
    """A sub-agent (function) call in a summarized range: first lines of its input and output."""

    name: str
    input: str
    output: str
    is_error: bool

    @classmethod
    def from_pb(cls, f: pb.FunctionUse) -> FunctionUse:
        return cls(f.name, f.input, f.output, f.is_error)


@dataclass(frozen=True)
class EvidenceLedger:
    """What a summarized range did, derived from its nodes by the server and kept beside the
    summary text (rendered after it), so a summary never loses it."""

    files_read: list[FileUse]
    files_modified: list[FileUse]
    """Created or modified."""
    commands: list[CommandRun]
    errors: list[ErrorSeen]
    user_requests: list[str]
    """Each user message of the range, trimmed to 300 characters."""
    functions: list[FunctionUse]

    @classmethod
    def from_pb(cls, ledger: pb.EvidenceLedger) -> EvidenceLedger:
        return cls(
            files_read=[FileUse.from_pb(f) for f in ledger.files_read],
            files_modified=[FileUse.from_pb(f) for f in ledger.files_modified],
            commands=[CommandRun.from_pb(c) for c in ledger.commands],
            errors=[ErrorSeen.from_pb(e) for e in ledger.errors],
            user_requests=list(ledger.user_requests),
            functions=[FunctionUse.from_pb(f) for f in ledger.functions],
        )

    @property
    def paths(self) -> list[str]:
        """Every file path read or modified, sorted, each once."""
        return sorted({f.path for f in (*self.files_read, *self.files_modified)})

    @property
    def is_empty(self) -> bool:
        """Nothing recorded in any category."""
        return not any(
            (
                self.files_read,
                self.files_modified,
                self.commands,
                self.errors,
                self.user_requests,
                self.functions,
            )
        )


def ledger_or_none(message: Any) -> EvidenceLedger | None:
    """The `ledger` field of a response as an `EvidenceLedger`, None where it is absent."""
    return EvidenceLedger.from_pb(message.ledger) if message.HasField("ledger") else None


def summary_kind(value: int) -> str:
    """`rolling` (everything older than the retained turns) or `segment` (a chosen range)."""
    return enum_name(pb.SummaryKind, value, "SUMMARY_KIND_")


@dataclass(frozen=True)
class Compaction:
    """A prepared compaction: the plan and what the summarizer should read.

    When `needed` is false nothing was stored and no model should be called. `summary_input` is
    in the format asked for, like `RenderResult.messages`.
    """

    needed: bool
    compaction_id: str
    base_head_id: str
    covers_ids: list[str]
    prior_summary_id: str
    summary_input: Any
    tokens_before: int
    input_tokens: int
    reason: str
    history_budget: int
    retained_turns: int
    format: str
    kind: str
    """`rolling` or `segment` (`from_node_id`/`to_node_id` given); `unspecified` if not needed."""
    rolls_over_ids: list[str]
    """Every summary this one rolls over (their texts and ledgers are in the input)."""
    ledger: EvidenceLedger | None
    """The evidence the summary will carry (None when not needed)."""
    ledger_text: str
    """The ledger as the render shows it after the summary text: the summary need not restate
    it."""
    raw: pb.PrepareCompactionResponse = field(repr=False, compare=False)
    summary_request: Any = None
    """With `cache_sharing_request=True`: the host's rendered context then the summary
    instruction, in the format asked for (None otherwise, or when the server sent none)."""


@dataclass(frozen=True)
class Outcome:
    """The answer to a commit (or `compact`): `applied`, else why not in `reason`.

    `reason` is one of `applied`, `empty`, `no_gain`, `stale`, `cancelled`, `failed`,
    `not_needed`.
    """

    applied: bool
    reason: str
    message: str
    summary_id: str
    tokens_before: int
    tokens_after: int
    compaction_id: str

    @classmethod
    def from_pb(cls, o: pb.CompactionOutcome) -> Outcome:
        return cls(
            applied=o.applied,
            reason=enum_name(pb.CompactionReason, o.reason, "COMPACTION_REASON_"),
            message=o.message,
            summary_id=o.summary_id,
            tokens_before=o.tokens_before,
            tokens_after=o.tokens_after,
            compaction_id=o.compaction_id,
        )


@dataclass(frozen=True)
class SummaryRecord:
    """A stored summary; `applies` and `active` refer to the branch that was asked about."""

    summary_id: str
    compaction_id: str
    covers_ids: list[str]
    prior_summary_id: str
    text: str
    model: str
    base_head_id: str
    tokens_before: int
    tokens_after: int
    created_at_unix_ms: int
    applies: bool
    active: bool
    """The branch renders it; several segment summaries and a rolling one may be active."""
    kind: str
    """`rolling` or `segment`."""
    from_node_id: str
    """The first node of the covered range on the path."""
    to_node_id: str
    """The last node of the covered range on the path."""
    rolls_over_ids: list[str]
    """Every summary this one rolls over; `prior_summary_id` is the first of them."""
    ledger: EvidenceLedger | None
    """None on summaries made before ledgers, and on imported ones."""

    @classmethod
    def from_pb(cls, s: pb.SummaryRecord) -> SummaryRecord:
        return cls(
            s.summary_id,
            s.compaction_id,
            list(s.covers_ids),
            s.prior_summary_id,
            s.text,
            s.model,
            s.base_head_id,
            s.tokens_before,
            s.tokens_after,
            s.created_at_unix_ms,
            s.applies,
            s.active,
            summary_kind(s.kind),
            s.from_node_id,
            s.to_node_id,
            list(s.rolls_over_ids),
            ledger_or_none(s),
        )


@dataclass(frozen=True)
class CompactionEvent:
    """One step of the audit trail: `kind` is prepared, committed, rejected or cancelled."""

    compaction_id: str
    branch: str
    kind: str
    reason: str
    base_head_id: str
    tokens_before: int
    tokens_after: int
    summary_id: str
    message: str
    created_at_unix_ms: int

    @classmethod
    def from_pb(cls, e: pb.CompactionEvent) -> CompactionEvent:
        return cls(
            e.compaction_id,
            e.branch,
            e.kind,
            enum_name(pb.CompactionReason, e.reason, "COMPACTION_REASON_"),
            e.base_head_id,
            e.tokens_before,
            e.tokens_after,
            e.summary_id,
            e.message,
            e.created_at_unix_ms,
        )


@dataclass(frozen=True)
class Summaries:
    """Every summary of a session and every compaction event, oldest first."""

    summaries: list[SummaryRecord]
    events: list[CompactionEvent]

    @property
    def active(self) -> SummaryRecord | None:
        """The oldest summary the branch renders with, if any (see `all_active`)."""
        return next((s for s in self.summaries if s.active), None)

    @property
    def all_active(self) -> list[SummaryRecord]:
        """Every summary the branch renders with (disjoint segment summaries, and a rolling
        one), oldest first."""
        return [s for s in self.summaries if s.active]


# ---------------------------------------------------------------- recall


@dataclass(frozen=True)
class Recalled:
    """The original content of a node a render cleared, cut or stubbed (`Client.recall`).

    `content` is a tool result's or function's output exactly; for a message, its text followed by
    each tool call as `[tool call NAME ID] ARGUMENTS`. When `truncated`, it is only the head of the
    `total_chars` characters.
    """

    node_id: str
    kind: str
    """`tool_result`, `function_result`, `message` or `function_call`."""
    content: str
    total_chars: int
    truncated: bool
    tool_call_id: str
    """On a result: the call it answered ("" otherwise)."""
    tool_name: str
    raw: pb.RecallResponse = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, r: pb.RecallResponse) -> Recalled:
        return cls(
            node_id=r.node_id,
            kind=r.kind,
            content=r.content,
            total_chars=r.total_chars,
            truncated=r.truncated,
            tool_call_id=r.tool_call_id,
            tool_name=r.tool_name,
            raw=r,
        )

    @property
    def chars_left_out(self) -> int:
        """Characters of the content not returned (0 unless `truncated`)."""
        return max(self.total_chars - len(self.content), 0) if self.truncated else 0


@dataclass(frozen=True)
class RecallToolDefinitions:
    """The recall tool's definition as the server gives it (`Client.recall_tool`), each parsed
    from its JSON: ready for the `tools` of each API."""

    name: str
    anthropic: dict[str, Any]
    """For Anthropic's Messages API: `{"name", "description", "input_schema"}`."""
    openai: dict[str, Any]
    """For OpenAI chat completions: `{"type": "function", "function": {...}}`."""
    responses: dict[str, Any]
    """For OpenAI's Responses API: `{"type": "function", "name", "description", "parameters"}`."""
    raw: pb.RecallToolResponse = field(repr=False, compare=False)


# ---------------------------------------------------------------- lifecycle and admin


@dataclass(frozen=True)
class SessionPage:
    """One page of `Client.list_sessions`, newest first; `next_page_token` is empty on the last
    page."""

    sessions: list[Session]
    next_page_token: str


@dataclass(frozen=True)
class GatewayCall:
    """One call the model gateway forwarded for a session (`Client.list_gateway_calls`): the
    tokens of the messages the client sent and of those forwarded (estimated at four characters a
    token), the provider's own usage report (`input_tokens` excludes what its prompt cache read or
    wrote), and the forwarded prefix against the previous forwarded request."""

    at_unix_ms: int
    """When the call was recorded (its answer complete)."""
    api: str
    """`anthropic`, `openai` (chat completions) or `responses`."""
    model: str
    client_tokens: int
    forwarded_tokens: int
    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    output_tokens: int
    kept_tokens: int
    """Tokens identical to the previous forwarded request up to its last cache breakpoint: what
    the provider could read from its cache."""
    change: str
    """Why the forwarded prefix differs from the previous request's: `first`, `step:N`, `budget`,
    `marker_moved`, `client_changed`, `expired:MS`; "" when it is the same."""
    unexplained_miss: bool
    """The provider read noticeably less from its cache than `kept_tokens`, and no expiry
    explains it."""
    priced_by: str = ""
    """The model table's entry that priced the call (`claude-opus-5-5`; a `*` marks an
    operator's own entry, from `--models` or `--context-window`)."""
    edit_clear: int | None = None
    """For a model that binds its thinking: the oldest tool uses ctxd's `clear_tool_uses` edit
    asked the provider to clear in place of a step; None when it asked for no edit."""
    edit_keep: int | None = None
    """The newest tool uses that edit kept; None when it asked for no edit."""
    provider_cleared: int | None = None
    """The tool uses the provider reports its edits cleared (`context_management.applied_edits`);
    None when it reported none."""
    provider_cleared_tokens: int | None = None
    """The input tokens those edits cleared; None when it reported none."""
    provider_thinking_dropped: int = 0
    """Thinking blocks the provider dropped as no longer bound to their prefix."""
    thinking_dropped: int = 0
    """Thinking blocks ctxd left out of the forwarded request (`--gateway-reasoning drop`)."""
    cost: float = 0.0
    """The call's cache-weighted input, in plain input tokens, at its model's prices."""

    @classmethod
    def from_pb(cls, c: pb.GatewayCall) -> GatewayCall:
        return cls(
            at_unix_ms=c.at_unix_ms,
            api=c.api,
            model=c.model,
            client_tokens=c.client_tokens,
            forwarded_tokens=c.forwarded_tokens,
            input_tokens=c.input_tokens,
            cache_read_tokens=c.cache_read_tokens,
            cache_write_tokens=c.cache_write_tokens,
            output_tokens=c.output_tokens,
            kept_tokens=c.kept_tokens,
            change=c.change,
            unexplained_miss=c.unexplained_miss,
            priced_by=c.priced_by,
            edit_clear=c.edit_clear if c.HasField("edit_clear") else None,
            edit_keep=c.edit_keep if c.HasField("edit_keep") else None,
            provider_cleared=c.provider_cleared if c.HasField("provider_cleared") else None,
            provider_cleared_tokens=(
                c.provider_cleared_tokens if c.HasField("provider_cleared_tokens") else None
            ),
            provider_thinking_dropped=c.provider_thinking_dropped,
            thinking_dropped=c.thinking_dropped,
            cost=c.cost,
        )


@dataclass(frozen=True)
class GatewayCallPage:
    """One page of `Client.list_gateway_calls`, in the order the calls were made (newest last);
    `next_page_token` is empty on the last page."""

    calls: list[GatewayCall]
    next_page_token: str


@dataclass(frozen=True)
class Tombstone:
    """What stays of a deleted session, for the audit: who deleted it (the tenant, "" on a server
    without keys, or "retention"), when, and what it held."""

    session_id: str
    deleted_by: str
    deleted_at_unix_ms: int
    nodes: int
    branches: int
    summaries: int

    @classmethod
    def from_pb(cls, t: pb.Tombstone) -> Tombstone:
        return cls(
            t.session_id, t.deleted_by, t.deleted_at_unix_ms, t.nodes, t.branches, t.summaries
        )


@dataclass(frozen=True)
class DeletedSession:
    """The answer to `Client.delete_session`: the tombstone, and whether an earlier call had
    deleted the session already (nothing changed then)."""

    tombstone: Tombstone
    already_deleted: bool

    @classmethod
    def from_pb(cls, r: pb.DeleteSessionResponse) -> DeletedSession:
        return cls(Tombstone.from_pb(r.tombstone), r.already_deleted)


@dataclass(frozen=True)
class Imported:
    """A session file imported by `Client.import_session`: the new session, what it holds, the
    format read (detected when not given) and what the importer had to repair."""

    session: Session
    nodes: int
    functions: int
    summaries: int
    format: str
    """`ctxd_jsonl`, `neutral_jsonl`, `claude_code_jsonl` or `openai_messages`."""
    warnings: list[str]
    raw: pb.ImportSessionResponse = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, r: pb.ImportSessionResponse) -> Imported:
        return cls(
            session=Session.from_pb(r.session),
            nodes=r.nodes,
            functions=r.functions,
            summaries=r.summaries,
            format=enum_name(pb.ImportFormat, r.format, "IMPORT_FORMAT_"),
            warnings=list(r.warnings),
            raw=r,
        )


@dataclass(frozen=True)
class ExportChunk:
    """A piece of `Client.export_session`: the export is the concatenation of every `data`. The
    first chunk also has the branches the export is consistent at and the `warnings` (what the
    format could not carry); later ones have neither."""

    data: bytes
    branches: list[Branch]
    warnings: list[str]

    @classmethod
    def from_pb(cls, c: pb.ExportChunk) -> ExportChunk:
        return cls(c.data, [Branch.from_pb(b) for b in c.branches], list(c.warnings))


@dataclass(frozen=True)
class Exported:
    """A finished `Client.export_session_to`: where it went (None for a file object), its size,
    the heads it is consistent at and what the format could not carry."""

    path: str | None
    bytes: int
    format: str
    branches: list[Branch]
    warnings: list[str]


@dataclass(frozen=True)
class WatchEvent:
    """One change seen by `Client.watch`. `kind` says which field is set:

    - `started`: `branches`, the branches as the watch starts;
    - `node`: `node`, appended to `branch` (or to a function's chain: `node.function_id`, and
      `branch` is empty);
    - `head_moved`, `branch_created`, `branch_deleted`: `ref`, the branch afterwards (a deleted
      one with its last head);
    - `compaction`: `compaction`, a summary committed or refused, or a plan prepared or cancelled;
    - `deleted`: `tombstone`; the session was deleted and the watch ends.

    `cursor` resumes the watch right after this event (`watch(after_cursor=...)`).
    """

    cursor: str
    kind: str
    branch: str
    branches: list[Branch] = field(default_factory=list)
    node: Node | None = None
    ref: Branch | None = None
    compaction: CompactionEvent | None = None
    tombstone: Tombstone | None = None
    raw: pb.WatchEvent | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_pb(cls, e: pb.WatchEvent) -> WatchEvent:
        kind = e.WhichOneof("event") or ""
        payload: dict[str, Any] = {}
        if kind == "started":
            payload["branches"] = [Branch.from_pb(b) for b in e.started.branches]
        elif kind == "node":
            payload["node"] = Node.from_pb(e.node)
        elif kind in ("head_moved", "branch_created", "branch_deleted"):
            payload["ref"] = Branch.from_pb(getattr(e, kind))
        elif kind == "compaction":
            payload["compaction"] = CompactionEvent.from_pb(e.compaction)
        elif kind == "deleted":
            payload["tombstone"] = Tombstone.from_pb(e.deleted)
        return cls(cursor=e.cursor, kind=kind, branch=e.branch, raw=e, **payload)


@dataclass(frozen=True)
class Backup:
    """A finished `Client.backup_database`: the file on the server's machine, its size and how
    long the copy took."""

    path: str
    bytes: int
    took_ms: int


@dataclass(frozen=True)
class GarbageCollection:
    """The answer to `Client.collect_garbage`: live sessions and tombstones, the database's size
    after the call and how much of it is free pages writes will reuse (SQLite), and the bytes
    this call gave back to the operating system."""

    sessions: int
    tombstones: int
    database_bytes: int
    free_bytes: int
    released_bytes: int
