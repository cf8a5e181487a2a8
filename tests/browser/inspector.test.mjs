// The web inspector in a real browser: headless Chromium, driven over WebDriver, against the
// `ctxd serve --http` binary. Screenshots of each page go to target/inspector/.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Browser, startDriver } from './webdriver.mjs';
import { ROOT, TARGET, serve, cli, append } from './ctxd.mjs';

const SHOTS = path.join(TARGET, 'inspector');
const TRACE = path.join(ROOT, 'testdata', 'claude-code', '258c7280-ae70-4798-800f-63464d01a85d.jsonl');
const SUBAGENT = path.join(ROOT, 'testdata', 'claude-code', '258c7280-agent-a881341.jsonl');
const HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">';

let tmp;
let server;
let driver;
let browser;
let session;

before(async () => {
  mkdirSync(SHOTS, { recursive: true });
  tmp = mkdtempSync(path.join(os.tmpdir(), 'ctxd-inspector-'));
  server = await serve(path.join(tmp, 'open.db'));
  // A Claude Code session with its sub-agent (a function) and an imported summary.
  session = cli(server, ['import', TRACE, SUBAGENT, '--meta', 'name=cc258', '--json']).session.session_id;
  // A second branch forking at an earlier assistant message, with nodes of its own; one of them
  // is hostile markup that must show as text.
  const log = await (await fetch(`${server.web}/api/sessions/${session}/log?limit=1000`)).json();
  // A tool result after which the path goes on with an assistant message: no call unanswered.
  // The log is newest first, so nodes[i - 1] is the child of nodes[i].
  const at = log.nodes.findIndex((n, i) => i > 100 && n.content.tool_result && log.nodes[i - 1].content.message);
  const fork = log.nodes[at];
  cli(server, ['branch', session, 'alt', '--from', fork.node_id]);
  await append(server, session, 'alt', [['user', HOSTILE], ['assistant', 'Noted: that was markup, shown as text.']]);
  // A refused summary attempt: an empty text.
  cli(server, ['compact', session, '--budget', '20000', '--text', '   ']);
  driver = await startDriver();
  browser = await Browser.open(driver);
});

