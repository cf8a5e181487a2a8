// The sessions list: searched on the server (id prefix, metadata pairs), paged with "more", a
// refused search shown with the server's message; node counts as the server counts them
// (every node, sub-agent chains included).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Browser, startDriver } from './webdriver.mjs';
import { ROOT, TARGET, serve, cli, cliAsync, getJson } from './ctxd.mjs';

const SHOTS = path.join(TARGET, 'inspector');
const TRACE = path.join(ROOT, 'testdata', 'claude-code', '258c7280-ae70-4798-800f-63464d01a85d.jsonl');
const SUBAGENT = path.join(ROOT, 'testdata', 'claude-code', '258c7280-agent-a881341.jsonl');

let tmp;
let server;
let driver;
let browser;
const ids = {};

before(async () => {
  mkdirSync(SHOTS, { recursive: true });
  tmp = mkdtempSync(path.join(os.tmpdir(), 'ctxd-search-'));
  server = await serve(path.join(tmp, 'search.db'));
  const file = path.join(tmp, 'tiny.jsonl');
  writeFileSync(file, `${JSON.stringify({ role: 'user', content: 'hi' })}\n${JSON.stringify({ role: 'assistant', content: 'hello' })}\n`);
  for (const [name, meta] of [['a1', ['team=a', 'env=prod']], ['a2', ['team=a', 'env=dev']], ['b1', ['team=b', 'env=dev']]]) {
    ids[name] = cli(server, ['import', file, ...meta.flatMap((m) => ['--meta', m]), '--json']).session.session_id;
  }
  // More sessions of team c than a page holds (50), a few imports at a time.
  const many = Array.from({ length: 53 }, (_, i) => i);
  for (let i = 0; i < many.length; i += 6) {
    await Promise.all(many.slice(i, i + 6).map((k) => cliAsync(server, ['import', file, '--meta', 'team=c', '--meta', `k=${k}`, '--json'])));
  }
  // A Claude Code session whose sub-agent is a function with an internal chain.
  ids.cc = cli(server, ['import', TRACE, SUBAGENT, '--meta', 'team=cc', '--json']).session.session_id;
  driver = await startDriver();
  browser = await Browser.open(driver);
});

