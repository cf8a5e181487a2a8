// Plain values the client takes and returns, and their conversion to and from the generated
// protobuf types: short string names instead of numeric enums, `id` instead of `sessionId`, one
// shape for a node's content whether it is appended or read back.
import * as pb from "./gen/ctxd/v1/ctxd";

// ---------------------------------------------------------------- enums as short names

export type Role = "system" | "developer" | "user" | "assistant";
/** Rendered messages also have `tool`: the answer to a tool or function call. */
export type RenderedRole = Role | "tool";
export type Expose = "io" | "full" | "none";
export type FunctionStatus = "completed" | "error";
export type NodeKind = "message" | "toolResult" | "functionCall" | "functionResult";
export type Format = "openai" | "anthropic" | "neutral";
export type Callers = "all" | "none";
/** How a render for a model that binds its thinking to its prefix keeps the reasoning valid:
 * `keep` (the default) says every step as the provider's own edit, `drop` leaves out the
 * thinking a step invalidated. */
export type Reasoning = "keep" | "drop";
export type SummaryKind = "rolling" | "segment";
export type CompactionReason =
  | "applied"
  | "empty"
  | "no_gain"
  | "stale"
  | "cancelled"
  | "failed"
  | "not_needed";
/** How Compact asks the summarizer: the host's rendered context then the instruction
 * (`cache_sharing`), or the covered range alone (`range`). */
export type SummaryRequestForm = "cache_sharing" | "range";
/** `undefined` on import: the server detects it from the first line. `ctxd` is what
 * `exportSession` writes by default: the whole session. */
export type ImportFormat = "neutral" | "claude-code" | "openai" | "ctxd";
/** `ctxd` (the default): the whole session, which `importSession` reads back; `openai` (a chat
 * `messages` array) and `claude-code` (a Claude Code-style JSONL): one branch. */
export type ExportFormat = "ctxd" | "openai" | "claude-code";

const ROLES: Record<Role, pb.Role> = {
  system: pb.Role.ROLE_SYSTEM,
  developer: pb.Role.ROLE_DEVELOPER,
  user: pb.Role.ROLE_USER,
  assistant: pb.Role.ROLE_ASSISTANT,
};
const RENDERED_ROLES: Record<number, RenderedRole> = {
  [pb.Role.ROLE_SYSTEM]: "system",
  [pb.Role.ROLE_DEVELOPER]: "developer",
  [pb.Role.ROLE_USER]: "user",
  [pb.Role.ROLE_ASSISTANT]: "assistant",
  [pb.Role.ROLE_TOOL]: "tool",
};
const EXPOSE: Record<Expose, pb.Expose> = {
  io: pb.Expose.EXPOSE_IO,
  full: pb.Expose.EXPOSE_FULL,
  none: pb.Expose.EXPOSE_NONE,
};
const STATUS: Record<FunctionStatus, pb.FunctionStatus> = {
  completed: pb.FunctionStatus.FUNCTION_STATUS_COMPLETED,
  error: pb.FunctionStatus.FUNCTION_STATUS_ERROR,
};
export const FORMATS: Record<Format, pb.Format> = {
  openai: pb.Format.FORMAT_OPENAI_CHAT,
  anthropic: pb.Format.FORMAT_ANTHROPIC_MESSAGES,
  neutral: pb.Format.FORMAT_NEUTRAL,
};
export const CALLERS: Record<Callers, pb.Callers> = {
  all: pb.Callers.CALLERS_ALL,
  none: pb.Callers.CALLERS_NONE,
};
export const REASONING: Record<Reasoning, pb.Reasoning> = {
  keep: pb.Reasoning.REASONING_KEEP,
  drop: pb.Reasoning.REASONING_DROP,
};
export const IMPORT_FORMATS: Record<ImportFormat, pb.ImportFormat> = {
  neutral: pb.ImportFormat.IMPORT_FORMAT_NEUTRAL_JSONL,
  "claude-code": pb.ImportFormat.IMPORT_FORMAT_CLAUDE_CODE_JSONL,
  openai: pb.ImportFormat.IMPORT_FORMAT_OPENAI_MESSAGES,
  ctxd: pb.ImportFormat.IMPORT_FORMAT_CTXD_JSONL,
};
export const EXPORT_FORMATS: Record<ExportFormat, pb.ExportFormat> = {
  ctxd: pb.ExportFormat.EXPORT_FORMAT_CTXD_JSONL,
  openai: pb.ExportFormat.EXPORT_FORMAT_OPENAI_MESSAGES,
  "claude-code": pb.ExportFormat.EXPORT_FORMAT_CLAUDE_CODE_JSONL,
};

