// listGatewayCalls: the model gateway's ledger of a session, read from a live server whose
// gateway forwards to a fake Anthropic endpoint: the calls in the order made with the provider's
// own usage, paged; bad input rejected as the right error.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer, type Server as HttpServer } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import { Client, type GatewayCall, InvalidArgumentError, NotFoundError } from "../src";
import { Server } from "./server";

/** What the fake provider reports for every call: distinct numbers, each seen in its field. */
const USAGE = { input_tokens: 12, cache_creation_input_tokens: 50, cache_read_input_tokens: 3400, output_tokens: 7 };
/** Only a hang fails at this: the gateway records a call a moment after its answer. */
const PATIENCE_MS = 30_000;
/** A model of the gateway's table that binds its thinking: for it the fake also reports edits of
 * its own (what the provider cleared, a thinking block it dropped), as Anthropic does. */
const BINDING_MODEL = "claude-opus-5-5";
const APPLIED_EDIT = { type: "clear_tool_uses_20250919", cleared_tool_uses: 8, cleared_input_tokens: 4000 };

let fake: HttpServer;
let server: Server;
let gateway: string;
let ctxd: Client;

before(async () => {
  fake = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      const answer = JSON.stringify({
        id: "msg_fake",
        type: "message",
        role: "assistant",
        model: body.model,
        content: [{ type: "text", text: "three" }],
        stop_reason: "end_turn",
        stop_sequence: null,
        usage: USAGE,
        ...(body.model === BINDING_MODEL
          ? {
              context_management: { applied_edits: [APPLIED_EDIT] },
              input_transformations: [{ type: "thinking_block_dropped", message_index: 1, content_index: 0 }],
            }
          : {}),
      });
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(answer) });
      res.end(answer);
    });
  });
  await new Promise<void>((resolve) => fake.listen(0, "127.0.0.1", resolve));
  const upstream = `http://127.0.0.1:${(fake.address() as AddressInfo).port}`;
  server = await Server.start(() => ["--gateway", "127.0.0.1:0", "--anthropic-upstream", upstream]);
  gateway = `http://${await server.addressOf("gateway")}`;
  ctxd = new Client(server.address, { timeoutMs: 30_000 });
});
after(async () => {
  ctxd.close();
  await server.stop();
  await new Promise((resolve) => fake.close(resolve));
});

/** One Messages call through the gateway; the session it was recorded in. */
async function forward(messages: unknown[], session = "", model = "claude-test-1"): Promise<string> {
  const headers: Record<string, string> = { "content-type": "application/json", "anthropic-version": "2023-06-01", "x-api-key": "sk-ant-fake" };
  if (session) headers["x-ctxd-session"] = session;
  const res = await fetch(`${gateway}/v1/messages`, {
    method: "POST",
    headers,
    body: JSON.stringify({ model, max_tokens: 64, messages }),
  });
  assert.equal(res.status, 200, await res.clone().text());
  await res.json();
  const id = res.headers.get("x-ctxd-session-id");
  assert.ok(id, "the gateway names the session");
  return id;
}

/** The session's ledger once it holds `n` calls. */
async function callsOf(session: string, n: number): Promise<GatewayCall[]> {
  const deadline = Date.now() + PATIENCE_MS;
  for (;;) {
    const { calls } = await ctxd.listGatewayCalls(session);
    if (calls.length >= n) return calls;
    assert.ok(Date.now() < deadline, `${n} call(s) recorded; have ${calls.length}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

test("the ledger lists each forwarded call in order, with the provider's usage, in pages", async () => {
  const first = [{ role: "user", content: "Count to three." }];
  const session = await forward(first);
  await callsOf(session, 1);
  const second = [...first, { role: "assistant", content: "three" }, { role: "user", content: "Now to four." }];
  assert.equal(await forward(second, session), session);
  const calls = await callsOf(session, 2);
  assert.equal(calls.length, 2);
  for (const c of calls) {
    assert.deepEqual([c.api, c.model], ["anthropic", "claude-test-1"]);
    assert.deepEqual(
      [c.inputTokens, c.cacheReadTokens, c.cacheWriteTokens, c.outputTokens],
      [USAGE.input_tokens, USAGE.cache_read_input_tokens, USAGE.cache_creation_input_tokens, USAGE.output_tokens],
    );
    assert.ok(c.clientTokens > 0 && c.forwardedTokens > 0);
    assert.equal(typeof c.keptTokens, "number");
    assert.equal(typeof c.change, "string");
    assert.equal(typeof c.unexplainedMiss, "boolean");
    // Priced by the table's catch-all Claude entry (reads 0.1x, writes 1.25x); no edit asked or
    // reported, no thinking dropped.
    assert.equal(c.pricedBy, "claude");
    assertClose(c.cost, USAGE.input_tokens + 0.1 * USAGE.cache_read_input_tokens + 1.25 * USAGE.cache_creation_input_tokens);
    assert.deepEqual(
      [c.editClear, c.editKeep, c.providerCleared, c.providerClearedTokens, c.providerThinkingDropped, c.thinkingDropped],
      [undefined, undefined, undefined, undefined, 0, 0],
    );
  }
  assert.ok(calls[0].atUnixMs <= calls[1].atUnixMs);
  assert.ok(calls[1].clientTokens > calls[0].clientTokens, "the second resent the first");

  const page = await ctxd.listGatewayCalls(session, { pageSize: 1 });
  assert.deepEqual(page.calls, calls.slice(0, 1));
  assert.ok(page.nextPageToken);
  const rest = await ctxd.listGatewayCalls(session, { pageSize: 1, pageToken: page.nextPageToken });
  assert.deepEqual(rest, { calls: calls.slice(1), nextPageToken: "" });
});

test("a call is priced by its model, with what the provider did", async () => {
  const session = await forward([{ role: "user", content: "Name a prime." }], "", BINDING_MODEL);
  const [call] = await callsOf(session, 1);
  assert.deepEqual([call.model, call.pricedBy], [BINDING_MODEL, BINDING_MODEL]);
  // Its reads cost 0.05x a plain input token, its writes 1.25x.
  assertClose(call.cost, USAGE.input_tokens + 0.05 * USAGE.cache_read_input_tokens + 1.25 * USAGE.cache_creation_input_tokens);
  assert.deepEqual([call.providerCleared, call.providerClearedTokens, call.providerThinkingDropped], [8, 4000, 1]);
  // One call takes no step: ctxd asked for no edit and left no thinking out.
  assert.deepEqual([call.editClear, call.editKeep, call.thinkingDropped], [undefined, undefined, 0]);
});

function assertClose(actual: number, expected: number): void {
  assert.ok(Math.abs(actual - expected) < 1e-9, `${actual} is not ${expected}`);
}

test("a session the gateway never served has no calls; bad input is rejected", async () => {
  const s = await ctxd.createSession();
  assert.deepEqual(await ctxd.listGatewayCalls(s), { calls: [], nextPageToken: "" });
  await assert.rejects(ctxd.listGatewayCalls(s, { pageToken: "yesterday" }), (e: Error) => e instanceof InvalidArgumentError && /page_token/.test(e.message));
  await assert.rejects(ctxd.listGatewayCalls("not-a-uuid"), (e: Error) => e instanceof InvalidArgumentError && /session_id/.test(e.message));
  await assert.rejects(ctxd.listGatewayCalls(randomUUID()), NotFoundError);
});
