// A session's end and the store's upkeep: deleteSession and its tombstone, exportSession in every
// format read back through importSession, exportToFile, backupDatabase (the copy served by a
// second server) and collectGarbage, against one live server for the file.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { copyFileSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import {
  AlreadyExistsError,
  assistantMessage,
  Client,
  type ExportChunk,
  type ExportFormat,
  InvalidArgumentError,
  NotFoundError,
  type Session,
  status,
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

// Longer than the server's 64 KiB export chunks, so an export arrives in several.
const LONG = "a line of the file that was read\n".repeat(4_000);

/** A session worth exporting: a tool call and its long result on `main`, a pinned node, and a
 * second branch `alt` that the one-branch formats leave out. */
async function fixture(): Promise<{ session: Session; main: string[] }> {
  const session = await ctxd.createSession({ metadata: { case: "export" } });
  const first = await ctxd.append(session, [
    userMessage("What is in notes.txt?", { pinned: true }),
    assistantMessage("Reading it.", [{ id: "c1", name: "read_file", arguments: { path: "notes.txt" } }]),
    toolResult("c1", LONG),
    assistantMessage("notes.txt is a long list of lines."),
  ]);
  await ctxd.createBranch(session, "alt", first.nodeIds[0]);
  await ctxd.appendAssistant(session, "a reply only on alt", [], { branch: "alt" });
  return { session, main: first.nodeIds };
}

async function collect(chunks: AsyncIterable<ExportChunk>): Promise<{ data: Buffer; chunks: ExportChunk[] }> {
  const all: ExportChunk[] = [];
  for await (const chunk of chunks) all.push(chunk);
  return { data: Buffer.concat(all.map((c) => c.data)), chunks: all };
}

/** Role and text of every message `main` renders, for comparing a session with its copy. */
async function transcript(session: Session | string): Promise<string[]> {
  const { rendered } = await ctxd.render(session, { format: "neutral" });
  return rendered.map((m) => `${m.role}: ${m.text} ${m.toolCalls.map((c) => c.name).join(",")}`);
}

describe("deleteSession", () => {
  test("deletes for good and answers the same tombstone again", async () => {
    const s = await ctxd.createSession();
    const { nodeIds } = await ctxd.append(s, [userMessage("one"), assistantMessage("two"), userMessage("three")]);
    await ctxd.createBranch(s, "side", nodeIds[0]);
    const before = Date.now();
    const deleted = await ctxd.deleteSession(s);
    assert.equal(deleted.alreadyDeleted, false);
    const t = deleted.tombstone;
    assert.deepEqual([t.sessionId, t.nodes, t.branches, t.summaries, t.deletedBy], [s.id, 3, 2, 0, ""]);
    assert.ok(Math.abs(t.deletedAtUnixMs - before) < 60_000, `deletedAtUnixMs ${t.deletedAtUnixMs}`);

    const gone = await ctxd.getSession(s).catch((e: unknown) => e);
    assert.ok(gone instanceof NotFoundError, String(gone));
    assert.equal(gone.code, status.NOT_FOUND);
    await assert.rejects(ctxd.getNodes(s, [nodeIds[0]]), NotFoundError);

    assert.deepEqual(await ctxd.deleteSession(s.id), { tombstone: t, alreadyDeleted: true });
    await assert.rejects(ctxd.deleteSession("00000000-0000-0000-0000-000000000000"), NotFoundError);
  });
});

