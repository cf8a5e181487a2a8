// watch: typed events, a connection killed mid-stream (through a loopback TCP proxy whose sockets
// the test destroys) resumed with no event lost or repeated, a saved cursor, the end at a
// deletion, an AbortSignal, and the failures that are not resumed.
import assert from "node:assert/strict";
import { createServer, connect, type Server as NetServer, type Socket } from "node:net";
import { after, before, describe, test } from "node:test";

import {
  Client,
  type CtxdError,
  InvalidArgumentError,
  NotFoundError,
  status,
  UnavailableError,
  userMessage,
  assistantMessage,
  type WatchEvent,
} from "../src";
import { Server } from "./server";

/** Forwards every connection to `target`; `drop()` kills the connections open now, as a network
 * failure would, and new ones are still accepted. */
class Proxy {
  connections = 0;
  readonly #sockets = new Set<Socket>();

  private constructor(
    readonly listener: NetServer,
    readonly address: string,
  ) {}

  static async start(target: string): Promise<Proxy> {
    const at = target.lastIndexOf(":");
    const [host, port] = [target.slice(0, at), Number(target.slice(at + 1))];
    const listener = createServer();
    await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
    const { port: own } = listener.address() as { port: number };
    const proxy = new Proxy(listener, `127.0.0.1:${own}`);
    listener.on("connection", (client) => {
      proxy.connections++;
      const upstream = connect(port, host);
      for (const [from, to] of [[client, upstream], [upstream, client]]) {
        proxy.#sockets.add(from);
        from.pipe(to);
        from.on("error", () => to.destroy());
        from.on("close", () => {
          proxy.#sockets.delete(from);
          to.destroy();
        });
      }
    });
    return proxy;
  }