export const SUMMARY_REQUEST_FORMS: Record<SummaryRequestForm, pb.SummaryRequestForm> = {
  cache_sharing: pb.SummaryRequestForm.SUMMARY_REQUEST_FORM_CACHE_SHARING,
  range: pb.SummaryRequestForm.SUMMARY_REQUEST_FORM_RANGE,
};

/** `table[value]`, or a TypeError naming the choices: a JavaScript caller may pass anything. */
export function choice<K extends string, V>(table: Record<K, V>, value: K, what: string): V {
  if (!Object.prototype.hasOwnProperty.call(table, value)) {
    throw new TypeError(`${what} must be one of ${Object.keys(table).join(", ")}, not ${JSON.stringify(value)}`);
  }
  return table[value];
}

/** The short name of an enum value: `COMPACTION_REASON_NO_GAIN` -> `no_gain`. A value newer than
 * the generated code stays its number, as a string. */
function enumName(names: Record<number, string>, value: number, prefix: string): string {
  const name = names[value];
  return name === undefined ? String(value) : name.slice(prefix.length).toLowerCase();
}

// ---------------------------------------------------------------- content

/** One part of a message or tool result: text, or media (bytes, or a URL the model fetches). */
export type Part =
  | { type: "text"; text: string }
  | { type: "media"; mimeType: string; data: Uint8Array }
  | { type: "media"; mimeType: string; url: string };

/** A tool call as read back: `arguments` is the JSON text stored. */
export interface ToolCall {
  id: string;
  name: string;
  arguments: string;
}

/** A tool call to append: `arguments` a JSON string, or any value (encoded as JSON, since the
 * server requires JSON); absent is `{}`. */
export interface ToolCallInput {
  id: string;
  name: string;
  arguments?: unknown;
}

/** What a node holds. The same shape is appended (`NodeInput`) and read back (`Node.content`,
 * with the fields the server fills in). */
export type NodeInput =
  | {
      type: "message";
      role: Role;
      parts: Part[];
      /** Assistant messages only. */
      toolCalls?: ToolCallInput[];
      pinned?: boolean;
    }
  | {
      type: "toolResult";
      callId: string;
      /** Empty on append: the server takes it from the call. */
      name?: string;
      parts: Part[];
      isError?: boolean;
      pinned?: boolean;
    }
  | {
      type: "functionCall";
      callId: string;
      /** Empty on append: the server takes it from the tool call. */
      name?: string;
      input: string;
      expose?: Expose;
      pinned?: boolean;
    }
  | {
      type: "functionResult";
      callId: string;
      output: string;
      status?: FunctionStatus;
      pinned?: boolean;
    };

/** A node's content as read back: tool call arguments are the stored JSON text, and a function
 * result says which function it closed and the head of that function's chain. */
export type NodeContent =
  | (Extract<NodeInput, { type: "message" }> & { toolCalls: ToolCall[] })
  | Extract<NodeInput, { type: "toolResult" }>
  | Extract<NodeInput, { type: "functionCall" }>
  | (Extract<NodeInput, { type: "functionResult" }> & { functionId: string; chainHeadId: string });

function partToPb(part: Part): pb.ContentPart {
  if (part.type === "text") return { part: { $case: "text", value: part.text } };
  if (part.type === "media") {
    const source: pb.Media["source"] =
      "url" in part
        ? { $case: "url", value: part.url }
        : { $case: "data", value: Buffer.from(part.data.buffer, part.data.byteOffset, part.data.byteLength) };
    return { part: { $case: "media", value: { mimeType: part.mimeType, source } } };
  }
  throw new TypeError(`a part's type is "text" or "media", not ${JSON.stringify((part as { type: unknown }).type)}`);
}

