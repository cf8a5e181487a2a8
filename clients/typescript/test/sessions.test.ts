// Sessions, appends (every node kind, CAS, idempotency), reads, branches, sub-agents and pins,
// against one live server for the file.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";

import {
  AbortedError,
  AlreadyExistsError,
  assistantMessage,
  Client,
  FailedPreconditionError,
  InvalidArgumentError,
  media,
  NotFoundError,
  type SessionFilter,
  status,
  systemMessage,
  text,
  toolResult,
  userMessage,
} from "../src";
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

const PNG = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 1, 2, 3]);

describe("sessions", () => {
  test("create with metadata, get, and an idempotent retry", async () => {
    const s = await ctxd.createSession({ metadata: { user: "ada" }, idempotencyKey: "create-1" });
    assert.deepEqual(s.metadata, { user: "ada" });
    assert.deepEqual(s.branches.map((b) => [b.name, b.headId]), [["main", ""]]);
    const again = await ctxd.createSession({ metadata: { user: "ada" }, idempotencyKey: "create-1" });
    assert.equal(again.id, s.id);
    await assert.rejects(ctxd.createSession({ metadata: { user: "bob" }, idempotencyKey: "create-1" }), FailedPreconditionError);
    assert.equal((await ctxd.getSession(s)).id, s.id);
    assert.equal((await ctxd.getSession(s.id)).createdAtUnixMs, s.createdAtUnixMs);
  });

  test("list pages, newest first", async () => {
    const made: string[] = [];
    for (let i = 0; i < 3; i++) made.push((await ctxd.createSession({ metadata: { page: String(i) } })).id);
    const first = await ctxd.listSessions({ pageSize: 2 });
    assert.equal(first.sessions.length, 2);
    assert.ok(first.nextPageToken);
    assert.deepEqual(first.sessions.map((s) => s.id), [made[2], made[1]]);
    const second = await ctxd.listSessions({ pageSize: 2, pageToken: first.nextPageToken });
    assert.equal(second.sessions[0].id, made[0]);
    const all: string[] = [];
    for await (const s of ctxd.sessions(2)) all.push(s.id);
    assert.ok(made.every((id) => all.includes(id)));
  });

  test("list filtered by metadata (every pair) and by id prefix", async () => {
    // Only this test's sessions carry `run`, whatever else the server holds.
    const run = randomUUID();
    const a1 = await ctxd.createSession({ metadata: { run, team: "a", shift: "1" } });
    const a2 = await ctxd.createSession({ metadata: { run, team: "a", shift: "2" } });
    const b = await ctxd.createSession({ metadata: { run, team: "b" } });
    const listed = async (filter: SessionFilter) => (await ctxd.listSessions({ ...filter, pageSize: 1000 })).sessions.map((s) => s.id);
    assert.deepEqual(await listed({ metadata: { run } }), [b.id, a2.id, a1.id]);
    assert.deepEqual(await listed({ metadata: { run, team: "a" } }), [a2.id, a1.id]);
    assert.deepEqual(await listed({ metadata: { run, team: "a", shift: "1" } }), [a1.id]);
    assert.deepEqual(await listed({ metadata: { run, team: "c" } }), []);
    // A value matches exactly, not by prefix.
    assert.deepEqual(await listed({ metadata: { run: run.slice(0, 8) } }), []);

    const prefix = a1.id.slice(0, 9);
    const byPrefix = await listed({ idPrefix: prefix });
    assert.ok(byPrefix.includes(a1.id));
    assert.ok(byPrefix.every((id) => id.startsWith(prefix)), String(byPrefix));
    // Sessions made in the same minute share their first characters, so the prefix may match
    // more than a1: exactly those of the three that start with it.
    const mine = [b, a2, a1].map((s) => s.id);
    assert.deepEqual(await listed({ idPrefix: prefix, metadata: { run } }), mine.filter((id) => id.startsWith(prefix)));
    assert.deepEqual(await listed({ idPrefix: a1.id }), [a1.id]);
    assert.deepEqual(await listed({ idPrefix: a1.id.toUpperCase() }), [a1.id]);
    assert.deepEqual(await listed({ idPrefix: a1.id, metadata: { team: "b" } }), []);
  });

  test("a filtered listing pages through its matches and no others", async () => {
    const run = randomUUID();
    const matching: string[] = [];
    for (let i = 0; i < 3; i++) {
      matching.push((await ctxd.createSession({ metadata: { run, i: String(i) } })).id);
      await ctxd.createSession({ metadata: { run: `${run}-other`, i: String(i) } });
    }
    const paged: string[] = [];
    let pageToken = "";
    for (let pages = 0; pages < 10; pages++) {
      const page = await ctxd.listSessions({ pageSize: 1, pageToken, metadata: { run } });
      assert.ok(page.sessions.length <= 1);
      paged.push(...page.sessions.map((s) => s.id));
      pageToken = page.nextPageToken;
      if (!pageToken) break;
    }
    assert.equal(pageToken, "");
    assert.deepEqual(paged, matching.toReversed());
    const iterated: string[] = [];
    for await (const s of ctxd.sessions(1, { metadata: { run } })) iterated.push(s.id);
    assert.deepEqual(iterated, matching.toReversed());
  });

  test("a bad filter is InvalidArgumentError naming the field", async () => {
    for (const idPrefix of ["xyz", "0193f2a1x", "0193-", "0".repeat(37)]) {
      const error = await ctxd.listSessions({ idPrefix }).catch((e) => e);
      assert.ok(error instanceof InvalidArgumentError, `${idPrefix}: ${error}`);
      assert.equal(error.code, status.INVALID_ARGUMENT);
      assert.match(error.details, /id_prefix/);
    }
    const error = await ctxd.listSessions({ metadata: { "": "x" } }).catch((e) => e);
    assert.ok(error instanceof InvalidArgumentError, String(error));
    assert.match(error.details, /metadata/);
  });

  test("nodeCount counts every branch and the internal chains of functions", async () => {
    const s = await ctxd.createSession();
    assert.equal(s.nodeCount, 0);
    assert.equal((await ctxd.getSession(s)).nodeCount, 0);
    const top = await ctxd.append(s, [
      userMessage("find the bug"),
      assistantMessage("", [{ id: "call_1", name: "researcher", arguments: {} }]),
      { type: "functionCall", callId: "call_1", input: "find the bug", expose: "io" },
    ]);
    const fnId = top.nodeId;
    const chain = await ctxd.append(s, [
      userMessage("find the bug in parse()"),
      assistantMessage("", [{ id: "r1", name: "read_file", arguments: {} }]),
      toolResult("r1", "def parse(): return 1/0"),
      assistantMessage("parse() divides by zero"),
    ], { functionId: fnId });
    const result = await ctxd.append(s, [{ type: "functionResult", callId: "call_1", output: "parse() divides by zero", status: "completed" }]);
    await ctxd.createBranch(s, "retry", top.nodeIds[0]);
    const retry = await ctxd.appendAssistant(s, "I will look myself.", [], { branch: "retry" });

    const written = [top, chain, result, retry].flatMap((a) => a.nodeIds);
    assert.equal(new Set(written).size, 9);
    assert.equal((await ctxd.getSession(s)).nodeCount, written.length);
    const [listed] = (await ctxd.listSessions({ idPrefix: s.id })).sessions;
    assert.equal(listed.id, s.id);
    assert.equal(listed.nodeCount, written.length);
  });

  test("an unknown session is NotFoundError with the gRPC status", async () => {
    const error = await ctxd.getSession("00000000-0000-0000-0000-000000000000").catch((e) => e);
    assert.ok(error instanceof NotFoundError, String(error));
    assert.equal(error.code, status.NOT_FOUND);
    assert.equal(error.codeName, "NOT_FOUND");
    assert.ok(error.details.length > 0);
  });
});