after(async () => {
  if (browser) await browser.close();
  if (driver) driver.proc.kill();
  if (server) server.stop();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

/** Opens a page of the inspector and waits until it has loaded (or failed). */
function open(base, hash) {
  return browser.open(base, hash);
}

test('the sessions page lists the session with its node count, branches and metadata', async () => {
  assert.equal(await open(server.web, '#/'), '#/');
  const headers = await browser.run('return [...document.querySelectorAll("#sessions th")].map(th => th.textContent)');
  assert.ok(headers.includes('nodes') && !headers.includes('top-level nodes'), `headers: ${headers}`);
  const row = await browser.run(`return document.querySelector('tr[data-session="${session}"]').textContent`);
  assert.match(row, /cc258/);
  assert.match(row, /main, alt|alt, main/);
  // The count is the server's node_count: every node, the sub-agent's chain included.
  const { node_count: count } = await (await fetch(`${server.web}/api/sessions/${session}`)).json();
  assert.equal(await browser.run(`return document.querySelector('tr[data-session="${session}"] .node-count').textContent`), count.toLocaleString('en'));
  // The search runs on the server: a metadata pair.
  await browser.run(`document.getElementById('search-meta').value = 'name=cc258'; document.getElementById('search-form').requestSubmit();`);
  await browser.waitFor('the search', 'return document.body.dataset.ready === location.hash && location.hash.includes("meta=")');
  assert.deepEqual(await browser.run('return [...document.querySelectorAll("#sessions tbody tr")].map(r => r.dataset.session)'), [session]);
  await browser.screenshot(path.join(SHOTS, 'sessions.png'));
});

test('the session page draws branch lanes, a fork, a collapsible function and summary overlays', async () => {
  assert.equal(await open(server.web, `#/s/${session}`), `#/s/${session}`);
  const lanes = await browser.run('return [...document.querySelectorAll("#lanes .lane")].map(l => l.dataset.branch)');
  assert.deepEqual(lanes, ['main', 'alt']);
  // The function call of the sub-agent: collapsed to its call and result, then opened.
  const call = await browser.waitFor('a function call row', `
    const box = document.getElementById('dag');
    for (let i = 0; i < 200; i++) {
      const row = document.querySelector('.row.function-call');
      if (row) return row.dataset.node;
      box.scrollTop += box.clientHeight;
      box.dispatchEvent(new Event('scroll'));
    }
    return null;`);
  assert.ok(await browser.run('return document.querySelectorAll(".row.function-result").length > 0'));
  assert.equal(await browser.run('return document.querySelectorAll(".row.inner").length'), 0);
  await browser.run(`document.querySelector('[data-call="${call}"]').click();`);
  const inner = await browser.waitFor('the internal chain', 'return document.querySelectorAll(".row.inner").length');
  assert.ok(inner > 0);
  // The imported summary is drawn over the nodes it covers.
  await browser.run('const b = document.getElementById("dag"); b.scrollTop = 0; b.dispatchEvent(new Event("scroll"));');
  await browser.waitFor('a summary overlay', 'return document.querySelector(".overlay[data-summary]")');
  // The alt branch's own nodes sit in its lane, after the fork.
  const alt = await browser.waitFor('a node in the alt lane', `
    const box = document.getElementById('dag');
    box.scrollTop = box.scrollHeight; box.dispatchEvent(new Event('scroll'));
    return document.querySelectorAll('.row[data-lane="alt"]').length;`);
  assert.equal(alt, 2);
  await browser.screenshot(path.join(SHOTS, 'session.png'));
});

test('node content is escaped: markup in a node shows as text and never runs', async () => {
  await open(server.web, `#/s/${session}`);
  const shown = await browser.waitFor('the hostile node', `
    const box = document.getElementById('dag');
    box.scrollTop = box.scrollHeight; box.dispatchEvent(new Event('scroll'));
    const row = [...document.querySelectorAll('.row[data-lane="alt"]')].find(r => r.textContent.includes('<script>'));
    if (!row) return null;
    row.click();
    return document.getElementById('detail').textContent;`);
  assert.ok(shown.includes(HOSTILE), 'the detail panel shows the markup as text');
  assert.equal(await browser.run('return window.__pwned === undefined'), true);
  assert.equal(await browser.run('return document.querySelectorAll("main script, main img").length'), 0);
  await browser.screenshot(path.join(SHOTS, 'escaped.png'));
});

test('the render view at a small budget marks cleared results and draws the context bar', async () => {
  await open(server.web, `#/s/${session}/render`);
  await browser.run(`
    document.getElementById('budget').value = '8000';
    document.getElementById('policy').value = 'stepped';
    document.getElementById('go').click();`);
  await browser.waitFor('the rendered messages', 'return document.body.dataset.ready && document.getElementById("messages")');
  const cleared = await browser.waitFor('a cleared result', `
    const box = document.getElementById('messages');
    for (let i = 0; i < 100; i++) {
      const m = document.querySelector('.msg.cleared');
      if (m) return m.textContent;
      box.scrollTop += box.clientHeight; box.dispatchEvent(new Event('scroll'));
    }
    return null;`);
  assert.match(cleared, /cleared/);
  assert.match(cleared, /tool/);
  const segments = await browser.run('return [...document.querySelectorAll("#context-bar [data-segment]")].map(s => s.dataset.segment)');
  assert.ok(segments.includes('tool results'), `segments: ${segments}`);
  assert.ok(await browser.run('return document.querySelector(".msg.summarised") !== null'), 'the imported summary is marked');
  const report = await browser.run('return document.getElementById("report").textContent');
  assert.match(report, /cleared [1-9]/);
  await browser.run('const b = document.getElementById("messages"); b.scrollTop = 0; b.dispatchEvent(new Event("scroll"));');
  await browser.screenshot(path.join(SHOTS, 'render.png'));
});

test('the summaries view shows a refused attempt with its reason and the covered range', async () => {
  await open(server.web, `#/s/${session}/summaries`);
  const refused = await browser.run('const a = document.querySelector(".attempt[data-kind=rejected]"); a.click(); return a.textContent;');
  assert.match(refused, /refused/);
  assert.match(refused, /empty/);
  assert.match(await browser.run('return document.getElementById("summary-detail").textContent'), /COMPACTION_REASON_EMPTY: the summary text is empty/);
  // The imported summary: its covered nodes highlighted in the DAG, its text shown.
  await browser.run('document.querySelector(".attempt[data-kind=committed]").click();');
  await browser.waitFor('covered rows', 'return document.querySelectorAll(".row.covered").length');
  assert.match(await browser.run('return document.getElementById("summary-detail").textContent'), /continued from a previous conversation/);
  await browser.screenshot(path.join(SHOTS, 'summaries.png'));
});

test('with API keys: 401 without a key, a key prompt, and each tenant sees only its sessions', async () => {
  const keys = path.join(tmp, 'keys');
  writeFileSync(keys, 'acme acme-key-0123456789\nglobex globex-key-9876543210\n');
  const keyed = await serve(path.join(tmp, 'keyed.db'), ['--api-keys-file', keys]);
  try {
    const acme = cli(keyed, ['import', path.join(ROOT, 'testdata', 'traces', 'swe-testrepo-fc.jsonl'), '--json'], { CTXD_API_KEY: 'acme-key-0123456789' }).session.session_id;
    for (const url of ['/api/sessions', `/api/sessions/${acme}`, `/api/sessions/${acme}/render`]) {
      const res = await fetch(`${keyed.web}${url}`);
      assert.equal(res.status, 401, url);
      const body = await res.text();
      assert.ok(!body.includes(acme), `${url} leaks nothing`);
      assert.match(body, /missing API key/);
    }
    await open(keyed.web, '#/');
    assert.equal(await browser.run('return document.getElementById("key-form").hidden'), false);
    await browser.screenshot(path.join(SHOTS, 'key.png'));
    const login = async (key) => {
      await browser.run(`document.getElementById('key-input').value = arguments[0]; document.body.dataset.ready = '';
        document.getElementById('key-form').requestSubmit();`, key);
      await browser.waitFor('the sessions after the key', 'return document.body.dataset.ready');
    };
    await login('globex-key-9876543210');
    assert.equal(await browser.run('return document.querySelectorAll("#sessions tbody tr").length'), 0);
    await browser.run('sessionStorage.clear()');
    await open(keyed.web, `#/s/${acme}`);
    await login('globex-key-9876543210');
    assert.match(await browser.run('return document.getElementById("error").textContent'), /NOT_FOUND/);
    await browser.run('sessionStorage.clear()');
    await open(keyed.web, '#/');
    await login('acme-key-0123456789');
    assert.equal(await browser.run('return document.querySelectorAll("#sessions tbody tr").length'), 1);
    await browser.run('sessionStorage.clear()');
  } finally {
    keyed.stop();
  }
});

test('a session of 10,000 nodes opens with only the rows in view drawn', async () => {
  const file = path.join(tmp, 'big.jsonl');
  const lines = [];
  for (let i = 0; i < 10000; i++) {
    lines.push(JSON.stringify({ role: i % 2 ? 'assistant' : 'user', content: `message ${i}: ${'lorem ipsum '.repeat(4)}` }));
  }
  writeFileSync(file, `${lines.join('\n')}\n`);
  const big = cli(server, ['import', file, '--json']).session.session_id;
  await open(server.web, '#/');
  const started = Date.now();
  await browser.goto(`${server.web}/#/s/${big}`);
  await browser.waitFor('the big session', 'return document.body.dataset.ready && document.querySelector(".row")');
  const took = Date.now() - started;
  const meta = await browser.run('return document.getElementById("session-meta").textContent');
  assert.match(meta, /10,000 nodes \(10,000 top-level\)/);
  // Only the rows in view (and an overscan) are in the document.
  assert.ok(await browser.run('return document.querySelectorAll(".row").length') < 200);
  console.log(`10,000 nodes opened in ${took} ms (${meta.match(/drawn in \d+ ms/)[0]})`);
  // The time is a measurement (printed above), not a verdict: it depends on the machine
  // (1.2-1.4 s for the debug binary on a loaded 2-core machine, 0.4-0.7 s on an idle one).
  // Only a pathology, such as drawing every row, fails here.
  assert.ok(took < 5000, `took ${took} ms`);
  await browser.screenshot(path.join(SHOTS, 'big-session.png'));
});
