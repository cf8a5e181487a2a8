// Render in the three formats, context stats, what a format cannot carry, bad render input, and
// two-phase compaction (prepare, commit, cancel, the audit trail), against one live server.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { type AnthropicDocument, assistantMessage, Client, FailedPreconditionError, InvalidArgumentError, media, pb, systemMessage, text, toolResult, userMessage, type Session } from "../src";
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

/** A user request, an assistant calling two tools, both results (one an error), an answer. */
async function toolTurn(s: Session, n = 0, size = 200): Promise<void> {
  await ctxd.appendUser(s, `request ${n}: what is in README.md?`);
  await ctxd.appendAssistant(s, "Let me read it.", [
    { id: `r${n}`, name: "read_file", arguments: { path: "README.md" } },
    { id: `g${n}`, name: "grep", arguments: { pattern: "ctxd" } },
  ]);
  await ctxd.appendToolResult(s, `r${n}`, `file ${n}: ` + "x".repeat(size));
  await ctxd.appendToolResult(s, `g${n}`, "grep: no match", { isError: true });
  await ctxd.appendAssistant(s, `answer ${n}: it describes ctxd.`);
}

describe("render", () => {
  test("OpenAI chat completions (the default)", async () => {
    const s = await ctxd.createSession();
    await toolTurn(s);
    const r = await ctxd.render(s);
    assert.equal(r.format, "openai");
    assert.deepEqual(r.messages.map((m) => m.role), ["user", "assistant", "tool", "tool", "assistant"]);
    const calls = r.messages[1].tool_calls!;
    assert.deepEqual(calls.map((c) => [c.id, c.type, c.function.name]), [["r0", "function", "read_file"], ["g0", "function", "grep"]]);
    assert.deepEqual(JSON.parse(calls[0].function.arguments), { path: "README.md" });
    assert.deepEqual(r.messages.slice(2, 4).map((m) => m.tool_call_id), ["r0", "g0"]);
    assert.deepEqual(r.messages[4], { role: "assistant", content: "answer 0: it describes ctxd." });
    assert.equal(r.headId, (await ctxd.getSession(s)).branches[0].headId);
    assert.ok(r.totalTokens > 0 && r.totalTokens === r.report.totalTokens);
    assert.equal(r.tokenizer, "heuristic");
    assert.equal(r.rendered.length, 5);
  });

  test("Anthropic Messages: tool_use and merged tool_result blocks, system lifted", async () => {
    const s = await ctxd.createSession();
    await ctxd.append(s, [systemMessage("You are terse.")]);
    await toolTurn(s);
    const doc = (await ctxd.render(s, { format: "anthropic" })).messages;
    assert.equal(typeof doc.system === "string" ? doc.system : doc.system?.map((b) => b.text).join(" "), "You are terse.");
    assert.deepEqual(doc.messages.map((m) => m.role), ["user", "assistant", "user", "assistant"]);
    const blocks = doc.messages[1].content;
    assert.ok(Array.isArray(blocks));
    const uses = blocks.filter((b) => b.type === "tool_use");
    assert.deepEqual(uses.map((b) => b.type === "tool_use" && [b.id, b.name, b.input]), [["r0", "read_file", { path: "README.md" }], ["g0", "grep", { pattern: "ctxd" }]]);
    const results = doc.messages[2].content;
    assert.ok(Array.isArray(results));
    assert.deepEqual(results.map((b) => b.type === "tool_result" && [b.tool_use_id, b.is_error ?? false]), [["r0", false], ["g0", true]]);
  });

  test("neutral messages with tokens and node ids", async () => {
    const s = await ctxd.createSession();
    await toolTurn(s);
    const r = await ctxd.render(s, { format: "neutral" });
    assert.equal(r.messages, r.rendered);
    assert.deepEqual(r.messages.map((m) => m.role), ["user", "assistant", "tool", "tool", "assistant"]);
    assert.deepEqual(r.messages[1].toolCalls[0], { id: "r0", name: "read_file", arguments: '{"path":"README.md"}' });
    assert.equal(r.messages[3].name, "grep");
    assert.equal(r.messages[3].isError, true);
    assert.ok(r.messages.every((m) => m.nodeIds.length === 1));
    assert.equal(r.messages.reduce((sum, m) => sum + m.tokens, 0), r.report.totalTokens);
  });

  test("budgets, policy and context stats", async () => {
    const s = await ctxd.createSession();
    for (let n = 0; n < 3; n++) await toolTurn(s, n, 3000);
    const unbounded = await ctxd.contextStats(s);
    assert.equal(unbounded.budget, undefined);
    assert.ok(unbounded.fits);
    const parts = { contextWindow: 10_000, outputReserve: 1_000, systemTokens: 500, toolsTokens: 400, schemaTokens: 100 };
    assert.equal((await ctxd.contextStats(s, { budget: parts })).historyBudget, 8_000);
    const tight = await ctxd.render(s, { budget: 1_500, policy: { maxToolResultChars: 500 }, format: "neutral" });
    assert.equal(tight.report.historyBudget, 1_500);
    assert.ok(tight.report.resultsTruncated + tight.report.resultsCleared + tight.report.turnsSnipped > 0);
    assert.ok(tight.report.totalTokens < unbounded.totalTokens);
  });

  test("media a format cannot carry becomes a placeholder naming its type", async () => {
    // The server does not refuse such a render: OpenAI chat has no PDF part, so the document
    // says what was there instead, and the neutral messages keep the part itself.
    const s = await ctxd.createSession();
    await ctxd.append(s, [userMessage([text("read this"), media("application/pdf", new Uint8Array([37, 80, 68, 70]))])]);
    const openai = await ctxd.render(s);
    assert.deepEqual(openai.messages[0].content, [
      { type: "text", text: "read this" },
      { type: "text", text: "[application/pdf attachment]" },
    ]);
    const anthropic = await ctxd.render(s, { format: "anthropic" });
    const blocks = anthropic.messages.messages[0].content;
    assert.ok(Array.isArray(blocks) && blocks[1].type === "document");
    assert.equal(openai.rendered[0].parts[1].type, "media");
    const [node] = openai.rendered[0].nodeIds;
    assert.deepEqual(openai.uncarried, [{ nodeId: node, partIndex: 1, mimeType: "application/pdf" }]);
    assert.deepEqual(anthropic.uncarried, []);
    // Asked to be strict, the server refuses instead, naming the node.
    await assert.rejects(ctxd.render(s, { strictFormat: true }), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError);
      assert.match(e.details, new RegExp(`strict_format: node ${node} part 1 \\(application/pdf\\)`));
      return true;
    });
  });

  test("bad render input is InvalidArgumentError with the server's message", async () => {
    const s = await ctxd.createSession();
    await ctxd.appendUser(s, "hi");
    await assert.rejects(ctxd.render(s, { tokenizer: "gpt-17" }), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError);
      assert.match(e.details, /tokenizer/);
      return true;
    });
    await assert.rejects(ctxd.render(s, { nodeId: "not-a-node" }), InvalidArgumentError);
    await assert.rejects(ctxd.render(s, { format: "markdown" as "neutral" }), /format must be one of openai, anthropic, neutral/);
  });
});

