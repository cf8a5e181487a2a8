// The Vercel AI SDK adapter: ModelMessage[] appended through toNodeInputs and rendered back by
// toModelMessages come out equal; its types fit the SDK's own (checked by tsc against
// @ai-sdk/provider-utils, a devDependency only).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import type { ModelMessage as SdkModelMessage } from "@ai-sdk/provider-utils";

import { Client } from "../src";
import { type ModelMessage, toModelMessages, toNodeInputs } from "../src/vercel";
import { Server } from "./server";

let server: Server;
let ctxd: Client;
before(async () => {
  server = await Server.start();
  ctxd = new Client(server.address, { timeoutMs: 30_000 });
});
after(async () => {
  ctxd.close();
  await server.stop();
});

const PNG = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 9, 9]);

const conversation: ModelMessage[] = [
  { role: "system", content: "You are terse." },
  {
    role: "user",
    content: [
      { type: "text", text: "What is in this picture and that file?" },
      { type: "image", image: PNG, mediaType: "image/png" },
      { type: "file", data: new URL("https://example.com/report.pdf"), mediaType: "application/pdf" },
    ],
  },
  {
    role: "assistant",
    content: [
      { type: "text", text: "Let me look." },
      { type: "tool-call", toolCallId: "call_1", toolName: "read_file", input: { path: "README.md" } },
      { type: "tool-call", toolCallId: "call_2", toolName: "grep", input: { pattern: "ctxd" } },
    ],
  },
  {
    role: "tool",
    content: [
      { type: "tool-result", toolCallId: "call_1", toolName: "read_file", output: { type: "text", value: "# ctxd" } },
      { type: "tool-result", toolCallId: "call_2", toolName: "grep", output: { type: "error-text", value: "grep: no match" } },
    ],
  },
  { role: "assistant", content: "A PNG, a PDF, and a README about ctxd." },
];

test("ModelMessage[] -> append -> render -> ModelMessage[] is the identity", async () => {
  const s = await ctxd.createSession();
  await ctxd.append(s, toNodeInputs(conversation));
  const { rendered } = await ctxd.render(s, { format: "neutral" });
  assert.deepEqual(toModelMessages(rendered), conversation);
  // Any format's render carries the neutral messages too.
  assert.deepEqual(toModelMessages((await ctxd.render(s)).rendered), conversation);
});

test("other SDK shapes map to what ctxd stores", () => {
  const nodes = toNodeInputs([
    { role: "user", content: [{ type: "image", image: Buffer.from(PNG).toString("base64") }] },
    { role: "assistant", content: [{ type: "reasoning", text: "hmm" } as never, { type: "tool-call", toolCallId: "c", toolName: "t", input: { a: 1 } }] },
    { role: "tool", content: [{ type: "tool-result", toolCallId: "c", toolName: "t", output: { type: "json", value: { ok: true } } }] },
  ]);
  assert.deepEqual(nodes, [
    { type: "message", role: "user", parts: [{ type: "media", mimeType: "image/png", data: PNG }] },
    { type: "message", role: "assistant", parts: [], toolCalls: [{ id: "c", name: "t", arguments: '{"a":1}' }] },
    { type: "toolResult", callId: "c", parts: [{ type: "text", text: '{"ok":true}' }], isError: false },
  ]);
  assert.throws(
    () => toNodeInputs([{ role: "assistant", content: [{ type: "tool-approval-request", approvalId: "a", toolCallId: "c" } as never] }]),
    /cannot store a "tool-approval-request" part of a assistant message/,
  );
});

test("a pending tool call is left out, as the provider formats do", async () => {
  const s = await ctxd.createSession();
  await ctxd.append(s, toNodeInputs([
    { role: "user", content: "hi" },
    { role: "assistant", content: [{ type: "text", text: "calling" }, { type: "tool-call", toolCallId: "p", toolName: "slow", input: {} }] },
  ]));
  const { rendered } = await ctxd.render(s);
  assert.deepEqual(toModelMessages(rendered), [
    { role: "user", content: "hi" },
    { role: "assistant", content: "calling" },
  ]);
});

// Type tests: compiled by tsc, never run. What toModelMessages makes is the SDK's ModelMessage[],
// and toNodeInputs takes the SDK's ModelMessage[] as they are.
export function _typesFit(sdk: SdkModelMessage[], ours: ModelMessage[]): void {
  const out: SdkModelMessage[] = toModelMessages([]);
  const back: SdkModelMessage[] = ours;
  toNodeInputs(sdk);
  void out;
  void back;
}
