// API keys and TLS against live servers (certificates made by openssl per run), and the errors a
// new user meets first: a wrong address, a missing or wrong key, plaintext to a TLS port.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { once } from "node:events";
import { type AddressInfo, createServer, type Socket } from "node:net";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { Client, pb, status, UnauthenticatedError, UnavailableError } from "../src";
import { Server } from "./server";

const KEY = "acme-1b6f0c9e4d2a7f35";
const OTHER_KEY = "globex-8e2d5a1c7b3f9046";

function writeKeys(dir: string): string[] {
  return ["--api-keys-file", Server.write(dir, "keys.txt", `# tenants\nacme ${KEY}\nglobex ${OTHER_KEY}\n`)];
}

/** A CA, a server certificate for 127.0.0.1 and localhost, and a client certificate, all
 * signed by the CA; P-256 keys so it takes milliseconds. */
function makeCertificates(dir: string): void {
  const openssl = (...args: string[]) => execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
  const key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  openssl("req", "-x509", ...key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=ctxd test CA",
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign");
  const issue = (name: string, ext: string) => {
    openssl("req", ...key, "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${name}`);
    Server.write(dir, `${name}.ext`, ext);
    openssl("x509", "-req", "-in", `${name}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
      "-out", `${name}.pem`, "-days", "1", "-extfile", `${name}.ext`);
  };
  issue("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n");
  issue("client", "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n");
}

describe("API keys", () => {
  let server: Server;
  before(async () => {
    server = await Server.start(writeKeys);
  });
  after(() => server.stop());

  test("a key is sent with every call, the raw stub's too", async () => {
    await using ctxd = new Client(server.address, { apiKey: KEY, timeoutMs: 30_000 });
    const s = await ctxd.createSession({ metadata: { who: "acme" } });
    await ctxd.appendUser(s, "hello");
    assert.deepEqual((await ctxd.render(s)).messages.map((m) => m.content), ["hello"]);
    const listed = await new Promise<number>((resolve, reject) =>
      ctxd.raw.listSessions(pb.ListSessionsRequest.fromPartial({ pageSize: 10 }), (e, r) => (e ? reject(e) : resolve(r.sessions.length))),
    );
    assert.equal(listed, 1);
  });

  test("no key, or a wrong one, is UnauthenticatedError saying so", async () => {
    await using anonymous = new Client(server.address, { timeoutMs: 30_000 });
    await assert.rejects(anonymous.createSession(), (e: unknown) => {
      assert.ok(e instanceof UnauthenticatedError, String(e));
      assert.equal(e.code, status.UNAUTHENTICATED);
      assert.match(e.message, /missing API key/);
      assert.match(e.message, /apiKey/); // how to give one
      return true;
    });
    await using wrong = new Client(server.address, { apiKey: "not-" + KEY, timeoutMs: 30_000 });
    await assert.rejects(wrong.createSession(), (e: unknown) => {
      assert.ok(e instanceof UnauthenticatedError);
      assert.match(e.message, /invalid API key/);
      assert.ok(!e.message.includes(KEY));
      return true;
    });
  });

  test("a key must fit in a header", () => {
    assert.throws(() => new Client("127.0.0.1:1", { apiKey: "two words" }), /visible ASCII/);
  });
});

describe("TLS", () => {
  let server: Server;
  before(async () => {
    server = await Server.start((dir) => {
      makeCertificates(dir);
      return [...writeKeys(dir), "--tls-cert", join(dir, "server.pem"), "--tls-key", join(dir, "server.key"), "--tls-client-ca", join(dir, "ca.pem")];
    });
  });
  after(() => server.stop());

  test("mutual TLS with a CA file, a client certificate and a key", async () => {
    const dir = server.dir;
    await using ctxd = new Client(`https://${server.address}`, {
      apiKey: OTHER_KEY,
      timeoutMs: 30_000,
      tls: { caFile: join(dir, "ca.pem"), certFile: join(dir, "client.pem"), keyFile: join(dir, "client.key") },
    });
    const s = await ctxd.createSession();
    assert.equal((await ctxd.getSession(s)).id, s.id);
    // The same with PEM given inline.
    await using inline = new Client(server.address, {
      apiKey: OTHER_KEY,
      tls: { ca: readFileSync(join(dir, "ca.pem"), "utf8"), cert: readFileSync(join(dir, "client.pem")), key: readFileSync(join(dir, "client.key")) },
    });
    assert.equal((await inline.getSession(s)).id, s.id);
  });

  test("without a client certificate, or in plaintext, the server is unavailable", async () => {
    await using noCert = new Client(server.address, { apiKey: OTHER_KEY, timeoutMs: 30_000, tls: { caFile: join(server.dir, "ca.pem") } });
    await assert.rejects(noCert.createSession(), UnavailableError);
    await using plaintext = new Client(server.address, { apiKey: OTHER_KEY, timeoutMs: 30_000 });
    await assert.rejects(plaintext.createSession(), UnavailableError);
  });

  test("TLS options are checked when the client is made", () => {
    assert.throws(() => new Client("127.0.0.1:1", { tls: { certFile: join(server.dir, "client.pem") } }), /go together/);
    assert.throws(() => new Client("127.0.0.1:1", { tls: { caFile: join(server.dir, "missing.pem") } }), /ENOENT/);
  });
});

describe("a wrong address", () => {
  test("a refused connection fails at once, naming the address", async () => {
    // A port that was just free: nothing listens there.
    const probe = createServer().listen(0, "127.0.0.1");
    await once(probe, "listening");
    const address = `127.0.0.1:${(probe.address() as AddressInfo).port}`;
    probe.close();
    await once(probe, "close");
    await using ctxd = new Client(address, { connectTimeoutMs: 5_000 });
    const started = Date.now();
    await assert.rejects(ctxd.createSession(), (e: unknown) => {
      assert.ok(e instanceof UnavailableError, String(e));
      assert.match(e.message, new RegExp(`cannot reach ctxd at ${address}`));
      assert.match(e.message, /ECONNREFUSED/);
      return true;
    });
    assert.ok(Date.now() - started < 5_000);
  });

  test("a server that never answers fails after the connect deadline", async () => {
    // A socket that accepts and then says nothing (not HTTP/2, not gRPC): the connection never
    // becomes ready, so only the connect deadline ends the wait.
    const sockets: Socket[] = [];
    const silent = createServer((socket) => sockets.push(socket)).listen(0, "127.0.0.1");
    await once(silent, "listening");
    const address = `127.0.0.1:${(silent.address() as AddressInfo).port}`;
    try {
      await using ctxd = new Client(address, { connectTimeoutMs: 500 });
      const started = Date.now();
      await assert.rejects(ctxd.createSession(), (e: unknown) => {
        assert.ok(e instanceof UnavailableError, String(e));
        assert.equal(e.message, `UNAVAILABLE: cannot reach ctxd at ${address}: no connection within 500 ms`);
        return true;
      });
      assert.ok(Date.now() - started < 5_000);
    } finally {
      sockets.forEach((s) => s.destroy());
      silent.close();
    }
  });
});
