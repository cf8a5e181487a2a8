// The `ctxd` binary for the browser tests: a server on 127.0.0.1:0 (gRPC and --http, both
// addresses read from its stdout), its CLI for setup, and a minimal gRPC Append for what the CLI
// has no command for (nodes on a new branch).
import { spawn, execFile, execFileSync } from 'node:child_process';
import http2 from 'node:http2';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const TARGET = process.env.CARGO_TARGET_DIR ? path.resolve(ROOT, process.env.CARGO_TARGET_DIR) : path.join(ROOT, 'target');
export const BIN = process.env.CTXD_BIN || path.join(TARGET, 'debug', 'ctxd');

/**
 * `ctxd serve --http`: resolves once its addresses are printed (the gateway's too with
 * `--gateway`). `opts.http` serves the inspector on that address instead of a free port (to
 * restart a server where a page expects it); `opts.env` adds to the environment.
 */
export async function serve(db, extra = [], opts = {}) {
  const proc = spawn(BIN, ['serve', '--listen', '127.0.0.1:0', '--http', opts.http || '127.0.0.1:0', '--db', db, '--log', 'warn', ...extra], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, ...(opts.env || {}) },
  });
  const wanted = [/ctxd listening on \S+\n/, /ctxd http on \S+\n/];
  if (extra.includes('--gateway')) wanted.push(/ctxd gateway on \S+\n/);
  const exited = new Promise((resolve) => proc.once('exit', resolve));
  const lines = await new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (d) => {
      out += d;
      if (wanted.every((re) => re.test(out))) resolve(out);
    });
    proc.on('exit', (code) => reject(new Error(`ctxd serve exited (${code}): ${out}`)));
  });
  const grpc = lines.match(/ctxd listening on (\S+)/)[1];
  const web = lines.match(/ctxd http on (\S+)/)[1];
  const gateway = lines.match(/ctxd gateway on (\S+)/);
  return {
    proc,
    grpc,
    httpAddr: web,
    web: `http://${web}`,
    gateway: gateway ? `http://${gateway[1]}` : null,
    stop: () => proc.kill('SIGTERM'),
    /** Ends the server at once (SIGKILL): its streams break as in a crash; resolves on exit. */
    kill: () => { proc.kill('SIGKILL'); return exited; },
  };
}

/** GET a JSON API path of `server`'s inspector: `{status, body}`. */
export async function getJson(server, path, key) {
  const res = await fetch(`${server.web}${path}`, { headers: key ? { authorization: `Bearer ${key}` } : {} });
  return { status: res.status, body: await res.json() };
}

/** A CLI command against `server`; returns its stdout (JSON parsed with --json). */
export function cli(server, args, env = {}) {
  const out = execFileSync(BIN, [...args, '--server', `http://${server.grpc}`], {
    env: { ...process.env, ...env },
    encoding: 'utf8',
  });
  return args.includes('--json') ? JSON.parse(out) : out;
}

/** `cli`, without blocking: for many commands at once. */
export function cliAsync(server, args, env = {}) {
  return new Promise((resolve, reject) => {
    execFile(BIN, [...args, '--server', `http://${server.grpc}`], { env: { ...process.env, ...env }, encoding: 'utf8' }, (err, out, errOut) => {
      if (err) reject(new Error(`ctxd ${args.join(' ')}: ${err.message} ${errOut}`));
      else resolve(args.includes('--json') ? JSON.parse(out) : out);
    });
  });
}

// ---------------------------------------------------------------- gRPC Append, by hand

const varint = (n) => {
  const out = [];
  while (n > 127) { out.push((n & 127) | 128); n >>>= 7; }
  out.push(n);
  return Buffer.from(out);
};
const field = (no, bytes) => Buffer.concat([varint((no << 3) | 2), varint(bytes.length), bytes]);
const str = (no, s) => field(no, Buffer.from(s, 'utf8'));
const ROLES = { user: 3, assistant: 4 };

/** ctxd.v1.AppendRequest{session_id, branch, nodes: [Message{role, parts: [text]}]}. */
function appendRequest(session, branch, messages) {
  const nodes = messages.map(([role, text]) => {
    const message = Buffer.concat([Buffer.from([0x08, ROLES[role]]), field(2, str(1, text))]);
    return field(6, field(1, message));
  });
  return Buffer.concat([str(1, session), str(2, branch), ...nodes]);
}

/** Appends text messages to a branch over gRPC; rejects with the status message on failure. */
export function append(server, session, branch, messages, key) {
  const body = appendRequest(session, branch, messages);
  const frame = Buffer.concat([Buffer.from([0]), Buffer.from([0, 0, 0, 0]), body]);
  frame.writeUInt32BE(body.length, 1);
  return new Promise((resolve, reject) => {
    const client = http2.connect(`http://${server.grpc}`);
    client.on('error', reject);
    const headers = { ':method': 'POST', ':path': '/ctxd.v1.ContextStore/Append', 'content-type': 'application/grpc', te: 'trailers' };
    if (key) headers.authorization = `Bearer ${key}`;
    const req = client.request(headers);
    let status = null;
    let message = '';
    const take = (h) => {
      if (h['grpc-status'] !== undefined) { status = Number(h['grpc-status']); message = decodeURIComponent(h['grpc-message'] || ''); }
    };
    req.on('response', take);
    req.on('trailers', take);
    req.on('data', () => {});
    req.on('end', () => {
      client.close();
      if (status === 0) resolve();
      else reject(new Error(`Append: grpc-status ${status}: ${message}`));
    });
    req.end(frame);
  });
}
