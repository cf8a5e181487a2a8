// Node builders: the NodeInputs of an append batch, from plain text or parts.
import type { Expose, FunctionStatus, NodeInput, Part, Role, ToolCallInput } from "./types";

/** Text or parts. An empty text is no part at all: an assistant turn that only calls tools has
 * no text. */
export type Content = string | Part[];

export interface NodeOptions {
  /** Pin the node on append: never reduced by a render, shown verbatim after a summary. */
  pinned?: boolean;
}

function parts(content: Content): Part[] {
  if (typeof content !== "string") return content;
  return content === "" ? [] : [{ type: "text", text: content }];
}

/** A text part. */
export function text(text: string): Part {
  return { type: "text", text };
}

/** A media part: bytes (sent inline) or a URL (stored as given). */
export function media(mimeType: string, source: Uint8Array | string | URL): Part {
  if (source instanceof Uint8Array) return { type: "media", mimeType, data: source };
  return { type: "media", mimeType, url: String(source) };
}

export function message(role: Role, content: Content, options: NodeOptions & { toolCalls?: ToolCallInput[] } = {}): NodeInput {
  const node: NodeInput = { type: "message", role, parts: parts(content), pinned: options.pinned ?? false };
  if (options.toolCalls?.length) node.toolCalls = options.toolCalls;
  return node;
}

export function systemMessage(content: Content, options?: NodeOptions): NodeInput {
  return message("system", content, options);
}

export function developerMessage(content: Content, options?: NodeOptions): NodeInput {
  return message("developer", content, options);
}

export function userMessage(content: Content, options?: NodeOptions): NodeInput {
  return message("user", content, options);
}

/** An assistant message; until each of its tool calls is answered, nothing else may follow. */
export function assistantMessage(content: Content = "", toolCalls: ToolCallInput[] = [], options?: NodeOptions): NodeInput {
  return message("assistant", content, { ...options, toolCalls });
}

/** The result of a pending tool call of the latest assistant message; the server fills in the
 * tool's name. */
export function toolResult(callId: string, content: Content, options: NodeOptions & { isError?: boolean } = {}): NodeInput {
  return { type: "toolResult", callId, parts: parts(content), isError: options.isError ?? false, pinned: options.pinned ?? false };
}

/** Opens a sub-agent (function) answering the pending tool call `callId`; nodes appended with
 * `functionId` set to this node's id form its own chain. */
export function functionCall(callId: string, input: string, options: NodeOptions & { expose?: Expose } = {}): NodeInput {
  return { type: "functionCall", callId, input, expose: options.expose ?? "io", pinned: options.pinned ?? false };
}

/** Closes the running function opened for `callId`, on the caller's chain. */
export function functionResult(callId: string, output: string, options: NodeOptions & { status?: FunctionStatus } = {}): NodeInput {
  return { type: "functionResult", callId, output, status: options.status ?? "completed", pinned: options.pinned ?? false };
}
