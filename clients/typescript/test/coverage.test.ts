// Every RPC of the proto has a typed method on Client, and README.md lists it: an RPC added to
// proto/ctxd/v1/ctxd.proto without its client method fails here.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { test } from "node:test";

import { Client, pb } from "../src";
import { REPO } from "./server";

const PROTO = join(REPO, "proto", "ctxd", "v1", "ctxd.proto");
const README = resolve(__dirname, "../../README.md");

/** The RPCs whose method is not the RPC's name in camelCase. */
const RENAMED: Record<string, string> = {
  // A stream of many appends, where `append` is the unary one.
  AppendStream: "appendMany",
};

function rpcs(): string[] {
  const proto = readFileSync(PROTO, "utf8");
  return [...proto.matchAll(/^\s*rpc\s+(\w+)\s*\(/gm)].map((m) => m[1]);
}

function method(rpc: string): string {
  return RENAMED[rpc] ?? rpc[0].toLowerCase() + rpc.slice(1);
}

test("the proto's RPCs are read, as many as the generated service has", () => {
  const names = rpcs();
  // Guards the parsing itself: a pattern that matched nothing would pass everything below.
  assert.equal(names.length, Object.keys(pb.ContextStoreService).length, `parsed ${names.join(", ")}`);
  for (const rpc of Object.keys(RENAMED)) assert.ok(names.includes(rpc), `RENAMED names ${rpc}, which the proto no longer has`);
});

test("Client has a method for every RPC", () => {
  const missing = rpcs().filter((rpc) => typeof (Client.prototype as unknown as Record<string, unknown>)[method(rpc)] !== "function");
  assert.deepEqual(missing, [], `Client lacks a method for ${missing.map((r) => `${r} (${method(r)})`).join(", ")}`);
});

test("README.md lists every method", () => {
  const readme = readFileSync(README, "utf8");
  const unlisted = rpcs()
    .map(method)
    .filter((name) => !readme.includes(`\`${name}(`));
  assert.deepEqual(unlisted, [], "clients/typescript/README.md should name each as `method(...`");
});