export function partFromPb(part: pb.ContentPart): Part | undefined {
  const p = part.part;
  if (p?.$case === "text") return { type: "text", text: p.value };
  if (p?.$case === "media") {
    const { mimeType, source } = p.value;
    if (source?.$case === "url") return { type: "media", mimeType, url: source.value };
    // A Buffer is a Uint8Array; a plain one compares equal to what was appended.
    const data = source?.$case === "data" ? new Uint8Array(source.value) : new Uint8Array();
    return { type: "media", mimeType, data };
  }
  return undefined; // a part kind newer than this client
}

export function partsFromPb(parts: pb.ContentPart[]): Part[] {
  return parts.map(partFromPb).filter((p): p is Part => p !== undefined);
}

/** The text of parts, one part a line; media contributes nothing. */
export function textOf(parts: Part[]): string {
  return parts
    .filter((p): p is Extract<Part, { type: "text" }> => p.type === "text")
    .map((p) => p.text)
    .join("\n");
}

function toolCallToPb(call: ToolCallInput): pb.ToolCall {
  const args = call.arguments;
  const argumentsJson = args === undefined || args === null ? "{}" : typeof args === "string" ? args : JSON.stringify(args);
  return { callId: call.id, name: call.name, argumentsJson };
}

function toolCallFromPb(call: pb.ToolCall): ToolCall {
  return { id: call.callId, name: call.name, arguments: call.argumentsJson };
}

export function nodeInputToPb(node: NodeInput, pinAll = false): pb.NodeInput {
  const pinned = pinAll || node.pinned === true;
  switch (node.type) {
    case "message":
      return {
        pinned,
        kind: {
          $case: "message",
          value: {
            role: choice(ROLES, node.role, "role"),
            parts: node.parts.map(partToPb),
            toolCalls: (node.toolCalls ?? []).map(toolCallToPb),
          },
        },
      };
    case "toolResult":
      return {
        pinned,
        kind: {
          $case: "toolResult",
          value: { callId: node.callId, name: node.name ?? "", parts: node.parts.map(partToPb), isError: node.isError ?? false },
        },
      };
    case "functionCall":
      return {
        pinned,
        kind: {
          $case: "functionCall",
          value: {
            callId: node.callId,
            name: node.name ?? "",
            input: node.input,
            expose: choice(EXPOSE, node.expose ?? "io", "expose"),
          },
        },
      };
    case "functionResult":
      return {
        pinned,
        kind: {
          $case: "functionResult",
          value: {
            callId: node.callId,
            output: node.output,
            status: choice(STATUS, node.status ?? "completed", "status"),
            functionId: "",
            chainHeadId: "",
          },
        },
      };
    default:
      throw new TypeError(`a node's type is message, toolResult, functionCall or functionResult, not ${JSON.stringify((node as { type: unknown }).type)}`);
  }
}

export function nodeContentFromPb(node: pb.NodeInput | undefined): NodeContent | undefined {
  const kind = node?.kind;
  const pinned = node?.pinned ?? false;
  switch (kind?.$case) {
    case "message": {
      const m = kind.value;
      return {
        type: "message",
        role: (RENDERED_ROLES[m.role] ?? String(m.role)) as Role,
        parts: partsFromPb(m.parts),
        toolCalls: m.toolCalls.map(toolCallFromPb),
        pinned,
      };
    }
    case "toolResult": {
      const r = kind.value;
      return { type: "toolResult", callId: r.callId, name: r.name, parts: partsFromPb(r.parts), isError: r.isError, pinned };
    }
    case "functionCall": {
      const c = kind.value;
      return {
        type: "functionCall",
        callId: c.callId,
        name: c.name,
        input: c.input,
        expose: enumName(pb.Expose, c.expose || pb.Expose.EXPOSE_IO, "EXPOSE_") as Expose,
        pinned,
      };
    }
    case "functionResult": {
      const r = kind.value;
      return {
        type: "functionResult",
        callId: r.callId,
        output: r.output,
        status: enumName(pb.FunctionStatus, r.status || pb.FunctionStatus.FUNCTION_STATUS_COMPLETED, "FUNCTION_STATUS_") as FunctionStatus,
        functionId: r.functionId,
        chainHeadId: r.chainHeadId,
        pinned,
      };
    }
    default:
      return undefined;
  }
}

