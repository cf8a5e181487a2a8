// The Vercel AI SDK adapter: its ModelMessage shape to ctxd NodeInputs (for append), and a
// rendered context back to ModelMessage[] (for generateText/streamText), without the `ai` package
// at run time: the types below are declared here, structurally compatible with the SDK's. Also
// the recall tool as an SDK tool (`tools: { recall: recallTool(ctxd, session) }`).
import type { Client } from "./client";
import { handleRecall, RECALL_TOOL_DESCRIPTION, RECALL_TOOL_PARAMETERS } from "./recall";
import type { NodeInput, Part, RenderedMessage, SessionRef } from "./types";

// ---------------------------------------------------------------- the SDK's shapes (a subset)

/** Base64 text, bytes, or (in the SDK) a URL string. */
export type DataContent = string | Uint8Array | ArrayBuffer;
type JSONValue = null | string | number | boolean | JSONValue[] | { [key: string]: JSONValue | undefined };

export interface TextPart { type: "text"; text: string }
export interface ImagePart { type: "image"; image: DataContent | URL; mediaType?: string }
export interface FilePart { type: "file"; data: DataContent | URL; filename?: string; mediaType: string }
export interface ToolCallPart { type: "tool-call"; toolCallId: string; toolName: string; input: unknown }
export type ToolResultContent = Array<
  | { type: "text"; text: string }
  | { type: "image-data" | "file-data"; data: string; mediaType: string }
  | { type: "image-url"; url: string }
  | { type: "file-url"; url: string; mediaType?: string }
>;
export type ToolResultOutput =
  | { type: "text"; value: string }
  | { type: "json"; value: JSONValue }
  | { type: "error-text"; value: string }
  | { type: "error-json"; value: JSONValue }
  | { type: "content"; value: ToolResultContent };
export interface ToolResultPart { type: "tool-result"; toolCallId: string; toolName: string; output: ToolResultOutput }

export type SystemModelMessage = { role: "system"; content: string };
export type UserModelMessage = { role: "user"; content: string | Array<TextPart | ImagePart | FilePart> };
export type AssistantModelMessage = { role: "assistant"; content: string | Array<TextPart | FilePart | ToolCallPart> };
export type ToolModelMessage = { role: "tool"; content: ToolResultPart[] };
/** The messages `toModelMessages` makes: assignable to the SDK's `ModelMessage`. */
export type ModelMessage = SystemModelMessage | UserModelMessage | AssistantModelMessage | ToolModelMessage;

/** What `toNodeInputs` reads: any SDK `ModelMessage` (v5 and later) fits. Parts ctxd cannot
 * store (tool approvals, provider-executed results) throw; reasoning is left out. */
export interface ModelMessageLike {
  role: "system" | "user" | "assistant" | "tool";
  content: string | ReadonlyArray<{ type: string }>;
}

// ---------------------------------------------------------------- to ctxd

function bytesOf(data: Uint8Array | ArrayBuffer): Uint8Array {
  return data instanceof Uint8Array ? data : new Uint8Array(data);
}

/** A media part from the SDK's data: bytes, base64, a `data:` URL, or a URL. */
function mediaPart(data: DataContent | URL, mediaType: string | undefined): Part {
  if (data instanceof URL || (typeof data === "string" && /^[a-z][a-z0-9+.-]*:/i.test(data))) {
    const url = String(data);
    const inline = /^data:([^;,]+)?(;base64)?,(.*)$/s.exec(url);
    if (inline) {
      const bytes = inline[2] ? Buffer.from(inline[3], "base64") : Buffer.from(decodeURIComponent(inline[3]));
      return { type: "media", mimeType: mediaType ?? inline[1] ?? "application/octet-stream", data: new Uint8Array(bytes) };
    }
    return { type: "media", mimeType: mediaType ?? "application/octet-stream", url };
  }
  const bytes = typeof data === "string" ? new Uint8Array(Buffer.from(data, "base64")) : bytesOf(data);
  return { type: "media", mimeType: mediaType ?? sniffImage(bytes), data: bytes };
}

