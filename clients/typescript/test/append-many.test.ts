// appendMany over AppendStream, against a live server: every request written in order (as the
// log has them), a refusal in the middle naming `requests[N]` with nothing after it stored,
// idempotency keys per request, an endless source stopped by a refusal, an idle stream ended by a
// shutdown, and runFunction's closing writes sent as one stream.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  AbortedError,
  assistantMessage,
  Client,
  CtxdError,
  InvalidArgumentError,
  type NodeInput,
  status,
  toolResult,
  UnavailableError,
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

/** A turn of a tool-using agent as four appends: the question, a call, its result, the answer. */
function turn(i: number, size = 0): NodeInput[][] {
  const pad = size ? " " + "x".repeat(size) : "";
  return [
    [userMessage(`question ${i}${pad}`)],
    [assistantMessage("", [{ id: `c${i}`, name: "grep", arguments: { i } }])],
    [toolResult(`c${i}`, `result ${i}${pad}`)],
    [assistantMessage(`answer ${i}`)],
  ];
}

/** Every node id on `branch`, oldest first, following the log's pages. */
async function logged(session: string, branch = "main"): Promise<string[]> {
  const ids: string[] = [];
  let pageToken = "";
  do {
    const page = await ctxd.log(session, { branch, limit: 1000, pageToken });
    ids.push(...page.nodes.map((n) => n.id));
    pageToken = page.nextPageToken;
  } while (pageToken);
  return ids.reverse();
}

test("appendMany writes every request in order, each to its own target", async () => {
  const s = await ctxd.createSession();
  await ctxd.createBranch(s, "alt");
  const requests = [
    ...turn(0),
    // Two nodes in one request, then a request to another branch between two on main.
    [userMessage("two"), assistantMessage("nodes")],
    { branch: "alt", nodes: [userMessage("on alt")], pinned: true },
    { nodes: [userMessage("back on main")] },
    ...turn(1),
  ];
  const appended = await ctxd.appendMany(s, requests);
  assert.equal(appended.length, requests.length);
  assert.deepEqual(appended.map((a) => a.nodeIds.length), [1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1]);

  const main = appended.filter((_, i) => i !== 5).flatMap((a) => a.nodeIds);
  assert.deepEqual(await logged(s.id), main);
  assert.deepEqual(await logged(s.id, "alt"), appended[5].nodeIds);
  const [onAlt] = await ctxd.getNodes(s, appended[5].nodeIds);
  assert.equal(onAlt.pinned, true);
  assert.equal(onAlt.parentId, "");
  const branches = await ctxd.listBranches(s);
  assert.equal(branches.find((b) => b.name === "main")!.headId, appended[appended.length - 1].headId);
  // What the stream answers is what a unary append answers: the head after each request.
  assert.ok(appended.every((a) => a.headId === a.nodeId));
});

test("a large import from an async generator streams in order", { timeout: 120_000 }, async () => {
  const s = await ctxd.createSession();
  const turns = 500;
  let pulled = 0;
  async function* source(): AsyncGenerator<NodeInput[]> {
    for (let i = 0; i < turns; i++) {
      for (const request of turn(i, 4096)) {
        pulled++;
        yield request;
      }
    }
  }
  const appended = await ctxd.appendMany(s, source());
  assert.equal(pulled, turns * 4);
  assert.equal(appended.length, turns * 4);
  assert.deepEqual(await logged(s.id), appended.map((a) => a.nodeId));
  const [last] = await ctxd.getNodes(s, [appended[appended.length - 1].nodeId]);
  assert.deepEqual(last.content.type === "message" && last.content.parts, [{ type: "text", text: `answer ${turns - 1}` }]);
});

test("a refused request in the middle rejects naming it, and nothing after it is stored", async () => {
  const s = await ctxd.createSession();
  // A result for a call nobody made, then an append that would be fine on its own.
  const requests = [...turn(0), [toolResult("nobody", "x")], [userMessage("after the refusal")]];
  const error = await ctxd.appendMany(s, requests).catch((e: unknown) => e);
  assert.ok(error instanceof InvalidArgumentError, String(error));
  assert.equal(error.code, status.INVALID_ARGUMENT);
  assert.match(error.details, /^requests\[4\]\.nodes\[0\]\.tool_result\.call_id: /);
  assert.equal(error.acknowledged?.length, 4);
  assert.deepEqual(await logged(s.id), error.acknowledged.map((a) => a.nodeId));

  // A compare-and-swap that lost is ABORTED at its request; the one before it stays.
  const head = error.acknowledged[3].headId;
  await ctxd.appendUser(s, "moved on");
  const lost = await ctxd
    .appendMany(s, [[userMessage("fine")], { nodes: [userMessage("stale")], expectedHeadId: head }, [userMessage("never")]])
    .catch((e: unknown) => e);
  assert.ok(lost instanceof AbortedError, String(lost));
  assert.match(lost.details, /^requests\[1\]/);
  assert.equal(lost.acknowledged?.length, 1);
  const texts = (await ctxd.render(s, { format: "neutral" })).rendered.map((m) => m.text);
  assert.deepEqual(texts.slice(-2), ["moved on", "fine"]);
});