// ---------------------------------------------------------------- sessions, branches, nodes

/** A named ref to a head node; `headId` is empty while the branch has no node. */
export interface Branch {
  name: string;
  headId: string;
  /** Equal histories have equal head hashes. */
  headHash: string;
  updatedAtUnixMs: number;
}

export interface Session {
  id: string;
  createdAtUnixMs: number;
  metadata: Record<string, string>;
  compactionCount: number;
  branches: Branch[];
  /** Every node stored for the session, on all branches and in its functions' internal chains;
   * set by `getSession` and `listSessions` (0 in what other calls answer). */
  nodeCount: number;
}

/** A `Session` or its id: every method taking a session takes either. */
export type SessionRef = Session | string;

export function sessionId(session: SessionRef): string {
  return typeof session === "string" ? session : session.id;
}

export function branchFromPb(b: pb.Branch): Branch {
  return { name: b.name, headId: b.headId, headHash: b.headHash, updatedAtUnixMs: b.updatedAtUnixMs };
}

export function sessionFromPb(s: pb.Session): Session {
  return {
    id: s.sessionId,
    createdAtUnixMs: s.createdAtUnixMs,
    metadata: { ...s.metadata },
    compactionCount: s.compactionCount,
    branches: s.branches.map(branchFromPb),
    nodeCount: s.nodeCount,
  };
}

/** What an append wrote: the new node ids in order, and the target's new head. */
export interface Appended {
  nodeIds: string[];
  /** The last node written. */
  nodeId: string;
  headId: string;
  headHash: string;
}

export function appendedFromPb(r: pb.AppendResponse): Appended {
  return { nodeIds: r.nodeIds, nodeId: r.nodeIds[r.nodeIds.length - 1] ?? "", headId: r.headId, headHash: r.headHash };
}

/** One stored node. */
export interface Node {
  id: string;
  /** Empty for the first node of a session. */
  parentId: string;
  kind: NodeKind;
  content: NodeContent;
  createdAtUnixMs: number;
  hash: string;
  /** The function_call node whose chain holds this node; empty at top level. */
  functionId: string;
  /** Pinned now (on append, or by `pin`, and not unpinned since). */
  pinned: boolean;
}

const NODE_KINDS: Record<number, NodeKind> = {
  [pb.NodeKind.NODE_KIND_MESSAGE]: "message",
  [pb.NodeKind.NODE_KIND_TOOL_RESULT]: "toolResult",
  [pb.NodeKind.NODE_KIND_FUNCTION_CALL]: "functionCall",
  [pb.NodeKind.NODE_KIND_FUNCTION_RESULT]: "functionResult",
};

export function nodeFromPb(n: pb.Node): Node {
  const content = nodeContentFromPb(n.content);
  if (!content) throw new TypeError(`node ${n.nodeId} has content this client does not know (kind ${n.kind})`);
  return {
    id: n.nodeId,
    parentId: n.parentId,
    kind: NODE_KINDS[n.kind] ?? content.type,
    content: { ...content, pinned: n.pinned },
    createdAtUnixMs: n.createdAtUnixMs,
    hash: n.hash,
    functionId: n.functionId,
    pinned: n.pinned,
  };
}

// ---------------------------------------------------------------- rendering

/** The next request's token budget: a context window, or its parts. The history may use
 * contextWindow − outputReserve − systemTokens − toolsTokens − schemaTokens. */
export type BudgetLike = number | Partial<pb.Budget> & { contextWindow: number };

export function budgetToPb(budget: BudgetLike): pb.Budget {
  const b = typeof budget === "number" ? { contextWindow: budget } : budget;
  return pb.Budget.fromPartial(b);
}

/** How the engine fits a path into a budget (zero or absent: the server's default).
 * `cacheReadPrice` and `cacheWritePrice` (each between 0 and 100) are what a token read from
 * and written to the provider's cache cost relative to a plain input token (absent: the render's
 * `model`'s, else 0.1 and 1.25); `reasoning` is `"keep"` or `"drop"` (or the enum). */
export type RenderPolicy = Partial<Omit<pb.RenderPolicy, "reasoning">> & { reasoning?: Reasoning | pb.Reasoning };