/** The type of an image given without one (the SDK allows that), from its first bytes. */
function sniffImage(b: Uint8Array): string {
  const starts = (...sig: number[]) => sig.every((x, i) => b[i] === x);
  if (starts(0x89, 0x50, 0x4e, 0x47)) return "image/png";
  if (starts(0xff, 0xd8, 0xff)) return "image/jpeg";
  if (starts(0x47, 0x49, 0x46, 0x38)) return "image/gif";
  if (starts(0x52, 0x49, 0x46, 0x46) && b[8] === 0x57 && b[9] === 0x45 && b[10] === 0x42 && b[11] === 0x50) return "image/webp";
  throw new TypeError("an image part without mediaType whose type cannot be told from its bytes: set mediaType");
}

function unsupported(role: string, type: string): never {
  throw new TypeError(`ctxd cannot store a ${JSON.stringify(type)} part of a ${role} message`);
}

function toolOutput(output: ToolResultOutput | { type: string; reason?: string }): { parts: Part[]; isError: boolean } {
  switch (output.type) {
    case "text":
    case "error-text":
      return { parts: textParts((output as { value: string }).value), isError: output.type === "error-text" };
    case "json":
    case "error-json":
      return { parts: textParts(JSON.stringify((output as { value: JSONValue }).value)), isError: output.type === "error-json" };
    case "execution-denied": {
      const reason = (output as { reason?: string }).reason;
      return { parts: textParts(reason ? `execution denied: ${reason}` : "execution denied"), isError: true };
    }
    case "content": {
      const parts: Part[] = [];
      for (const item of (output as { value: ReadonlyArray<{ type: string }> }).value) {
        const i = item as Record<string, string>;
        if (i.type === "text") parts.push({ type: "text", text: i.text });
        else if (i.type === "media" || i.type === "image-data" || i.type === "file-data") parts.push(mediaPart(i.data, i.mediaType));
        else if (i.type === "image-url" || i.type === "file-url") parts.push(mediaPart(new URL(i.url), i.mediaType));
        else unsupported("tool result", i.type);
      }
      return { parts, isError: false };
    }
    default:
      return unsupported("tool result", output.type);
  }
}

function textParts(text: string): Part[] {
  return text === "" ? [] : [{ type: "text", text }];
}

/**
 * The ctxd nodes for SDK messages, in order, ready for `client.append`: system and user messages
 * as messages, an assistant message with its tool calls (inputs as JSON), and one tool result
 * node per result of a tool message. A file's `filename` and any `providerOptions` are not
 * stored.
 */
export function toNodeInputs(messages: ReadonlyArray<ModelMessage | ModelMessageLike>): NodeInput[] {
  const nodes: NodeInput[] = [];
  for (const message of messages) {
    const { role } = message;
    if (role === "tool") {
      for (const part of message.content as ReadonlyArray<{ type: string }>) {
        if (part.type !== "tool-result") unsupported(role, part.type);
        const r = part as ToolResultPart;
        nodes.push({ type: "toolResult", callId: r.toolCallId, ...toolOutput(r.output) });
      }
      continue;
    }
    if (role !== "system" && role !== "user" && role !== "assistant") throw new TypeError(`unknown role ${JSON.stringify(role)}`);
    if (typeof message.content === "string") {
      nodes.push({ type: "message", role, parts: textParts(message.content) });
      continue;
    }
    const parts: Part[] = [];
    const toolCalls: { id: string; name: string; arguments: unknown }[] = [];
    for (const part of message.content) {
      if (part.type === "text") parts.push({ type: "text", text: (part as TextPart).text });
      else if (part.type === "image" && role === "user") parts.push(mediaPart((part as ImagePart).image, (part as ImagePart).mediaType));
      else if (part.type === "file" && role !== "system") parts.push(mediaPart((part as FilePart).data, (part as FilePart).mediaType));
      else if (part.type === "tool-call" && role === "assistant") {
        const call = part as ToolCallPart & { providerExecuted?: boolean };
        if (call.providerExecuted) unsupported(role, "provider-executed tool-call");
        toolCalls.push({ id: call.toolCallId, name: call.toolName, arguments: JSON.stringify(call.input ?? {}) });
      } else if (part.type === "reasoning" && role === "assistant") {
        // ctxd keeps what the next request sends; providers do not take reasoning back as input.
      } else unsupported(role, part.type);
    }
    nodes.push(toolCalls.length ? { type: "message", role, parts, toolCalls } : { type: "message", role, parts });
  }
  return nodes;
}