describe("rendering for a model", () => {
  const REASONING_MIME = "application/vnd.ctxd.anthropic-reasoning+json";
  // A thinking block as Anthropic returns it (display omitted), in the canonical JSON ctxd keeps.
  const THINKING = new TextEncoder().encode('{"signature":"s","thinking":"","type":"thinking"}');
  const MODEL = "claude-opus-5-5";
  // Results far over the window: a step is forced whatever it costs.
  const CALLS = 30;
  const RESULT_CHARS = 8_000;
  const WINDOW = 20_000;

  /** A tool loop of a model that thinks before each call: every assistant message holds a
   * thinking block and one call, each answered with an 8 KB result; the model has read them all
   * (a last assistant message comes after the last result). */
  async function thinkingLoop(): Promise<Session> {
    const s = await ctxd.createSession();
    await ctxd.appendUser(s, "Read every file.");
    const batches = [];
    for (let k = 0; k < CALLS; k++) {
      const id = `toolu_${String(k).padStart(2, "0")}`;
      let body = "";
      for (let n = 0; body.length < RESULT_CHARS; n++) body += `${k} line ${n}: fn item_${n}() {}\n`;
      batches.push([
        assistantMessage([media(REASONING_MIME, THINKING)], [{ id, name: "Read", arguments: { file_path: `f${k}.rs` } }]),
        toolResult(id, body.slice(0, RESULT_CHARS)),
      ]);
    }
    batches.push([assistantMessage([media(REASONING_MIME, THINKING), text("All read.")])]);
    await ctxd.appendMany(s, batches);
    return s;
  }

  function thinkingBlocks(document: AnthropicDocument): number {
    return document.messages.flatMap((m) => (Array.isArray(m.content) ? m.content : [])).filter((b) => b.type === "thinking").length;
  }

  test("a binding model's step is the provider's edit, every thinking block kept", async () => {
    const s = await thinkingLoop();
    const r = await ctxd.render(s, { budget: WINDOW, format: "anthropic", model: MODEL });
    assert.equal(r.report.pricedBy, MODEL);
    assert.ok(r.report.editClear > 0, "a step, as the provider's edit");
    assert.equal(r.report.editClear + r.report.editKeep, CALLS);
    assert.equal(r.report.thinkingDropped, 0);
    assert.deepEqual(r.betas, ["context-management-2025-06-27"]);
    // The document goes unreduced, every thinking block with it, and asks the provider to clear.
    assert.equal(thinkingBlocks(r.messages), CALLS + 1);
    const edit = r.messages.context_management?.edits[0];
    assert.equal(edit?.type, "clear_tool_uses_20250919");
    assert.deepEqual([edit?.trigger, edit?.keep], [
      { type: "tool_uses", value: r.report.editClear },
      { type: "tool_uses", value: r.report.editKeep },
    ]);
    // "keep" is the default, by name or by the enum; contextStats gives the same report.
    for (const reasoning of ["keep", pb.Reasoning.REASONING_KEEP] as const) {
      const kept = await ctxd.render(s, { budget: WINDOW, format: "anthropic", model: MODEL, policy: { reasoning } });
      assert.deepEqual([kept.report, kept.betas], [r.report, r.betas]);
    }
    assert.deepEqual(await ctxd.contextStats(s, { budget: WINDOW, model: MODEL }), r.report);
    // Without a model nothing is bound: no edit, no betas, no pricing entry.
    const plain = await ctxd.render(s, { budget: WINDOW, format: "anthropic" });
    assert.deepEqual([plain.report.pricedBy, plain.report.editClear, plain.betas], ["", 0, []]);
    assert.equal(plain.messages.context_management, undefined);
  });

  test("reasoning drop leaves out the thinking a step invalidated", async () => {
    const s = await thinkingLoop();
    const r = await ctxd.render(s, { budget: WINDOW, format: "anthropic", model: MODEL, policy: { reasoning: "drop" } });
    assert.equal(r.report.pricedBy, MODEL);
    assert.ok(r.report.thinkingDropped > 0, "a step left thinking out");
    assert.deepEqual([r.report.editClear, r.report.editKeep, r.betas], [0, 0, []]);
    assert.equal(r.messages.context_management, undefined);
    assert.ok(r.report.resultsCleared > 0, "the step is ctxd's own");
    assert.equal(thinkingBlocks(r.messages), CALLS + 1 - r.report.thinkingDropped);
    const stats = await ctxd.contextStats(s, { budget: WINDOW, model: MODEL, policy: { reasoning: pb.Reasoning.REASONING_DROP } });
    assert.deepEqual(stats, r.report);
  });

  test("the policy's prices and reasoning are checked", async () => {
    const s = await ctxd.createSession();
    await toolTurn(s);
    // Prices of the policy's own, within 0 and 100, are taken.
    const priced = await ctxd.render(s, { budget: 10_000, model: "gpt-5", policy: { cacheReadPrice: 0.1, cacheWritePrice: 1 } });
    assert.equal(priced.report.pricedBy, "gpt-5");
    assert.ok(priced.report.fits);
    // An unknown model is priced by the fallback entry, named after it.
    assert.match((await ctxd.contextStats(s, { model: "no-such-model" })).pricedBy, /^unknown:/);
    for (const [field, policy] of [["cache_read_price", { cacheReadPrice: -0.5 }], ["cache_write_price", { cacheWritePrice: 101 }]] as const) {
      const named = (e: unknown) => e instanceof InvalidArgumentError && e.details.includes(`policy.${field}`);
      await assert.rejects(ctxd.render(s, { budget: 10_000, model: MODEL, policy }), named);
      await assert.rejects(ctxd.contextStats(s, { policy }), named);
    }
    // A reasoning by a name the client does not know never leaves it; a number the server does
    // not know is refused there.
    await assert.rejects(ctxd.render(s, { model: MODEL, policy: { reasoning: "forget" as "drop" } }), (e: unknown) => e instanceof TypeError && /policy\.reasoning must be one of keep, drop/.test(e.message));
    await assert.rejects(ctxd.render(s, { model: MODEL, policy: { reasoning: 7 as pb.Reasoning } }), (e: unknown) => e instanceof InvalidArgumentError && /policy\.reasoning/.test(e.details));
  });
});