describe("append and read", () => {
  test("every node kind round-trips through getNodes", async () => {
    const s = await ctxd.createSession();
    const written = await ctxd.append(s, [
      systemMessage("You are terse."),
      userMessage([text("What is in this picture?"), media("image/png", PNG), media("application/pdf", "https://example.com/a.pdf")]),
      assistantMessage("Let me look.", [{ id: "call_1", name: "read_file", arguments: { path: "README.md" } }]),
      toolResult("call_1", "# ctxd", { isError: false }),
      assistantMessage("", [{ id: "call_2", name: "researcher", arguments: "{}" }]),
      { type: "functionCall", callId: "call_2", input: "find the bug", expose: "full" },
    ]);
    assert.equal(written.nodeIds.length, 6);
    assert.equal(written.headId, written.nodeId);
    const fnId = written.nodeIds[5];
    await ctxd.append(s, [userMessage("find the bug"), assistantMessage("it is in parse()")], { functionId: fnId });
    const closed = await ctxd.append(s, [{ type: "functionResult", callId: "call_2", output: "parse() divides by zero", status: "completed" }]);

    const nodes = await ctxd.getNodes(s, [...written.nodeIds, closed.nodeId]);
    assert.deepEqual(nodes.map((n) => n.kind), ["message", "message", "message", "toolResult", "message", "functionCall", "functionResult"]);
    assert.deepEqual(nodes[1].content, {
      type: "message",
      role: "user",
      parts: [
        { type: "text", text: "What is in this picture?" },
        { type: "media", mimeType: "image/png", data: PNG },
        { type: "media", mimeType: "application/pdf", url: "https://example.com/a.pdf" },
      ],
      toolCalls: [],
      pinned: false,
    });
    const call = nodes[2].content;
    assert.ok(call.type === "message");
    assert.deepEqual(call.toolCalls, [{ id: "call_1", name: "read_file", arguments: '{"path":"README.md"}' }]);
    // The server fills in the tool's name from the call.
    assert.deepEqual(nodes[3].content, { type: "toolResult", callId: "call_1", name: "read_file", parts: [{ type: "text", text: "# ctxd" }], isError: false, pinned: false });
    assert.deepEqual(nodes[5].content, { type: "functionCall", callId: "call_2", name: "researcher", input: "find the bug", expose: "full", pinned: false });
    const result = nodes[6].content;
    assert.ok(result.type === "functionResult");
    assert.equal(result.functionId, fnId);
    assert.equal(result.status, "completed");
    assert.notEqual(result.chainHeadId, "");
    assert.equal(nodes[1].parentId, nodes[0].id);

    const log = await ctxd.log(s, { limit: 3 });
    assert.deepEqual(log.nodes.map((n) => n.id), [closed.nodeId, fnId, written.nodeIds[4]]);
    assert.ok(log.nextPageToken);
    const rest = await ctxd.log(s, { limit: 100, pageToken: log.nextPageToken });
    assert.equal(rest.nodes.length, 4);
    const chain = await ctxd.log(s, { nodeId: result.chainHeadId, limit: 2 });
    assert.deepEqual(chain.nodes.map((n) => n.functionId), [fnId, fnId]);
  });

  test("a compare-and-swap that lost is AbortedError", async () => {
    const s = await ctxd.createSession();
    const first = await ctxd.appendUser(s, "one", { expectedHeadId: "" });
    await ctxd.appendAssistant(s, "two", [], { expectedHeadId: first.headId });
    const error = await ctxd.appendUser(s, "three", { expectedHeadId: first.headId }).catch((e) => e);
    assert.ok(error instanceof AbortedError, String(error));
    assert.equal(error.code, status.ABORTED);
  });

  test("a retry with the same idempotency key writes nothing", async () => {
    const s = await ctxd.createSession();
    const a = await ctxd.appendUser(s, "hello", { idempotencyKey: "turn-1" });
    const b = await ctxd.appendUser(s, "hello", { idempotencyKey: "turn-1" });
    assert.deepEqual(b, a);
    assert.equal((await ctxd.log(s)).nodes.length, 1);
  });

  test("pairing and validation errors keep the server's words", async () => {
    const s = await ctxd.createSession();
    await ctxd.appendAssistant(s, "", [{ id: "c1", name: "grep", arguments: { pattern: "x" } }]);
    await assert.rejects(ctxd.appendUser(s, "too early"), FailedPreconditionError);
    await assert.rejects(ctxd.appendAssistant(s, "", [{ id: "c2", name: "grep", arguments: "not json" }]), InvalidArgumentError);
    await assert.rejects(ctxd.append(s, [{ type: "message", role: "robot" as "user", parts: [] }]), /role must be one of/);
  });
});

