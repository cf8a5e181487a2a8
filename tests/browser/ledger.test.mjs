// The session page's gateway ledger: a row per call the gateway forwarded, in the order made,
// with the provider's cache figures and the totals; it follows the agent's next call live.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { Browser, startDriver } from './webdriver.mjs';
import { TARGET, serve, cli, getJson } from './ctxd.mjs';

const SHOTS = path.join(TARGET, 'inspector');

let tmp;
let server;
let driver;
let browser;
let upstream;

before(async () => {
  mkdirSync(SHOTS, { recursive: true });
  tmp = mkdtempSync(path.join(os.tmpdir(), 'ctxd-ledger-'));
  // A stand-in for the Anthropic API reporting the same cache reads and writes on every call.
  upstream = http.createServer((req, res) => {
    req.resume();
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
  server = await serve(path.join(tmp, 'ledger.db'), ['--gateway', '127.0.0.1:0', '--anthropic-upstream', `http://127.0.0.1:${upstream.address().port}`]);
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

/** One Messages call through the gateway: its answer's text and the session it was recorded in. */
async function call(messages, session) {
  const res = await fetch(`${server.gateway}/v1/messages`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json', 'x-api-key': 'sk-test', 'anthropic-version': '2023-06-01',
      ...(session ? { 'x-ctxd-session': session } : {}),
    },
    body: JSON.stringify({ model: 'claude-test', max_tokens: 64, messages }),
  });
  assert.equal(res.status, 200);
  return { text: (await res.json()).content[0].text, session: res.headers.get('x-ctxd-session-id') };
}

/** The session's ledger (the JSON API) once it holds `n` calls. */
async function callsOf(sid, n) {
  for (const end = Date.now() + 10000; Date.now() < end;) {
    const { body } = await getJson(server, `/api/sessions/${sid}/gateway-calls`);
    if (body.calls && body.calls.length >= n) return body.calls;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${n} gateway call(s) were not recorded`);
}

/** The ledger table's body rows and its totals row, as the cells' text. */
const TABLE = `
  const t = document.getElementById("gateway-ledger");
  if (!t) return null;
  const cells = (tr) => [...tr.querySelectorAll("td")].map((td) => td.textContent);
  return { rows: [...t.querySelectorAll("tbody tr")].map(cells), totals: cells(document.getElementById("ledger-totals")),
    summary: document.getElementById("ledger-summary").textContent };`;

test('a gateway session\'s page shows its ledger, call by call, and the next call live', async () => {
  const first = [{ role: 'user', content: 'Open a ledger through the gateway.' }];
  const { text, session: sid } = await call(first);
  assert.ok(sid, 'the gateway names the session it recorded');
  const [recorded] = await callsOf(sid, 1);
  assert.equal(recorded.cache_read_tokens, 3400);

  await browser.open(server.web, `#/s/${sid}`);
  const one = await browser.waitFor('the ledger', `const l = (() => {${TABLE}})(); return l && l.rows.length === 1 && l;`, 30000);
  const [row] = one.rows;
  // #, recorded, model, client, forwarded, cache read, cache write, uncached, kept, change, mark
  assert.equal(row[0], '1');
  assert.equal(row[2], 'anthropic claude-test');
  assert.deepEqual(row.slice(5, 8), ['3,400', '560', '12']);
  assert.equal(row[3], Number(recorded.client_tokens).toLocaleString('en'));
  assert.equal(row[8], Number(recorded.kept_tokens).toLocaleString('en'));
  assert.equal(row[9], recorded.change || '—');
  assert.equal(row[10], recorded.unexplained_miss ? '✗ miss' : '');
  assert.match(one.summary, /^gateway ledger: 1 call\(s\) · /);
  // The model table's entry that priced the calls (an unknown Claude model: `claude`, 0.1x reads,
  // 1.25x writes): 12 + 0.1 x 3,400 + 1.25 x 560.
  assert.equal(recorded.priced_by, 'claude');
  assert.equal(await browser.run('return document.getElementById("ledger-priced").textContent'),
    "priced by the model table's claude: cache-weighted input 1,052");

  // The agent's next call while the page is open: the ledger grows to two rows, totals added up.
  await call([...first, { role: 'assistant', content: text }, { role: 'user', content: 'A second call, for the ledger.' }], sid);
  const calls = await callsOf(sid, 2);
  const two = await browser.waitFor('the second call in the ledger', `const l = (() => {${TABLE}})(); return l && l.rows.length === 2 && l;`, 30000);
  assert.deepEqual(two.rows.map((r) => r[0]), ['1', '2']);
  assert.equal(two.totals[2], '2 call(s)');
  assert.deepEqual(two.totals.slice(5, 8), ['6,800', '1,120', '24']);
  const client = calls.reduce((a, c) => a + Number(c.client_tokens), 0);
  assert.equal(two.totals[3], client.toLocaleString('en'));
  const misses = calls.filter((c) => c.unexplained_miss).length;
  assert.match(two.summary, new RegExp(`${misses} unexplained cache miss\\(es\\)`));
  assert.equal(await browser.run('return document.querySelectorAll("#gateway-ledger tr.miss").length'), misses);
  // Folded under the gateway line until opened (or until a call misses with nothing to explain it).
  assert.equal(await browser.run('return document.getElementById("ledger").open'), misses > 0);
  await browser.run('document.getElementById("ledger").open = true');
  await browser.screenshot(path.join(SHOTS, 'ledger.png'));
});

test('a session the gateway never served has no ledger', async () => {
  const file = path.join(tmp, 'quiet.jsonl');
  writeFileSync(file, `${JSON.stringify({ role: 'user', content: 'Hello?' })}\n`);
  const sid = cli(server, ['import', file, '--json']).session.session_id;
  const { body } = await getJson(server, `/api/sessions/${sid}/gateway-calls`);
  assert.deepEqual(body, { calls: [], next_page_token: '' });
  await browser.open(server.web, `#/s/${sid}`);
  assert.equal(await browser.run('return document.getElementById("ledger").hidden'), true);
  assert.equal(await browser.run('return document.getElementById("gateway-ledger")'), null);
});