describe("compaction", () => {
  // The history may use 2,000 tokens; four turns with 3,000-character results need more.
  const BUDGET = { contextWindow: 2_500, outputReserve: 500 };
  async function fourTurns(s: Session): Promise<void> {
    for (let t = 0; t < 4; t++) {
      await ctxd.appendUser(s, `request number ${t}: please look at file ${t}`);
      await ctxd.appendAssistant(s, "looking", [{ id: `call-${t}`, name: "read_file", arguments: { path: `f${t}` } }]);
      await ctxd.appendToolResult(s, `call-${t}`, `contents of file ${t} `.repeat(150));
      await ctxd.appendAssistant(s, `file ${t} is fine`);
    }
  }

  test("prepare and commit lay a summary over older turns", async () => {
    const s = await ctxd.createSession();
    await fourTurns(s);
    const before = await ctxd.render(s);
    const plan = await ctxd.prepareCompaction(s, BUDGET);
    assert.ok(plan.needed && plan.compactionId && plan.coversIds.length);
    assert.equal(plan.baseHeadId, before.headId);
    assert.equal(plan.historyBudget, 2_000);
    assert.equal(plan.kind, "rolling");
    assert.deepEqual(plan.summaryInput[0], { role: "user", content: "request number 0: please look at file 0" });
    assert.ok(plan.ledgerText.includes("f0"));

    const outcome = await ctxd.commitSummary(plan, "Files 0 and 1 were read; both are fine.", "test-model");
    assert.ok(outcome.applied && outcome.summaryId);
    assert.equal(outcome.reason, "applied");
    assert.ok(outcome.tokensAfter < outcome.tokensBefore);

    const after = await ctxd.render(s);
    assert.match(String(after.messages[0].content), /Files 0 and 1 were read/);
    assert.ok(after.report.summaryIds.includes(outcome.summaryId));
    assert.equal((await ctxd.getSession(s)).compactionCount, 1);

    const audit = await ctxd.listSummaries(s);
    assert.deepEqual(audit.summaries.map((x) => [x.summaryId, x.model, x.active, x.kind]), [[outcome.summaryId, "test-model", true, "rolling"]]);
    assert.deepEqual(audit.events.map((e) => [e.kind, e.reason]), [["prepared", ""], ["committed", "applied"]]);
  });

  test("an empty summary is an answer, cancel is recorded, compact needs a summarizer", async () => {
    const s = await ctxd.createSession();
    await fourTurns(s);
    const plan = await ctxd.prepareCompaction(s, BUDGET, { format: "anthropic", retainTurns: 1 });
    assert.ok(Array.isArray(plan.summaryInput) === false);
    const empty = await ctxd.commitSummary(plan.compactionId, "   ", "m");
    assert.deepEqual([empty.applied, empty.reason], [false, "empty"]);
    const again = await ctxd.prepareCompaction(s, BUDGET, { format: "neutral" });
    assert.equal(again.rendered[0].text, "request number 0: please look at file 0");
    await ctxd.cancelCompaction(again, "not now");
    assert.deepEqual((await ctxd.listSummaries(s)).events.map((e) => e.kind).slice(-1), ["cancelled"]);
    const small = await ctxd.createSession();
    await ctxd.appendUser(small, "hi");
    assert.equal((await ctxd.prepareCompaction(small, 100_000)).needed, false);
    await assert.rejects(ctxd.compact(s, BUDGET), FailedPreconditionError);
  });
});