// ---------------------------------------------------------------- from ctxd

function base64(data: Uint8Array): string {
  return Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("base64");
}

function userPart(part: Part): TextPart | ImagePart | FilePart {
  if (part.type === "text") return { type: "text", text: part.text };
  const source = "url" in part ? new URL(part.url) : part.data;
  return part.mimeType.startsWith("image/")
    ? { type: "image", image: source, mediaType: part.mimeType }
    : { type: "file", data: source, mediaType: part.mimeType };
}

function resultOutput(m: RenderedMessage): ToolResultOutput {
  if (m.parts.every((p) => p.type === "text")) return { type: m.isError ? "error-text" : "text", value: m.text };
  const value: ToolResultContent = m.parts.map((p) => {
    if (p.type === "text") return { type: "text", text: p.text };
    const image = p.mimeType.startsWith("image/");
    if ("url" in p) return image ? { type: "image-url", url: p.url } : { type: "file-url", url: p.url, mediaType: p.mimeType };
    return { type: image ? "image-data" : "file-data", data: base64(p.data), mediaType: p.mimeType };
  });
  return { type: "content", value };
}

function parseInput(args: string): unknown {
  try {
    return JSON.parse(args);
  } catch {
    return args; // the server requires JSON on append; an import may have kept other text
  }
}

/**
 * ModelMessage[] for a rendered context (`(await client.render(s)).rendered`, any format): system
 * and developer messages as `system`, tool and function results as `tool` messages (consecutive
 * ones merged), tool calls as `tool-call` parts. As in the provider formats, a tool call without
 * its result (still pending at the tail) and a result away from its call are left out, since the
 * SDK's providers reject both.
 */
export function toModelMessages(rendered: ReadonlyArray<RenderedMessage>): ModelMessage[] {
  // Which calls have a result right after their assistant message, as the server's documents do.
  const kept = new Map<number, Set<string>>();
  const resultKept: boolean[] = [];
  let group = -1;
  rendered.forEach((m, i) => {
    if (m.role === "assistant") {
      group = i;
      kept.set(i, new Set());
    } else if (m.role === "tool") {
      const calls = group >= 0 ? kept.get(group)! : undefined;
      const ok = calls !== undefined && rendered[group].toolCalls.some((c) => c.id === m.toolCallId) && !calls.has(m.toolCallId);
      if (ok) calls.add(m.toolCallId);
      resultKept[i] = ok;
    } else group = -1;
  });

  const out: ModelMessage[] = [];
  rendered.forEach((m, i) => {
    switch (m.role) {
      case "system":
      case "developer":
        out.push({ role: "system", content: m.text });
        break;
      case "user":
        out.push({
          role: "user",
          content: m.parts.every((p) => p.type === "text") ? m.text : m.parts.map(userPart),
        });
        break;
      case "assistant": {
        const calls = m.toolCalls.filter((c) => kept.get(i)!.has(c.id));
        const media = m.parts.some((p) => p.type === "media");
        if (!calls.length && !media) {
          if (m.text) out.push({ role: "assistant", content: m.text });
          break;
        }
        const content: Array<TextPart | FilePart | ToolCallPart> = [];
        for (const p of m.parts) {
          if (p.type === "text") content.push({ type: "text", text: p.text });
          else content.push({ type: "file", data: "url" in p ? new URL(p.url) : p.data, mediaType: p.mimeType });
        }
        for (const c of calls) content.push({ type: "tool-call", toolCallId: c.id, toolName: c.name, input: parseInput(c.arguments) });
        out.push({ role: "assistant", content });
        break;
      }
      case "tool": {
        if (!resultKept[i]) break;
        const part: ToolResultPart = { type: "tool-result", toolCallId: m.toolCallId, toolName: m.name, output: resultOutput(m) };
        const last = out[out.length - 1];
        if (last?.role === "tool") last.content.push(part);
        else out.push({ role: "tool", content: [part] });
        break;
      }
    }
  });
  return out;
}