after(async () => {
  if (browser) await browser.close();
  if (driver) driver.proc.kill();
  if (server) server.stop();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

/** Submits the search form and waits for the answer; returns the sessions listed. */
async function search(id, meta) {
  await browser.run(`document.getElementById('search-id').value = arguments[0];
    document.getElementById('search-meta').value = arguments[1];
    document.getElementById('search-form').requestSubmit();`, id, meta);
  await browser.waitFor('the search', 'return document.body.dataset.ready');
  return browser.run('return [...document.querySelectorAll("#sessions tbody tr")].map(r => r.dataset.session)');
}

const errorShown = () => browser.run('const e = document.getElementById("search-error"); return e && e.textContent');

test('a metadata search lists only the sessions holding every pair', async () => {
  await browser.open(server.web, '#/');
  assert.ok((await browser.run('return document.querySelectorAll("#sessions tbody tr").length')) >= 50);
  assert.deepEqual((await search('', 'team=a')).sort(), [ids.a1, ids.a2].sort());
  assert.match(await browser.run('return location.hash'), /meta=team%3Da/);
  assert.deepEqual(await search('', 'team=a, env=dev'), [ids.a2]);
  assert.deepEqual(await search('', 'env=dev team=b'), [ids.b1]);
  assert.deepEqual(await search('', 'team=nobody'), []);
  assert.equal(await errorShown(), null);
  await browser.screenshot(path.join(SHOTS, 'search.png'));
});

test('a prefix of an id finds that session', async () => {
  const all = Object.values(ids);
  const id = ids.b1;
  // The shortest prefix (of at least 8 characters) no other session here shares: ids made in
  // the same millisecond share a long prefix.
  const others = [];
  for (let token = ''; ;) {
    const { body } = await getJson(server, `/api/sessions?page_size=50${token ? `&page_token=${encodeURIComponent(token)}` : ''}`);
    others.push(...body.sessions.map((s) => s.session_id).filter((s) => s !== id));
    token = body.next_page_token;
    if (!token) break;
  }
  let n = 8;
  while (others.some((o) => o.startsWith(id.slice(0, n)))) n++;
  assert.deepEqual(await search(id.slice(0, n), ''), [id]);
  assert.deepEqual(await search(id, ''), [id]);
  assert.deepEqual(await search(id.slice(0, n).toUpperCase(), 'team=b'), [id]);
  // A prefix that all share, and a metadata filter with it.
  const common = all.reduce((p, s) => { while (!s.startsWith(p)) p = p.slice(0, -1); return p; }, all[0]);
  if (common.length) assert.deepEqual((await search(common, 'team=a')).sort(), [ids.a1, ids.a2].sort());
});

test('a bad prefix shows the server\'s error message', async () => {
  const { status, body } = await getJson(server, '/api/sessions?page_size=50&id_prefix=zz-not-hex');
  assert.equal(status, 400);
  assert.equal(body.error.code, 'INVALID_ARGUMENT');
  assert.match(body.error.message, /id_prefix/);
  assert.deepEqual(await search('zz-not-hex', ''), []);
  assert.equal(await errorShown(), `INVALID_ARGUMENT: ${body.error.message}`);
  // A word that is not key=value is refused before asking.
  await search('', 'team');
  assert.match(await errorShown(), /metadata: "team" is not key=value/);
  // A good search again clears the error.
  assert.deepEqual(await search('', 'team=b'), [ids.b1]);
  assert.equal(await errorShown(), null);
});

test('a search of more than a page pages with "more", keeping the filter', async () => {
  const first = await search('', 'team=c');
  assert.equal(first.length, 50);
  assert.equal(await browser.run('return document.getElementById("more").hidden'), false);
  await browser.run('document.getElementById("more").click()');
  const all = await browser.waitFor('the second page', 'const r = [...document.querySelectorAll("#sessions tbody tr")]; return r.length > 50 && r.map(x => x.dataset.session);');
  assert.equal(all.length, 53);
  assert.equal(new Set(all).size, 53);
  assert.ok(!all.includes(ids.a1) && !all.includes(ids.cc));
  assert.equal(await browser.run('return document.getElementById("more").hidden'), true);
  assert.match(await browser.run('return document.getElementById("sessions-status").textContent'), /53 session\(s\) matching/);
});

test('the node count counts every node, the internal chains of function calls included', async () => {
  // Counted here from the log: the top-level nodes, then each function's chain.
  const top = [];
  for (let token = ''; ;) {
    const { body } = await getJson(server, `/api/sessions/${ids.cc}/log?limit=1000${token ? `&page_token=${encodeURIComponent(token)}` : ''}`);
    top.push(...body.nodes);
    token = body.next_page_token;
    if (!token) break;
  }
  let inner = 0;
  for (const n of top.filter((x) => x.content.function_result)) {
    const fid = n.content.function_result.function_id;
    const { body } = await getJson(server, `/api/sessions/${ids.cc}/log?node_id=${n.content.function_result.chain_head_id}&limit=1000`);
    inner += body.nodes.filter((x) => x.function_id === fid).length;
  }
  assert.ok(inner > 0, 'the sub-agent has an internal chain');
  const { body: session } = await getJson(server, `/api/sessions/${ids.cc}`);
  assert.equal(session.node_count, top.length + inner);
  assert.deepEqual(await search('', 'team=cc'), [ids.cc]);
  assert.equal(await browser.run('return document.querySelector("#sessions tbody tr .node-count").textContent'), (top.length + inner).toLocaleString('en'));
  // The session page says both.
  await browser.open(server.web, `#/s/${ids.cc}`);
  const meta = await browser.run('return document.getElementById("session-meta").textContent');
  assert.match(meta, new RegExp(`${(top.length + inner).toLocaleString('en')} nodes \\(${top.length.toLocaleString('en')} top-level\\)`));
});