describe("branches, pins, sub-agents", () => {
  test("create, list, render apart, delete", async () => {
    const s = await ctxd.createSession();
    const root = await ctxd.appendUser(s, "root");
    await ctxd.appendAssistant(s, "on main");
    const alt = await ctxd.createBranch(s, "alt", root.nodeId);
    assert.equal(alt.headId, root.nodeId);
    await ctxd.appendAssistant(s, "on alt", [], { branch: "alt" });
    await assert.rejects(ctxd.createBranch(s, "alt", root.nodeId), AlreadyExistsError);
    assert.deepEqual((await ctxd.listBranches(s)).map((b) => b.name).sort(), ["alt", "main"]);
    const texts = async (branch: string) => (await ctxd.render(s, { branch, format: "neutral" })).messages.map((m) => m.text);
    assert.deepEqual(await texts("main"), ["root", "on main"]);
    assert.deepEqual(await texts("alt"), ["root", "on alt"]);
    await ctxd.deleteBranch(s, "alt");
    assert.deepEqual((await ctxd.listBranches(s)).map((b) => b.name), ["main"]);
    await assert.rejects(ctxd.render(s, { branch: "alt" }), NotFoundError);
  });

  test("reset moves a head without touching nodes, with compare-and-swap", async () => {
    const s = await ctxd.createSession();
    const first = await ctxd.appendUser(s, "one");
    const second = await ctxd.appendAssistant(s, "two");
    const back = await ctxd.resetBranch(s, "main", first.nodeId, { expectedHeadId: second.headId });
    assert.equal(back.headId, first.nodeId);
    await assert.rejects(ctxd.resetBranch(s, "main", "", { expectedHeadId: second.headId }), AbortedError);
    assert.equal((await ctxd.resetBranch(s, "main", "")).headId, "");
    assert.equal((await ctxd.getNodes(s, [second.nodeId])).length, 1);
  });

  test("pin and unpin", async () => {
    const s = await ctxd.createSession();
    const rule = await ctxd.append(s, [userMessage("never touch migrations", { pinned: true })]);
    const other = await ctxd.appendAssistant(s, "ok");
    assert.deepEqual(await ctxd.pin(s, [other.nodeId]), [rule.nodeId, other.nodeId]);
    assert.deepEqual(await ctxd.unpin(s, [rule.nodeId]), [other.nodeId]);
    const [node] = await ctxd.getNodes(s, [other.nodeId]);
    assert.equal(node.pinned, true);
    assert.equal((await ctxd.contextStats(s)).pinnedNodeIds[0], other.nodeId);
  });

  test("runFunction closes the function, and on failure answers its pending calls", async () => {
    const s = await ctxd.createSession();
    await ctxd.appendUser(s, "research two things");
    await ctxd.appendAssistant(s, "", [
      { id: "f1", name: "researcher", arguments: {} },
      { id: "f2", name: "researcher", arguments: {} },
    ]);
    const done = await ctxd.runFunction(s, "f1", "first", async (fn) => {
      await fn.appendUser("first");
      await fn.appendAssistant("found it");
      return "the answer";
    });
    assert.ok(done.functionId);
    await assert.rejects(
      ctxd.runFunction(s, "f2", "second", async (fn) => {
        await fn.appendAssistant("", [{ id: "inner", name: "grep", arguments: {} }]);
        throw new Error("model crashed");
      }),
      /model crashed/,
    );
    const rendered = (await ctxd.render(s, { format: "neutral" })).messages;
    const results = rendered.filter((m) => m.role === "tool");
    assert.deepEqual(results.map((m) => [m.toolCallId, m.isError]), [["f1", false], ["f2", true]]);
    assert.match(results[1].text, /model crashed/);
  });
});