  drop(): void {
    for (const socket of this.#sockets) socket.destroy();
  }

  async close(): Promise<void> {
    this.drop();
    await new Promise((resolve) => this.listener.close(resolve));
  }
}

let server: Server;
let proxy: Proxy;
/** Writes, straight to the server: unaffected by what the proxy does. */
let writer: Client;
/** Watches, through the proxy. */
let ctxd: Client;
before(async () => {
  server = await Server.start();
  proxy = await Proxy.start(server.address);
  writer = new Client(server.address, { timeoutMs: 30_000 });
  ctxd = new Client(proxy.address, { timeoutMs: 30_000 });
});
after(async () => {
  ctxd.close();
  writer.close();
  await proxy.close();
  await server.stop();
});

// A hang is a failure, not a stuck suite.
const LIMIT = { timeout: 20_000 };

async function next(events: AsyncIterator<WatchEvent>): Promise<WatchEvent> {
  const r = await events.next();
  assert.ok(!r.done, "the watch ended");
  return r.value;
}

/** The ids of the next `n` events, each of which must be a node. */
async function nodes(events: AsyncIterator<WatchEvent>, n: number): Promise<string[]> {
  const ids: string[] = [];
  while (ids.length < n) {
    const event = await next(events);
    assert.equal(event.type, "node", `expected a node, got ${JSON.stringify(event)}`);
    if (event.type === "node") ids.push(event.node.id);
  }
  return ids;
}

describe("watch", () => {
  test("a connection killed mid-stream resumes: every event exactly once", LIMIT, async () => {
    const s = await writer.createSession();
    const reconnects: CtxdError[] = [];
    const events = ctxd.watch(s, { onReconnect: (error) => reconnects.push(error) });
    try {
      const started = await next(events);
      assert.equal(started.type, "started");
      if (started.type === "started") assert.deepEqual(started.branches.map((b) => [b.name, b.headId]), [["main", ""]]);

      const first = await writer.append(s, [userMessage("one"), assistantMessage("two"), userMessage("three")]);
      // Two of three read: the third is in flight or buffered when the connection dies.
      assert.deepEqual(await nodes(events, 2), first.nodeIds.slice(0, 2));
      const connections = proxy.connections;
      proxy.drop();
      const second = await writer.append(s, [assistantMessage("four"), userMessage("five"), assistantMessage("six")]);

      assert.deepEqual(await nodes(events, 4), [first.nodeIds[2], ...second.nodeIds]);
      // Nothing repeated is still queued: the next event is the next node.
      const last = await writer.appendUser(s, "seven");
      assert.deepEqual(await nodes(events, 1), [last.nodeId]);

      assert.ok(reconnects.length >= 1, "the watch should have had to resume");
      assert.ok(reconnects[0] instanceof UnavailableError, String(reconnects[0]));
      assert.ok(proxy.connections > connections, "the resumed watch came over a new connection");
    } finally {
      await events.return(undefined);
    }
  });

  test("typed events, and a saved cursor or node resumes a new watch", LIMIT, async () => {
    const s = await writer.createSession();
    const a = await writer.appendUser(s, "hello");
    const seen: WatchEvent[] = [];
    let cursor = "";
    for await (const event of ctxd.watch(s)) {
      seen.push(event);
      cursor = event.cursor;
      if (event.type === "started") {
        await writer.createBranch(s, "alt", a.nodeId);
        await writer.deleteBranch(s, "alt");
        await writer.resetBranch(s, "main", "");
      }
      if (event.type === "headMoved") break;
    }
    const kinds = seen.map((e) => [e.type, e.branch]);
    assert.deepEqual(kinds, [["started", ""], ["branchCreated", "alt"], ["branchDeleted", "alt"], ["headMoved", "main"]]);
    assert.ok(seen[1].type === "branchCreated" && seen[1].ref.headId === a.nodeId, JSON.stringify(seen[1]));
    assert.ok(seen[2].type === "branchDeleted" && seen[2].ref.headId === a.nodeId, JSON.stringify(seen[2]));
    assert.ok(seen[3].type === "headMoved" && seen[3].ref.headId === "", JSON.stringify(seen[3]));

    // Written while nobody watches; a new watch from the saved cursor gets exactly them.
    const b = await writer.append(s, [userMessage("again"), assistantMessage("hi")]);
    const resumed = ctxd.watch(s, { afterCursor: cursor });
    try {
      assert.equal((await next(resumed)).type, "started");
      assert.deepEqual(await nodes(resumed, 2), b.nodeIds);
      const c = await writer.appendUser(s, "more");
      assert.deepEqual(await nodes(resumed, 1), [c.nodeId]);
    } finally {
      await resumed.return(undefined);
    }

    // One branch, after a node of it: what follows that node, then what comes.
    const fromNode = ctxd.watch(s, { branch: "main", afterNodeId: b.nodeIds[0] });
    try {
      assert.equal((await next(fromNode)).type, "started");
      const [later] = await nodes(fromNode, 1);
      assert.equal(later, b.nodeIds[1]);
    } finally {
      await fromNode.return(undefined);
    }
  });

  test("a deleted session's watch ends with its tombstone", LIMIT, async () => {
    const s = await writer.createSession();
    await writer.appendUser(s, "short-lived");
    const types: string[] = [];
    for await (const event of ctxd.watch(s)) {
      types.push(event.type);
      if (event.type === "started") await writer.deleteSession(s);
      if (event.type === "deleted") assert.deepEqual([event.tombstone.sessionId, event.tombstone.nodes], [s.id, 1]);
    }
    assert.deepEqual(types, ["started", "deleted"]);
  });

  test("an AbortSignal ends the watch without an error", LIMIT, async () => {
    const s = await writer.createSession();
    const controller = new AbortController();
    const events = ctxd.watch(s, { signal: controller.signal });
    assert.equal((await next(events)).type, "started");
    const waiting = events.next();
    controller.abort();
    assert.deepEqual(await waiting, { done: true, value: undefined });
  });

  test("failures that are not resumed reject with the status", LIMIT, async () => {
    const unknown = ctxd.watch("00000000-0000-0000-0000-000000000000");
    const error = await unknown.next().catch((e: unknown) => e);
    assert.ok(error instanceof NotFoundError, String(error));
    assert.equal(error.code, status.NOT_FOUND);
    const s = await writer.createSession();
    await assert.rejects(ctxd.watch(s, { afterCursor: "not-a-cursor" }).next(), InvalidArgumentError);
    await assert.rejects(ctxd.watch(s, { afterNodeId: "00000000-0000-0000-0000-000000000000" }).next(), InvalidArgumentError);
  });
});