/** A policy as the server reads it: `reasoning` by its short name, or a number passed on as it
 * is (one the server does not know is refused there, naming `policy.reasoning`). */
export function policyToPb(policy: RenderPolicy | undefined, reactive = false): pb.RenderPolicy {
  const { reasoning, ...rest } = policy ?? {};
  return pb.RenderPolicy.fromPartial({
    ...rest,
    ...(reasoning === undefined ? {} : { reasoning: typeof reasoning === "number" ? reasoning : choice(REASONING, reasoning, "policy.reasoning") }),
    ...(reactive ? { reactive: true } : {}),
  });
}
export type ContextReport = pb.ContextReport;
export type EvidenceLedger = pb.EvidenceLedger;

/** A rendered message, provider-neutral: what a model would read, and where it came from. */
export interface RenderedMessage {
  role: RenderedRole;
  parts: Part[];
  /** The text parts joined by newlines. */
  text: string;
  toolCalls: ToolCall[];
  /** Set on tool messages. */
  toolCallId: string;
  name: string;
  isError: boolean;
  /** The nodes this message came from. */
  nodeIds: string[];
  /** Set on messages from inside a function's internal chain. */
  functionId: string;
  tokens: number;
  /** Budget reduction kept the head and tail of this tool result. */
  truncated: boolean;
  /** Microcompact replaced this tool result by a one-line placeholder. */
  cleared: boolean;
  inputsStubbed: number;
  pinned: boolean;
}

export function renderedFromPb(m: pb.RenderedMessage): RenderedMessage {
  const parts = partsFromPb(m.parts);
  return {
    role: RENDERED_ROLES[m.role] ?? (String(m.role) as RenderedRole),
    parts,
    text: textOf(parts),
    toolCalls: m.toolCalls.map(toolCallFromPb),
    toolCallId: m.toolCallId,
    name: m.name,
    isError: m.isError,
    nodeIds: m.nodeIds,
    functionId: m.functionId,
    tokens: m.tokens,
    truncated: m.truncated,
    cleared: m.cleared,
    inputsStubbed: m.inputsStubbed,
    pinned: m.pinned,
  };
}

// Provider documents, typed loosely: enough to read them, and they go to the provider as they are.

/** One message of an OpenAI chat-completions `messages` array. */
export interface OpenAIChatMessage {
  role: "system" | "developer" | "user" | "assistant" | "tool";
  content: string | null | Array<{ type: "text"; text: string } | { type: "image_url"; image_url: { url: string } }>;
  tool_calls?: Array<{ id: string; type: "function"; function: { name: string; arguments: string } }>;
  tool_call_id?: string;
}

/** An Anthropic Messages API request's `{system, messages}` (`system` only when there is one),
 * and for a model that binds its thinking, the `context_management` edit that is a step (send it
 * with the render's `betas`). */
export interface AnthropicDocument {
  system?: string | Array<{ type: "text"; text: string }>;
  messages: Array<{ role: "user" | "assistant"; content: string | Array<AnthropicBlock> }>;
  context_management?: { edits: Array<{ type: string; [key: string]: unknown }> };
}
export type AnthropicBlock =
  | { type: "text"; text: string }
  | { type: "image" | "document"; source: { type: "base64"; media_type: string; data: string } | { type: "url"; url: string } }
  | { type: "tool_use"; id: string; name: string; input: Record<string, unknown> }
  | { type: "tool_result"; tool_use_id: string; content: string | Array<AnthropicBlock>; is_error?: boolean }
  | { type: "thinking"; thinking: string; signature: string }
  | { type: "redacted_thinking"; data: string };

/** What `render` gives for each format. */
export interface FormatDocuments {
  openai: OpenAIChatMessage[];
  anthropic: AnthropicDocument;
  neutral: RenderedMessage[];
}

export interface RenderResult<F extends Format = Format> {
  format: F;
  /** In the requested format: OpenAI's `messages` array, Anthropic's `{system, messages}`, or the
   * neutral messages. */
  messages: FormatDocuments[F];
  /** The neutral messages, whatever the format (what the Vercel AI SDK adapter reads). */
  rendered: RenderedMessage[];
  report: ContextReport;
  headId: string;
  headHash: string;
  totalTokens: number;
  tokenizer: string;
  /** Media parts the format sent only as `[<mime> attachment]` text (`nodeId` empty for a
   * summary). */
  uncarried: UncarriedPart[];
  /** The `anthropic-beta` values to send with the document (`context-management-2025-06-27`
   * when it carries a `context_management` edit). */
  betas: string[];
}

