// What the context policy saved (`/api/sessions/{id}/savings`): the render view's figures, the
// sessions list's column, and for a session the model gateway served, the provider's cache.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { Browser, startDriver } from './webdriver.mjs';
import { TARGET, serve, cli, getJson } from './ctxd.mjs';

const SHOTS = path.join(TARGET, 'inspector');
const fmt = (n) => Number(n).toLocaleString('en');
const cost = (x) => fmt(Math.round(x));
const pctSaved = (part, whole) => Math.round(100 * (1 - part / whole));

let tmp;
let server;
let driver;
let browser;
let upstream;
let big;
let quiet;

/** A coding session whose tool results are large: 12 file reads of ~120,000 characters each. */
function bigToolResults(file) {
  const lines = [
    { role: 'system', content: 'You are a careful coding agent.' },
    { role: 'user', content: 'Find where the parser handles escapes, and fix the bug.' },
  ];
  for (let i = 0; i < 12; i++) {
    const id = `call_${i}`;
    lines.push({ role: 'assistant', content: `Reading part ${i}.`, tool_calls: [{ id, name: 'read_file', arguments: JSON.stringify({ path: `src/part${i}.rs` }) }] });
    lines.push({ role: 'tool', tool_call_id: id, content: `// src/part${i}.rs\n${`fn item_${i}_${'x'.repeat(60)}() { let x = parse("\\\\n"); }\n`.repeat(1200)}` });
    lines.push({ role: 'assistant', content: `Part ${i} read: nothing there.` });
    lines.push({ role: 'user', content: 'Go on.' });
  }
  writeFileSync(file, `${lines.map((l) => JSON.stringify(l)).join('\n')}\n`);
}

before(async () => {
  mkdirSync(SHOTS, { recursive: true });
  tmp = mkdtempSync(path.join(os.tmpdir(), 'ctxd-savings-'));
  // A stand-in for the Anthropic API: answers every call, reporting cache reads and writes.
  upstream = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({
        id: 'msg_test', type: 'message', role: 'assistant', model: 'claude-test', stop_reason: 'end_turn', stop_sequence: null,
        content: [{ type: 'text', text: 'Hello from the stand-in provider.' }],
        usage: { input_tokens: 12, cache_read_input_tokens: 3400, cache_creation_input_tokens: 560, output_tokens: 7 },
      }));
    });
  });
  await new Promise((r) => upstream.listen(0, '127.0.0.1', r));
  server = await serve(path.join(tmp, 'savings.db'), ['--gateway', '127.0.0.1:0', '--anthropic-upstream', `http://127.0.0.1:${upstream.address().port}`]);
  const file = path.join(tmp, 'big-results.jsonl');
  bigToolResults(file);
  big = cli(server, ['import', file, '--meta', 'name=big-results', '--json']).session.session_id;
  // A session without a model call: nothing to save.
  const one = path.join(tmp, 'one.jsonl');
  writeFileSync(one, `${JSON.stringify({ role: 'user', content: 'Hello?' })}\n`);
  quiet = cli(server, ['import', one, '--meta', 'name=quiet', '--json']).session.session_id;
  driver = await startDriver();
  browser = await Browser.open(driver);
});