describe("exportSession", () => {
  test("ctxd JSONL: the whole session in chunks, read back into an equivalent one", async () => {
    const { session } = await fixture();
    const { data, chunks } = await collect(ctxd.exportSession(session));
    assert.ok(chunks.length > 1, `${chunks.length} chunk(s): the export should have streamed`);
    const heads = await ctxd.listBranches(session);
    assert.deepEqual(chunks[0].branches, heads, "the first chunk carries the heads");
    assert.ok(chunks.slice(1).every((c) => c.branches.length === 0 && c.warnings.length === 0));
    const text = data.toString("utf8");
    assert.ok(text.includes("notes.txt is a long list of lines.") && text.includes("a reply only on alt"));
    for (const line of text.trimEnd().split("\n")) JSON.parse(line);

    const copy = await ctxd.importSession({ data }, { format: "ctxd" });
    assert.equal(copy.format, "ctxd");
    assert.equal(copy.nodes, 5);
    assert.deepEqual((await ctxd.listBranches(copy.session)).map((b) => b.name).sort(), ["alt", "main"]);
    assert.deepEqual(await transcript(copy.session), await transcript(session));
    assert.equal((await ctxd.contextStats(copy.session)).pinnedNodeIds.length, 1, "the pin comes back");
  });

  test("OpenAI messages and Claude Code JSONL: one branch, and what they leave out", async () => {
    const { session, main } = await fixture();
    const openai = await collect(ctxd.exportSession(session, { format: "openai" }));
    const messages = JSON.parse(openai.data.toString("utf8"));
    assert.equal(messages.length, main.length);
    assert.equal(messages[1].tool_calls[0].function.name, "read_file");
    assert.ok(openai.chunks[0].warnings.join("\n").includes("alt"), String(openai.chunks[0].warnings));
    const fromOpenai = await ctxd.importSession({ data: openai.data }, { format: "openai" });
    assert.equal(fromOpenai.nodes, main.length);
    assert.deepEqual(await transcript(fromOpenai.session), await transcript(session));

    const alt = await collect(ctxd.exportSession(session, { format: "claude-code", branch: "alt" }));
    assert.ok(alt.data.toString("utf8").includes("a reply only on alt"));
    const claude = await collect(ctxd.exportSession(session, { format: "claude-code" }));
    assert.ok(!claude.data.toString("utf8").includes("a reply only on alt"));
    const fromClaude = await ctxd.importSession({ data: claude.data }); // detected
    assert.equal(fromClaude.format, "claude-code");
    assert.equal(fromClaude.nodes, main.length);
    assert.deepEqual(await transcript(fromClaude.session), await transcript(session));
  });

  test("bad requests: an unknown session or branch, an unknown format", async () => {
    const { session } = await fixture();
    await assert.rejects(collect(ctxd.exportSession("00000000-0000-0000-0000-000000000000")), NotFoundError);
    await assert.rejects(collect(ctxd.exportSession(session, { format: "openai", branch: "nope" })), NotFoundError);
    await assert.rejects(collect(ctxd.exportSession(session, { format: "pdf" as ExportFormat })), TypeError);
  });

  test("leaving the loop early cancels the export", async () => {
    const { session } = await fixture();
    for await (const chunk of ctxd.exportSession(session)) {
      assert.ok(chunk.data.length > 0);
      break;
    }
    // The client goes on working after the cancelled stream.
    assert.equal((await ctxd.getSession(session)).id, session.id);
  });

  test("exportToFile writes the file whole, and a failed export leaves the old one", async () => {
    const { session } = await fixture();
    const path = join(server.dir, "session.ctxd.jsonl");
    const written = await ctxd.exportToFile(session, path);
    assert.equal(written.path, path);
    assert.equal(statSync(path).size, written.bytes);
    assert.deepEqual(written.branches, await ctxd.listBranches(session));
    const copy = await ctxd.importSession({ path });
    assert.equal(copy.format, "ctxd");
    assert.deepEqual(await transcript(copy.session), await transcript(session));

    const old = join(server.dir, "old.json");
    writeFileSync(old, "keep me");
    await assert.rejects(ctxd.exportToFile("00000000-0000-0000-0000-000000000000", old, { format: "openai" }), NotFoundError);
    assert.equal(readFileSync(old, "utf8"), "keep me");
    assert.deepEqual(readdirSync(server.dir).filter((f) => f.includes("partial")), []);
  });
});

describe("admin", () => {
  test("backupDatabase: a consistent SQLite copy that a server can open", async () => {
    const s = await ctxd.createSession({ metadata: { backed: "up" } });
    await ctxd.appendUser(s, "remember this");
    const to = join(server.dir, "backup.db");
    const backup = await ctxd.backupDatabase(to);
    assert.equal(backup.path, to);
    assert.equal(backup.bytes, statSync(to).size);
    assert.ok(backup.tookMs >= 0);
    assert.equal(readFileSync(to).subarray(0, 16).toString("latin1"), "SQLite format 3\0");

    await assert.rejects(ctxd.backupDatabase(to), AlreadyExistsError);
    await assert.rejects(ctxd.backupDatabase("relative.db"), InvalidArgumentError);

    const restored = await Server.start((dir) => {
      copyFileSync(to, join(dir, "ctxd.db"));
      return [];
    });
    const other = new Client(restored.address, { timeoutMs: 30_000 });
    try {
      assert.deepEqual((await other.getSession(s.id)).metadata, { backed: "up" });
      const { rendered } = await other.render(s.id, { format: "neutral" });
      assert.deepEqual(rendered.map((m) => m.text), ["remember this"]);
    } finally {
      other.close();
      await restored.stop();
    }
  });

  test("collectGarbage: counts, and the space a deleted session left given back", async () => {
    const baseline = await ctxd.collectGarbage();
    assert.ok(baseline.sessions > 0 && baseline.databaseBytes > 0);
    assert.ok(baseline.freeBytes <= baseline.databaseBytes);

    const big = await ctxd.createSession();
    // Random, so no compression or sharing of content makes it small.
    await ctxd.append(big, [userMessage(randomBytes(3 << 19).toString("base64")), assistantMessage(randomBytes(3 << 19).toString("base64"))]);
    await ctxd.deleteSession(big);
    const collected = await ctxd.collectGarbage();
    assert.equal(collected.sessions, baseline.sessions);
    assert.equal(collected.tombstones, baseline.tombstones + 1);
    assert.ok(collected.releasedBytes >= 2 << 20, `released ${collected.releasedBytes} bytes of a deleted 4 MiB session`);
    assert.equal(collected.freeBytes, 0);
  });
});