test("an endless source stops at the refusal", { timeout: 60_000 }, async () => {
  const s = await ctxd.createSession();
  let pulled = 0;
  let closed = false;
  async function* endless(): AsyncGenerator<NodeInput[]> {
    try {
      yield [userMessage("one")];
      yield [assistantMessage("two")];
      yield [toolResult("nobody", "refused")];
      for (;;) {
        pulled++;
        yield [userMessage("padding ".repeat(128))];
      }
    } finally {
      closed = true;
    }
  }
  const error = await ctxd.appendMany(s, endless()).catch((e: unknown) => e);
  assert.ok(error instanceof CtxdError, String(error));
  assert.match(error.details, /^requests\[2\]/);
  assert.equal(error.acknowledged?.length, 2);
  assert.equal((await logged(s.id)).length, 2);
  // Sending waited for the transport instead of reading the whole (endless) source.
  assert.ok(pulled < 20_000, `${pulled} requests pulled`);
  assert.ok(closed, "the source was closed");
});

test("a server shutting down ends an idle stream with UnavailableError, keeping what it wrote", { timeout: 60_000 }, async () => {
  const own = await Server.start();
  const client = new Client(own.address, { timeoutMs: 30_000 });
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  try {
    const s = await client.createSession();
    async function* idle(): AsyncGenerator<NodeInput[]> {
      yield [userMessage("one")];
      await gate; // the source has nothing more for now
    }
    const result = client.appendMany(s, idle()).catch((e: unknown) => e);
    // Once the first request is stored, stop the server under the open stream.
    const deadline = Date.now() + 30_000;
    while ((await client.log(s)).nodes.length === 0) {
      assert.ok(Date.now() < deadline, "the first request was never stored");
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    await own.stop();
    const error = await result;
    assert.ok(error instanceof UnavailableError, String(error));
    assert.match(error.details, /shutting down/);
    assert.equal(error.acknowledged?.length, 1);
  } finally {
    release();
    client.close();
    await own.stop();
  }
});

test("idempotency keys per request make a repeated stream write nothing", async () => {
  const s = await ctxd.createSession();
  const requests = turn(0).map((nodes, i) => ({
    nodes,
    idempotencyKey: `import-${i}`,
    ...(i === 0 ? { expectedHeadId: "" } : {}),
  }));
  const first = await ctxd.appendMany(s, requests);
  const again = await ctxd.appendMany(s, requests);
  assert.deepEqual(again, first);
  assert.deepEqual(await logged(s.id), first.map((a) => a.nodeId));
  // A key reused with other content is refused at that request.
  const reused = await ctxd.appendMany(s, [{ nodes: [userMessage("other")], idempotencyKey: "import-0" }]).catch((e: unknown) => e);
  assert.ok(reused instanceof CtxdError, String(reused));
  assert.equal(reused.code, status.FAILED_PRECONDITION);
  assert.match(reused.details, /^requests\[0\]/);
  assert.equal((await logged(s.id)).length, 4);
});

test("a malformed node in an array throws before anything is sent", async () => {
  const s = await ctxd.createSession();
  await assert.rejects(
    ctxd.appendMany(s, [[userMessage("fine")], [{ type: "message", role: "robot" as "user", parts: [] }]]),
    /role must be one of/,
  );
  assert.deepEqual(await logged(s.id), []);
});

test("FunctionHandle.appendMany writes into the chain; a failed body closes it over one stream", async () => {
  const s = await ctxd.createSession();
  await ctxd.appendAssistant(s, "", [{ id: "f1", name: "researcher", arguments: {} }]);
  // Count the RPCs the closing makes, on a client of its own.
  const client = new Client(server.address, { timeoutMs: 30_000 });
  const calls: string[] = [];
  for (const rpc of ["append", "appendStream"] as const) {
    const original = client.raw[rpc].bind(client.raw) as (...args: unknown[]) => unknown;
    (client.raw as unknown as Record<string, unknown>)[rpc] = (...args: unknown[]) => {
      calls.push(rpc);
      return original(...args);
    };
  }
  try {
    let chain: string[] = [];
    await assert.rejects(
      client.runFunction(s, "f1", "look", async (fn) => {
        const written = await fn.appendMany([[userMessage("look")], [assistantMessage("", [{ id: "inner", name: "grep", arguments: {} }])]]);
        chain = written.map((a) => a.nodeId);
        throw new Error("model crashed");
      }),
      /model crashed/,
    );
    // Open the function (unary), the body's two appends (one stream), the close (one stream).
    assert.deepEqual(calls, ["append", "appendStream", "appendStream"]);
    // The function's chain: the body's two nodes, then the error result of its pending call.
    const [close] = (await ctxd.log(s, { limit: 1 })).nodes;
    assert.ok(close.content.type === "functionResult", close.kind);
    assert.equal(close.content.status, "error");
    const functionId = close.content.functionId;
    const inside = (await ctxd.log(s, { nodeId: close.content.chainHeadId })).nodes.filter((n) => n.functionId === functionId).reverse();
    assert.deepEqual(inside.slice(0, 2).map((n) => n.id), chain);
    assert.equal(inside.length, 3);
    const answer = inside[2].content;
    assert.ok(answer.type === "toolResult", answer.type);
    assert.equal(answer.callId, "inner");
    assert.equal(answer.isError, true);
    assert.match(answer.parts[0].type === "text" ? answer.parts[0].text : "", /not run: the sub-agent stopped \(Error: model crashed\)/);
    const closed = (await ctxd.render(s, { format: "neutral" })).rendered.at(-1)!;
    assert.equal(closed.toolCallId, "f1");
    assert.equal(closed.isError, true);
  } finally {
    client.close();
  }
});