export interface UncarriedPart {
  nodeId: string;
  partIndex: number;
  mimeType: string;
}

// ---------------------------------------------------------------- summaries

export interface Compaction<F extends Format = Format> {
  /** False: the history fits, and nothing was stored. */
  needed: boolean;
  /** Empty when not needed. */
  compactionId: string;
  baseHeadId: string;
  coversIds: string[];
  priorSummaryId: string;
  /** What the summarizer should read, in the requested format ([] when not needed). */
  summaryInput: FormatDocuments[F] | [];
  /** The summary input as neutral messages. */
  rendered: RenderedMessage[];
  tokensBefore: number;
  inputTokens: number;
  /** Why it is or is not needed. */
  reason: string;
  historyBudget: number;
  retainedTurns: number;
  kind: SummaryKind | "";
  rollsOverIds: string[];
  ledger: EvidenceLedger | undefined;
  /** Rendered after the summary text, so the summary need not restate it. */
  ledgerText: string;
  /** With `cacheSharingRequest`: the host's rendered context then the summary instruction, in
   * the requested format (undefined otherwise, or when the server sent none). */
  summaryRequest?: FormatDocuments[F];
}

export interface Outcome {
  applied: boolean;
  /** Set when applied. */
  summaryId: string;
  tokensBefore: number;
  tokensAfter: number;
  reason: CompactionReason;
  message: string;
  compactionId: string;
}

export function outcomeFromPb(o: pb.CompactionOutcome): Outcome {
  return {
    applied: o.applied,
    summaryId: o.summaryId,
    tokensBefore: o.tokensBefore,
    tokensAfter: o.tokensAfter,
    reason: enumName(pb.CompactionReason, o.reason, "COMPACTION_REASON_") as CompactionReason,
    message: o.message,
    compactionId: o.compactionId,
  };
}

export function summaryKind(kind: pb.SummaryKind): SummaryKind | "" {
  return kind === pb.SummaryKind.SUMMARY_KIND_UNSPECIFIED ? "" : (enumName(pb.SummaryKind, kind, "SUMMARY_KIND_") as SummaryKind);
}

export type SummaryRecord = Omit<pb.SummaryRecord, "kind"> & { kind: SummaryKind | "" };
export type CompactionEvent = Omit<pb.CompactionEvent, "reason"> & { reason: CompactionReason | "" };

export interface Summaries {
  /** Oldest first. */
  summaries: SummaryRecord[];
  /** Oldest first. */
  events: CompactionEvent[];
}

export function summariesFromPb(r: pb.ListSummariesResponse): Summaries {
  return {
    summaries: r.summaries.map((s) => ({ ...s, kind: summaryKind(s.kind) })),
    events: r.events.map(compactionEventFromPb),
  };
}

// ---------------------------------------------------------------- import

export interface Imported {
  session: Session;
  nodes: number;
  functions: number;
  summaries: number;
  format: ImportFormat | "";
  /** What the importer had to repair (a call without a result closed as an error, say). */
  warnings: string[];
}

export function importedFromPb(r: pb.ImportSessionResponse): Imported {
  const format = (Object.keys(IMPORT_FORMATS) as ImportFormat[]).find((k) => IMPORT_FORMATS[k] === r.format) ?? "";
  if (!r.session) throw new TypeError("ImportSession answered no session");
  return {
    session: sessionFromPb(r.session),
    nodes: r.nodes,
    functions: r.functions,
    summaries: r.summaries,
    format,
    warnings: r.warnings,
  };
}

// ---------------------------------------------------------------- recall

/** The original content of a node a render cleared, cut or stubbed (`Client.recall`). */
export interface Recalled {
  nodeId: string;
  /** `tool_result`, `function_result`, `message` or `function_call`. */
  kind: string;
  /** A tool result's or function's output exactly; a message's text, then each tool call as
   * `[tool call NAME ID] ARGUMENTS`. Only the head when `truncated`. */
  content: string;
  /** Characters (Unicode code points) of the whole content. */
  totalChars: number;
  truncated: boolean;
  /** On a result: the call it answered, and the tool's name. */
  toolCallId: string;
  toolName: string;
}