after(async () => {
  if (browser) await browser.close();
  if (driver) driver.proc.kill();
  if (server) server.stop();
  if (upstream) upstream.close();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

/** The figures the savings panel shows, by name. */
const figures = () => browser.run('return Object.fromEntries([...document.querySelectorAll("#savings [data-figure]")].map(e => [e.dataset.figure, e.textContent]))');

test('the render view at a small budget shows tokens and cost sent against unpruned, as /savings answers', async () => {
  const hash = `#/s/${big}/render?branch=main&budget=8000&reserve=0&tokenizer=heuristic&policy=stepped`;
  assert.equal(await browser.open(server.web, hash), hash);
  const state = await browser.waitFor('the savings', 'const s = document.getElementById("savings"); return s && s.dataset.state !== "loading" && s.dataset.state', 30000);
  assert.equal(state, 'done', await browser.run('return document.getElementById("savings").textContent'));
  // The page asks with the render's own parameters.
  const query = new URLSearchParams(await browser.run('return document.getElementById("savings").dataset.query'));
  assert.deepEqual(Object.fromEntries(query), { branch: 'main', tokenizer: 'heuristic', microcompact: 'stepped', context_window: '8000', output_reserve: '0', calls: '100' });
  const { status, body: sv } = await getJson(server, `/api/sessions/${big}/savings?${query}`);
  assert.equal(status, 200, JSON.stringify(sv));
  assert.ok(sv.next.sent_tokens < sv.next.unpruned_tokens, `sent ${sv.next.sent_tokens} < unpruned ${sv.next.unpruned_tokens}`);
  assert.ok(sv.next.sent_cost < sv.next.unpruned_cost, `next cost: ${JSON.stringify(sv)}`);
  assert.ok(sv.replayed.sent_cost < sv.replayed.unpruned_cost, `replayed cost: ${JSON.stringify(sv)}`);
  const f = await figures();
  assert.equal(f['next.tokens.sent'], fmt(sv.next.sent_tokens));
  assert.equal(f['next.tokens.unpruned'], fmt(sv.next.unpruned_tokens));
  assert.match(f['next.tokens.saved'], new RegExp(`^${pctSaved(sv.next.sent_tokens, sv.next.unpruned_tokens)}% saved`));
  assert.equal(f['next.cost.sent'], cost(sv.next.sent_cost));
  assert.equal(f['next.cost.unpruned'], cost(sv.next.unpruned_cost));
  assert.match(f['next.cost.saved'], new RegExp(`^${pctSaved(sv.next.sent_cost, sv.next.unpruned_cost)}% saved`));
  assert.equal(f['replayed.tokens.sent'], fmt(sv.replayed.sent_tokens));
  assert.equal(f['replayed.tokens.unpruned'], fmt(sv.replayed.unpruned_tokens));
  assert.equal(f['replayed.cost.sent'], cost(sv.replayed.sent_cost));
  assert.equal(f['replayed.cost.unpruned'], cost(sv.replayed.unpruned_cost));
  assert.match(f['replayed.cost.saved'], new RegExp(`^${pctSaved(sv.replayed.sent_cost, sv.replayed.unpruned_cost)}% saved`));
  // 12 reads + 12 answers: 24 model calls, all replayed.
  assert.equal(sv.calls_total, 24);
  assert.equal(sv.calls_replayed, 24);
  assert.match(await browser.run('return document.getElementById("savings-calls").textContent'), /24 of 24 model call/);
  assert.equal(sv.gateway, null);
  assert.equal(await browser.run('return document.getElementById("savings-gateway")'), null);
  await browser.screenshot(path.join(SHOTS, 'savings.png'));
});

test('the savings route refuses more than 1,000 calls, naming the parameter', async () => {
  const { status, body } = await getJson(server, `/api/sessions/${big}/savings?calls=5000`);
  assert.equal(status, 400, JSON.stringify(body));
  assert.match(body.error.message, /calls/);
});

test('the sessions list shows each session\'s cost saving, or a dash without model calls', async () => {
  assert.equal(await browser.open(server.web, '#/'), '#/');
  const cell = (id) => browser.waitFor(`the savings of ${id}`, `
    const c = document.querySelector('tr[data-session="${id}"] .savings');
    return c && c.dataset.loaded && c.textContent;`, 30000);
  const { body: sv } = await getJson(server, `/api/sessions/${big}/savings?calls=50&context_window=200000&output_reserve=16000`);
  assert.ok(sv.replayed.sent_cost < sv.replayed.unpruned_cost, JSON.stringify(sv));
  const pct = pctSaved(sv.replayed.sent_cost, sv.replayed.unpruned_cost);
  const sign = pct > 0 ? '−' : pct < 0 ? '+' : '±';
  assert.equal(await cell(big), `cost ${sign}${Math.abs(pct)}%`);
  assert.equal(await cell(quiet), '—');
});

test('a session the gateway served shows the provider\'s cache reads and writes', async () => {
  const res = await fetch(`${server.gateway}/v1/messages`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': 'sk-test', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model: 'claude-test', max_tokens: 64, messages: [{ role: 'user', content: 'Say hello through the gateway.' }] }),
  });
  assert.equal(res.status, 200);
  assert.match((await res.json()).content[0].text, /stand-in/);
  const gsid = res.headers.get('x-ctxd-session-id');
  assert.ok(gsid, 'the gateway names the session it recorded');
  // The answer is appended once whole: wait until the session holds it.
  const session = await (async () => {
    for (const end = Date.now() + 10000; Date.now() < end;) {
      const { body } = await getJson(server, `/api/sessions/${gsid}`);
      if (body.gateway && body.gateway.calls >= 1 && body.node_count >= 2) return body;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error('the gateway call was not recorded');
  })();
  assert.equal(session.gateway.cache_read_tokens, 3400);
  assert.equal(session.gateway.cache_write_tokens, 560);
  // The session page.
  await browser.open(server.web, `#/s/${gsid}`);
  const usage = await browser.run('return document.getElementById("gateway-usage").textContent');
  assert.match(usage, /3,400 cache reads/);
  assert.match(usage, /560 cache writes/);
  // The render view: the provider's figures and the weighted input, as /savings answers.
  await browser.open(server.web, `#/s/${gsid}/render?branch=main&budget=&reserve=0&tokenizer=heuristic&policy=stepped`);
  await browser.waitFor('the savings', 'const s = document.getElementById("savings"); return s && s.dataset.state === "done"', 30000);
  const query = await browser.run('return document.getElementById("savings").dataset.query');
  const { body: sv } = await getJson(server, `/api/sessions/${gsid}/savings?${query}`);
  assert.ok(sv.gateway, JSON.stringify(sv));
  const f = await figures();
  assert.equal(f['gateway.cache_read'], '3,400');
  assert.equal(f['gateway.cache_write'], '560');
  assert.equal(f['gateway.weighted_input'], cost(sv.gateway.weighted_input));
  await browser.screenshot(path.join(SHOTS, 'savings-gateway.png'));
  // The sessions list.
  await browser.open(server.web, '#/');
  const cache = await browser.waitFor('the provider cache cell', `
    const c = document.querySelector('tr[data-session="${gsid}"] .savings');
    return c && c.dataset.loaded && document.querySelector('tr[data-session="${gsid}"] .cache').textContent;`, 30000);
  assert.equal(cache, 'reads 3,400 · writes 560');
});

test('the page of a gateway session follows the agent\'s next call live', async () => {
  const call = (messages, session) => fetch(`${server.gateway}/v1/messages`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json', 'x-api-key': 'sk-test', 'anthropic-version': '2023-06-01',
      ...(session ? { 'x-ctxd-session': session } : {}),
    },
    body: JSON.stringify({ model: 'claude-test', max_tokens: 64, messages }),
  });
  const first = [{ role: 'user', content: 'Open a live session through the gateway.' }];
  const res = await call(first);
  assert.equal(res.status, 200);
  const answer = (await res.json()).content[0].text;
  const gsid = res.headers.get('x-ctxd-session-id');
  await browser.open(server.web, `#/s/${gsid}`);
  await browser.waitFor('the live stream', 'const l = document.getElementById("live"); return l && l.dataset.state === "live"');
  // The agent's next call, while the page is open: its question and the answer appear.
  const next = await call([...first, { role: 'assistant', content: answer }, { role: 'user', content: 'A second question, asked live.' }], gsid);
  assert.equal(next.status, 200);
  await next.text();
  const rows = await browser.waitFor('the next call on the page', `
    const rows = [...document.querySelectorAll("#dag .row")].map(r => r.textContent);
    return rows.some(t => t.includes("A second question, asked live.")) && rows.filter(t => t.includes("stand-in provider")).length >= 2 && rows;`, 30000);
  assert.equal(rows.filter((t) => t.includes('A second question, asked live.')).length, 1);
  assert.equal(await browser.run('return document.getElementById("live").dataset.state'), 'live');
});
