// The README's example (examples/quickstart.ts, importing the package by its name) run as a
// user would, against a live server.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { after, before, test } from "node:test";

import { Server } from "./server";

let server: Server;
before(async () => {
  server = await Server.start();
});
after(() => server.stop());

test("examples/quickstart prints an OpenAI conversation and its token count", async () => {
  const script = join(resolve(__dirname, ".."), "examples", "quickstart.js");
  const { stdout } = await promisify(execFile)(process.execPath, [script], { env: { ...process.env, CTXD_ADDRESS: server.address } });
  const tail = stdout.lastIndexOf("\n", stdout.length - 2);
  const messages = JSON.parse(stdout.slice(0, tail));
  assert.deepEqual(messages.map((m: { role: string }) => m.role), ["user", "assistant", "tool"]);
  assert.equal(messages[1].tool_calls[0].function.name, "read_file");
  assert.match(stdout.slice(tail + 1), /^\d+ tokens, fits: true\n$/);
});

test("a wrong address is one clear line and a failing exit", async () => {
  const script = join(resolve(__dirname, ".."), "examples", "quickstart.js");
  const run = promisify(execFile)(process.execPath, [script], { env: { ...process.env, CTXD_ADDRESS: "127.0.0.1:1" } });
  await assert.rejects(run, (e: { code: number; stderr: string }) => {
    assert.equal(e.code, 1);
    assert.match(e.stderr, /^UnavailableError: UNAVAILABLE: cannot reach ctxd at 127\.0\.0\.1:1: .*ECONNREFUSED/);
    return true;
  });
});