export function recalledFromPb(r: pb.RecallResponse): Recalled {
  return {
    nodeId: r.nodeId,
    kind: r.kind,
    content: r.content,
    totalChars: r.totalChars,
    truncated: r.truncated,
    toolCallId: r.toolCallId,
    toolName: r.toolName,
  };
}

/** The recall tool's definition as the server gives it, each parsed from its JSON. */
export interface RecallToolDefinitions {
  name: string;
  /** For Anthropic's Messages API: `{ name, description, input_schema }`. */
  anthropic: Record<string, unknown>;
  /** For OpenAI chat completions: `{ type: "function", function: { name, description, parameters } }`. */
  openai: Record<string, unknown>;
  /** For OpenAI's Responses API: `{ type: "function", name, description, parameters }`. */
  responses: Record<string, unknown>;
}

// ---------------------------------------------------------------- lifecycle

/** One call the model gateway forwarded for a session (`listGatewayCalls`): the tokens of the
 * messages the client sent and of those forwarded (estimated at four characters a token), the
 * provider's own usage (`inputTokens` excludes what its prompt cache read or wrote), and the
 * forwarded prefix against the previous forwarded request. */
export interface GatewayCall {
  /** When the call was recorded (its answer complete). */
  atUnixMs: number;
  /** `anthropic`, `openai` (chat completions) or `responses`. */
  api: string;
  model: string;
  clientTokens: number;
  forwardedTokens: number;
  inputTokens: number;
  cacheReadTokens: number;
  cacheWriteTokens: number;
  outputTokens: number;
  /** Tokens identical to the previous forwarded request up to its last cache breakpoint: what
   * the provider could read from its cache. */
  keptTokens: number;
  /** Why the forwarded prefix differs from the previous request's: `first`, `step:N`, `budget`,
   * `marker_moved`, `client_changed`, `expired:MS`; `""` when it is the same. */
  change: string;
  /** The provider read noticeably less from its cache than `keptTokens`, and no expiry
   * explains it. */
  unexplainedMiss: boolean;
  /** The model table's entry that priced the call (`claude-opus-5-5`; a `*` marks an operator's
   * own entry, from `--models` or `--context-window`). */
  pricedBy: string;
  /** For a model that binds its thinking: the oldest tool uses ctxd's `clear_tool_uses` edit
   * asked the provider to clear in place of a step, and the newest it kept; absent when it
   * asked for no edit. */
  editClear?: number;
  editKeep?: number;
  /** The tool uses and input tokens the provider reports its edits cleared
   * (`context_management.applied_edits`); absent when it reported none. */
  providerCleared?: number;
  providerClearedTokens?: number;
  /** Thinking blocks the provider dropped as no longer bound to their prefix. */
  providerThinkingDropped: number;
  /** Thinking blocks ctxd left out of the forwarded request (`--gateway-reasoning drop`). */
  thinkingDropped: number;
  /** The call's cache-weighted input, in plain input tokens, at its model's prices. */
  cost: number;
}

export function gatewayCallFromPb(c: pb.GatewayCall): GatewayCall {
  return {
    atUnixMs: c.atUnixMs,
    api: c.api,
    model: c.model,
    clientTokens: c.clientTokens,
    forwardedTokens: c.forwardedTokens,
    inputTokens: c.inputTokens,
    cacheReadTokens: c.cacheReadTokens,
    cacheWriteTokens: c.cacheWriteTokens,
    outputTokens: c.outputTokens,
    keptTokens: c.keptTokens,
    change: c.change,
    unexplainedMiss: c.unexplainedMiss,
    pricedBy: c.pricedBy,
    editClear: c.editClear,
    editKeep: c.editKeep,
    providerCleared: c.providerCleared,
    providerClearedTokens: c.providerClearedTokens,
    providerThinkingDropped: c.providerThinkingDropped,
    thinkingDropped: c.thinkingDropped,
    cost: c.cost,
  };
}