// ---------------------------------------------------------------- the recall tool

/** The recall tool's one argument. */
export interface RecallInput {
  reference: string;
}

/** A Standard Schema (v1) with its JSON Schema, the shape the SDK's `inputSchema` takes (AI SDK 6;
 * it also carries the SDK's own schema marker, which AI SDK 5 reads). */
export interface RecallInputSchema {
  readonly "~standard": {
    readonly version: 1;
    readonly vendor: "ctxd";
    readonly validate: (value: unknown) => { readonly value: RecallInput; readonly issues?: undefined } | { readonly issues: ReadonlyArray<{ readonly message: string; readonly path?: ReadonlyArray<PropertyKey> }> };
    readonly types?: { readonly input: RecallInput; readonly output: RecallInput };
    readonly jsonSchema: {
      readonly input: (options: { readonly target: string }) => Record<string, unknown>;
      readonly output: (options: { readonly target: string }) => Record<string, unknown>;
    };
  };
  /** The JSON schema, as the SDK's `jsonSchema()` keeps it. */
  readonly jsonSchema: Record<string, unknown>;
}

/** The recall tool in the SDK's `Tool` shape: assignable to `Tool<RecallInput, string>`. */
export interface RecallTool {
  description: string;
  inputSchema: RecallInputSchema;
  execute: (input: RecallInput, options?: unknown) => Promise<string>;
}

function recallInputSchema(): RecallInputSchema {
  const schema = (): Record<string, unknown> => structuredClone(RECALL_TOOL_PARAMETERS) as Record<string, unknown>;
  const validate = (value: unknown) => {
    const reference = typeof value === "object" && value !== null ? (value as { reference?: unknown }).reference : undefined;
    return typeof reference === "string"
      ? { value: { reference } }
      : { issues: [{ message: "reference: is required, a string: the 12 characters after `recall` in a placeholder", path: ["reference"] }] };
  };
  const standard: RecallInputSchema = {
    "~standard": { version: 1, vendor: "ctxd", validate, jsonSchema: { input: schema, output: schema } },
    jsonSchema: schema(),
  };
  // The SDK's own schema marker (`Symbol.for("vercel.ai.schema")`, with `jsonSchema` and
  // `validate`): AI SDK 5 takes only such schemas (or zod), AI SDK 6 reads it first too.
  return Object.assign(standard, {
    [Symbol.for("vercel.ai.schema")]: true,
    validate: (value: unknown) => {
      const result = validate(value);
      return "value" in result ? { success: true, value: result.value } : { success: false, error: new TypeError(result.issues[0].message) };
    },
  });
}

/**
 * The recall tool for `generateText`/`streamText`, bound to a ctxd session:
 *
 *     tools: { recall: recallTool(ctxd, session), ...yourTools }
 *
 * The model passes a placeholder's reference and reads back the original content. An unknown or
 * malformed reference throws an Error whose message (`recall failed: …`) the SDK sends to the
 * model as the tool's error result; failures of the server itself reject with a CtxdError. Register
 * it under the name `recall` (`RECALL_TOOL_NAME`): the placeholders name that tool.
 */
export function recallTool(client: Client, session: SessionRef, options: { maxChars?: number } = {}): RecallTool {
  return {
    description: RECALL_TOOL_DESCRIPTION,
    inputSchema: recallInputSchema(),
    execute: async (input: RecallInput) => {
      const result = await handleRecall(client, session, input, options);
      if (result.isError) throw new Error(result.text);
      return result.text;
    },
  };
}
