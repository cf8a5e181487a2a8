// The recall tool: the way back from a placeholder to what a render cleared, cut or stubbed.
//
// Every cleared tool result, cut tool result, stubbed tool-call argument and shortened assistant
// text in a ctxd render names what it replaced by a reference, the 12 hexadecimal characters after
// the word `recall` (`[cleared to save context: recall 3f9a2c1b7d04]`). Register the tool with the
// model (the definition is a constant here, the same text the server's RecallTool returns, so
// registering needs no round trip) and answer its calls with `handleRecall`.
import { status } from "@grpc/grpc-js";

import type { Client } from "./client";
import { type CtxdError, InvalidArgumentError, NotFoundError } from "./errors";
import type { Recalled, SessionRef } from "./types";

/** The tool's name. */
export const RECALL_TOOL_NAME = "recall";

/** What the model is told the tool does. */
export const RECALL_TOOL_DESCRIPTION =
  "Returns the original content of a tool result, tool call or message that was cleared or shortened to save context. " +
  "Pass the reference its placeholder names (the 12 characters after `recall`).";

/** The JSON schema of the tool's one argument, `reference`. */
export interface RecallToolParameters {
  type: "object";
  properties: { reference: { type: "string"; description: string } };
  required: ["reference"];
  additionalProperties: false;
}

/** The JSON schema of the tool's one argument (frozen: `recallToolDefinition` gives copies). */
export const RECALL_TOOL_PARAMETERS: Readonly<RecallToolParameters> = deepFreeze({
  type: "object",
  properties: {
    reference: { type: "string", description: "The 12-character reference after `recall` in a placeholder." },
  },
  required: ["reference"],
  additionalProperties: false,
});

/** Finds a reference in rendered text: group 1 is the reference (`recallReferences` lists all). */
export const RECALL_REFERENCE = /recall ([0-9a-f]{12})/;

/** The definition as each API takes it in `tools`. */
export interface RecallToolDefinitionShapes {
  /** Anthropic's Messages API. */
  anthropic: { name: string; description: string; input_schema: RecallToolParameters };
  /** OpenAI chat completions. */
  openai: { type: "function"; function: { name: string; description: string; parameters: RecallToolParameters } };
  /** OpenAI's Responses API. */
  responses: { type: "function"; name: string; description: string; parameters: RecallToolParameters };
}
export type RecallShape = keyof RecallToolDefinitionShapes;

/** The recall tool's definition in `shape` (a fresh copy each call): `anthropic` (`{ name,
 * description, input_schema }`), `openai` (chat completions, `{ type: "function", function }`)
 * or `responses` (`{ type: "function", name, description, parameters }`). */
export function recallToolDefinition<S extends RecallShape = "openai">(shape: S = "openai" as S): RecallToolDefinitionShapes[S] {
  const parameters = structuredClone(RECALL_TOOL_PARAMETERS) as RecallToolParameters;
  const name = RECALL_TOOL_NAME;
  const description = RECALL_TOOL_DESCRIPTION;
  const shapes: { [K in RecallShape]: () => RecallToolDefinitionShapes[K] } = {
    anthropic: () => ({ name, description, input_schema: parameters }),
    openai: () => ({ type: "function", function: { name, description, parameters } }),
    responses: () => ({ type: "function", name, description, parameters }),
  };
  if (!Object.prototype.hasOwnProperty.call(shapes, shape)) {
    throw new TypeError(`shape must be one of anthropic, openai, responses, not ${JSON.stringify(shape)}`);
  }
  return shapes[shape]();
}

/** Every reference a rendered text names, in order, each once. */
export function recallReferences(text: string): string[] {
  return [...new Set(Array.from(text.matchAll(new RegExp(RECALL_REFERENCE.source, "g")), (m) => m[1]))];
}

/** Characters of `text` as the server counts them (Unicode code points, not UTF-16 units). */
function codePoints(text: string): number {
  let n = 0;
  for (const _ of text) n++;
  return n;
}

/** Characters of the content a recall left out (0 unless truncated). */
export function charsLeftOut(recalled: Recalled): number {
  return recalled.truncated ? Math.max(recalled.totalChars - codePoints(recalled.content), 0) : 0;
}

/** What the model reads as the tool's result: the content, and when it is only its head, a last
 * line saying how many characters were left out. */
export function recallText(recalled: Recalled): string {
  if (!recalled.truncated) return recalled.content;
  return `${recalled.content}\n[… ${charsLeftOut(recalled)} more characters left out: the content has ${recalled.totalChars} characters, this is its head]`;
}

/** The answer to a model's recall call: `text` goes into the tool result; `isError` says the
 * call failed (an unknown or malformed reference, or arguments without one). */
export interface RecallToolResult {
  text: string;
  isError: boolean;
  /** What the server returned (undefined when the call failed). */
  recalled?: Recalled;
}

/** The `reference` argument of a model's call (arguments as an object or their JSON text). A
 * model sometimes copies the placeholder's word with it: `recall 3f9a…` is taken too. */
function referenceOf(args: unknown): string {
  let value = args;
  if (typeof value === "string") {
    try {
      value = value.trim() ? JSON.parse(value) : {};
    } catch {
      throw new InvalidArgumentError(status.INVALID_ARGUMENT, 'reference: the arguments are not JSON; pass {"reference": "..."}');
    }
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new InvalidArgumentError(status.INVALID_ARGUMENT, "reference: the arguments must be a JSON object");
  }
  const reference = (value as { reference?: unknown }).reference;
  if (typeof reference !== "string") {
    throw new InvalidArgumentError(status.INVALID_ARGUMENT, "reference: is required, a string: the 12 characters after `recall` in a placeholder");
  }
  const trimmed = reference.trim();
  return (trimmed.startsWith("recall ") ? trimmed.slice("recall ".length) : trimmed).trim();
}

/**
 * Runs a model's recall call against `session` and returns the text for its tool result.
 * `args` is the call's arguments as the model gave them: an object (Anthropic's `input`, the
 * Vercel AI SDK's `input`) or JSON text (OpenAI's `arguments`). An unknown or malformed reference,
 * or arguments without one, are answered with `isError: true` and the reason as text, for the
 * model to read; any other failure (the server unreachable, a wrong key) rejects.
 */
export async function handleRecall(
  client: Client,
  session: SessionRef,
  args: unknown,
  options: { maxChars?: number } = {},
): Promise<RecallToolResult> {
  try {
    const recalled = await client.recall(session, referenceOf(args), options);
    return { text: recallText(recalled), isError: false, recalled };
  } catch (error) {
    if (error instanceof NotFoundError || error instanceof InvalidArgumentError) {
      return { text: `recall failed: ${(error as CtxdError).details}`, isError: true };
    }
    throw error;
  }
}

function deepFreeze<T>(value: T): T {
  if (typeof value === "object" && value !== null) {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}