/** What is left of a deleted session, for the audit. */
export interface Tombstone {
  sessionId: string;
  /** The tenant whose key deleted it (`""` on a server without keys), or `retention`. */
  deletedBy: string;
  deletedAtUnixMs: number;
  /** Nodes the session held. */
  nodes: number;
  branches: number;
  summaries: number;
}

export function tombstoneFromPb(t: pb.Tombstone | undefined): Tombstone {
  // A tombstone is what DeleteSession and a `deleted` event exist to carry.
  if (!t) throw new TypeError("the server sent no tombstone");
  return {
    sessionId: t.sessionId,
    deletedBy: t.deletedBy,
    deletedAtUnixMs: t.deletedAtUnixMs,
    nodes: t.nodes,
    branches: t.branches,
    summaries: t.summaries,
  };
}

/** What `deleteSession` answers. */
export interface Deleted {
  tombstone: Tombstone;
  /** The session had been deleted before this call; nothing changed. */
  alreadyDeleted: boolean;
}

/** One piece of an export: the file is the concatenation of every chunk's `data`. */
export interface ExportChunk {
  data: Buffer;
  /** First chunk only: the heads the export is consistent at. */
  branches: Branch[];
  /** First chunk only: what the format could not carry (other branches, summaries, ...). */
  warnings: string[];
}

/** What `exportToFile` wrote. */
export interface Exported {
  path: string;
  bytes: number;
  /** The heads the export is consistent at. */
  branches: Branch[];
  warnings: string[];
}

/** A copy of the database made by `backupDatabase`, on the server's machine. */
export interface Backup {
  path: string;
  bytes: number;
  tookMs: number;
}

/** What `collectGarbage` found and gave back. */
export interface GarbageCollected {
  sessions: number;
  tombstones: number;
  /** The database's size after the call, and how much of it is free pages writes will reuse. */
  databaseBytes: number;
  freeBytes: number;
  /** Given back to the operating system by this call. */
  releasedBytes: number;
}

// ---------------------------------------------------------------- watch

interface WatchBase {
  /** Resumes right after this event: `watch(s, { afterCursor })`. */
  cursor: string;
  /** The branch the event is about; empty for a node of a function's chain and for `deleted`. */
  branch: string;
}

/**
 * One change of a watched session, by `type`:
 * - `started`: the first event, the branches as the watch starts;
 * - `node`: a node appended to the branch, or to a function's chain (`node.functionId`);
 * - `headMoved`: the head moved other than by an append (`resetBranch`), `ref` is the branch now;
 * - `branchCreated`, `branchDeleted` (`ref.headId` is where it pointed);
 * - `compaction`: a summary committed or refused, or a plan prepared or cancelled;
 * - `deleted`: the session was deleted; the watch ends after it;
 * - `unknown`: an event newer than this client (its cursor still counts).
 */
export type WatchEvent = WatchBase &
  (
    | { type: "started"; branches: Branch[] }
    | { type: "node"; node: Node }
    | { type: "headMoved" | "branchCreated" | "branchDeleted"; ref: Branch }
    | { type: "compaction"; compaction: CompactionEvent }
    | { type: "deleted"; tombstone: Tombstone }
    | { type: "unknown" }
  );

function compactionEventFromPb(e: pb.CompactionEvent): CompactionEvent {
  return {
    ...e,
    reason:
      e.reason === pb.CompactionReason.COMPACTION_REASON_UNSPECIFIED
        ? ""
        : (enumName(pb.CompactionReason, e.reason, "COMPACTION_REASON_") as CompactionReason),
  };
}

export function watchEventFromPb(e: pb.WatchEvent): WatchEvent {
  const base = { cursor: e.cursor, branch: e.branch };
  const event = e.event;
  switch (event?.$case) {
    case "started":
      return { ...base, type: "started", branches: event.value.branches.map(branchFromPb) };
    case "node":
      return { ...base, type: "node", node: nodeFromPb(event.value) };
    case "headMoved":
    case "branchCreated":
    case "branchDeleted":
      return { ...base, type: event.$case, ref: branchFromPb(event.value) };
    case "compaction":
      return { ...base, type: "compaction", compaction: compactionEventFromPb(event.value) };
    case "deleted":
      return { ...base, type: "deleted", tombstone: tombstoneFromPb(event.value) };
    default:
      return { ...base, type: "unknown" };
  }
}
