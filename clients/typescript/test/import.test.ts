// ImportSession: a small neutral JSONL file streamed from disk in several chunks, the same bytes
// again under an idempotency key, and a malformed file's error naming the line.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, FailedPreconditionError, InvalidArgumentError } from "../src";
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

const FILE = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "What is in README.md?" },
  { role: "assistant", content: "Let me read it.", tool_calls: [{ id: "c1", name: "read_file", arguments: '{"path":"README.md"}' }] },
  { role: "tool", tool_call_id: "c1", content: "# ctxd\n" + "a persistent session store ".repeat(20) },
  { role: "assistant", content: "It describes ctxd." },
]
  .map((line) => JSON.stringify(line))
  .join("\n");

test("import a file in chunks, then render it", async () => {
  const path = Server.write(server.dir, "session.jsonl", FILE + "\n");
  const imported = await ctxd.importSession({ path }, { format: "neutral", metadata: { source: "test" }, chunkBytes: 64 });
  assert.equal(imported.nodes, 5);
  assert.equal(imported.format, "neutral");
  assert.deepEqual(imported.session.metadata, { source: "test" });
  const r = await ctxd.render(imported.session, { format: "neutral" });
  assert.deepEqual(r.messages.map((m) => m.role), ["system", "user", "assistant", "tool", "assistant"]);
  assert.equal(r.messages[3].name, "read_file");
});

test("bytes, format detected, and an idempotent retry", async () => {
  const first = await ctxd.importSession({ data: FILE }, { idempotencyKey: "import-1" });
  assert.equal(first.format, "neutral");
  const again = await ctxd.importSession({ data: Buffer.from(FILE) }, { idempotencyKey: "import-1" });
  assert.equal(again.session.id, first.session.id);
  await assert.rejects(ctxd.importSession({ data: FILE + "\n" + FILE }, { idempotencyKey: "import-1" }), FailedPreconditionError);
});

test("a malformed file names the line and leaves nothing behind", async () => {
  const before = (await ctxd.listSessions({ pageSize: 1000 })).sessions.length;
  const bad = FILE + '\n{"role": "user", "content": 42}\n';
  await assert.rejects(ctxd.importSession({ data: bad }, { format: "neutral" }), (e: unknown) => {
    assert.ok(e instanceof InvalidArgumentError, String(e));
    assert.match(e.details, /line 6/);
    return true;
  });
  assert.equal((await ctxd.listSessions({ pageSize: 1000 })).sessions.length, before);
});
