// The recall tool against a live server: a result a render cleared comes back byte-exact through
// `recall`, `handleRecall` and the Vercel AI SDK tool; another session's reference is not found; a
// malformed one is refused naming `reference`; the shipped definitions equal the server's.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { asSchema, type Tool as SdkTool } from "@ai-sdk/provider-utils";

import {
  Client,
  handleRecall,
  InvalidArgumentError,
  NotFoundError,
  RECALL_TOOL_NAME,
  recallReferences,
  recallToolDefinition,
  type Session,
} from "../src";
import { type RecallInput, recallTool } from "../src/vercel";
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

const PLACEHOLDER = /recall ([0-9a-f]{12})/;
// A step at every tool result from the second on, the newest kept: the older results are cleared.
const CLEARING = { microcompactFirst: 2, microcompactEvery: 1, microcompactKeep: 1, clearAtLeastTokens: 0 };

/** A long tool output whose exact bytes matter: non-ASCII, an astral character, tabs, CRLF. */
function output(n: number): string {
  let text = "";
  for (let i = 0; i < 150; i++) text += `${n}:${i} é 漢字 🙂\tend  \r\n`;
  return text;
}

/** A session of three tool turns, and the reference and original text of a result its render
 * cleared (read out of the placeholder). */
async function cleared(): Promise<{ session: Session; reference: string; original: string }> {
  const session = await ctxd.createSession();
  const originals = new Map<string, string>();
  for (let n = 0; n < 3; n++) {
    await ctxd.appendUser(session, `read file ${n}`);
    await ctxd.appendAssistant(session, "", [{ id: `read_${n}`, name: "read_file", arguments: { path: `${n}.txt` } }]);
    originals.set(`read_${n}`, output(n));
    await ctxd.appendToolResult(session, `read_${n}`, output(n));
  }
  await ctxd.appendAssistant(session, "Read them all.");
  // An hour after the last call the provider's cache has expired: the render steps, for free.
  const rendered = await ctxd.render(session, { budget: 100_000, policy: CLEARING, nowUnixMs: Date.now() + 3_600_000 });
  assert.ok(rendered.report.resultsCleared >= 1, JSON.stringify(rendered.report));
  for (const m of rendered.messages) {
    const found = m.role === "tool" && typeof m.content === "string" ? PLACEHOLDER.exec(m.content) : null;
    if (found) {
      assert.deepEqual(recallReferences(m.content as string), [found[1]]);
      return { session, reference: found[1], original: originals.get(m.tool_call_id!)! };
    }
  }
  throw new Error(`no placeholder names a reference: ${JSON.stringify(rendered.messages)}`);
}

test("a cleared result comes back byte-exact, by the client, the handler and the AI SDK tool", async () => {
  const { session, reference, original } = await cleared();
  const recalled = await ctxd.recall(session, reference);
  assert.ok(Buffer.from(recalled.content).equals(Buffer.from(original)));
  assert.equal(recalled.kind, "tool_result");
  assert.equal(recalled.totalChars, [...original].length);
  assert.equal(recalled.truncated, false);
  assert.equal(recalled.toolName, "read_file");

  // A model's call as OpenAI gives it (JSON text) and as Anthropic gives it (an object).
  for (const args of [JSON.stringify({ reference }), { reference }]) {
    assert.deepEqual(await handleRecall(ctxd, session, args), { text: original, isError: false, recalled });
  }
  // Longer than maxChars: the head, and a line saying how much was left out.
  const head = await handleRecall(ctxd, session.id, { reference }, { maxChars: 100 });
  assert.equal(head.recalled?.truncated, true);
  assert.ok(head.text.startsWith([...original].slice(0, 100).join("")));
  assert.match(head.text, new RegExp(`${[...original].length - 100} more characters left out`));

  // The AI SDK reads our schema as its own, and runs the tool as it would for a model's call.
  const tool = recallTool(ctxd, session);
  const schema = asSchema(tool.inputSchema);
  assert.deepEqual(await schema.jsonSchema, recallToolDefinition("openai").function.parameters);
  assert.deepEqual(await schema.validate!({ reference }), { success: true, value: { reference } });
  assert.equal((await schema.validate!({})).success, false);
  assert.equal(await tool.execute({ reference }, { toolCallId: "call_r", messages: [] }), original);
  await assert.rejects(tool.execute({ reference: "nope" }, { toolCallId: "call_r", messages: [] }), /recall failed: .*reference/);
});

test("another session's reference is not found", async () => {
  const { reference } = await cleared();
  const other = await ctxd.createSession();
  await assert.rejects(ctxd.recall(other, reference), NotFoundError);
  const answer = await handleRecall(ctxd, other, { reference });
  assert.equal(answer.isError, true);
  assert.equal(answer.recalled, undefined);
  assert.match(answer.text, /^recall failed: /);
});

test("a malformed reference is refused, naming `reference`", async () => {
  const session = await ctxd.createSession();
  for (const bad of ["3f9a2c1b7d0", "3f9a2c1b7d04ff", "zzzzzzzzzzzz", ""]) {
    await assert.rejects(ctxd.recall(session, bad), (e: unknown) => e instanceof InvalidArgumentError && /reference/.test(e.details));
  }
  // Arguments a model got wrong are answered, not thrown.
  for (const args of ["{not json", {}, { reference: 7 }, '"3f9a2c1b7d04"', null]) {
    const answer = await handleRecall(ctxd, session, args);
    assert.equal(answer.isError, true, JSON.stringify(args));
    assert.match(answer.text, /reference/);
  }
});

test("the shipped definitions are the server's", async () => {
  const fromServer = await ctxd.recallTool();
  assert.equal(fromServer.name, RECALL_TOOL_NAME);
  assert.deepEqual(fromServer.anthropic, recallToolDefinition("anthropic"));
  assert.deepEqual(fromServer.openai, recallToolDefinition("openai"));
  assert.deepEqual(fromServer.openai, recallToolDefinition());
  assert.deepEqual(fromServer.responses, recallToolDefinition("responses"));
  assert.throws(() => recallToolDefinition("gemini" as never), /shape must be one of/);
});

// Type test: compiled by tsc, never run. The recall tool is an SDK tool as it is.
export function _recallToolFits(client: Client): void {
  const tool: SdkTool<RecallInput, string> = recallTool(client, "s");
  const tools: Record<string, SdkTool> = { recall: recallTool(client, "s") };
  void tool;
  void tools;
}
