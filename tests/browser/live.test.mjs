// The session page follows its session live (`/api/sessions/{id}/events`): nodes an agent
// appends appear without a reload, branches and summaries update the page, a broken stream
// resumes where it stopped (nothing missed, nothing twice), and a deletion is shown.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Browser, startDriver } from './webdriver.mjs';
import { TARGET, serve, cli, append, getJson } from './ctxd.mjs';

const SHOTS = path.join(TARGET, 'inspector');

let tmp;
let db;
let server;
let driver;
let browser;
let sid;

before(async () => {
  mkdirSync(SHOTS, { recursive: true });
  tmp = mkdtempSync(path.join(os.tmpdir(), 'ctxd-live-'));
  db = path.join(tmp, 'live.db');
  server = await serve(db);
  const file = path.join(tmp, 'small.jsonl');
  const lines = [];
  for (let i = 0; i < 6; i++) lines.push(JSON.stringify({ role: i % 2 ? 'assistant' : 'user', content: `opening message ${i}: ${'a long opening, worth summarising. '.repeat(20)}` }));
  writeFileSync(file, `${lines.join('\n')}\n`);
  sid = cli(server, ['import', file, '--meta', 'name=live', '--json']).session.session_id;
  driver = await startDriver();
  browser = await Browser.open(driver);
});

after(async () => {
  if (browser) await browser.close();
  if (driver) driver.proc.kill();
  if (server) server.stop();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

/** The labels of the rows drawn (the session is small: every row is in view). */
const labels = () => browser.run('return [...document.querySelectorAll("#dag .row")].map(r => r.textContent)');
const liveState = () => browser.run('return document.getElementById("live") && document.getElementById("live").dataset.state');
const waitLive = () => browser.waitFor('the live stream', 'const l = document.getElementById("live"); return l && l.dataset.state === "live"');
/** How many drawn rows hold `text`. */
const rowsWith = (text) => browser.run('return [...document.querySelectorAll("#dag .row")].filter(r => r.textContent.includes(arguments[0])).length', text);

test('a node appended by an agent appears on the open session page without a reload', async () => {
  assert.equal(await browser.open(server.web, `#/s/${sid}`), `#/s/${sid}`);
  await waitLive();
  // A reload of the document would lose this mark.
  await browser.run('window.__stay = "here"');
  assert.equal((await labels()).length, 6);
  assert.match(await browser.run('return document.getElementById("session-meta").textContent'), /6 nodes \(6 top-level\)/);
  await append(server, sid, 'main', [['user', 'LIVE-ONE: appended while the page is open'], ['assistant', 'LIVE-TWO: the answer']]);
  await browser.waitFor('the appended nodes', 'return [...document.querySelectorAll("#dag .row")].some(r => r.textContent.includes("LIVE-TWO"))');
  assert.equal(await browser.run('return window.__stay'), 'here', 'the page was not reloaded');
  assert.equal(await rowsWith('LIVE-ONE'), 1);
  assert.equal(await rowsWith('LIVE-TWO'), 1);
  assert.equal((await labels()).length, 8);
  // The new head of main carries the branch badge; the counts follow.
  assert.ok(await browser.run('const r = [...document.querySelectorAll("#dag .row")].find(r => r.textContent.includes("LIVE-TWO")); return r.querySelector(".branch-head") !== null'));
  await browser.waitFor('the node count', 'return /8 nodes \\(8 top-level\\)/.test(document.getElementById("session-meta").textContent)');
  await browser.screenshot(path.join(SHOTS, 'live.png'));
});

test('a branch created while the page is open gets its lane, and its nodes go in it', async () => {
  const log = (await getJson(server, `/api/sessions/${sid}/log?limit=100`)).body;
  const fork = log.nodes.find((n) => n.content.message && n.content.message.parts[0].text.startsWith('opening message 3:'));
  cli(server, ['branch', sid, 'side', '--from', fork.node_id]);
  await browser.waitFor('the new lane', 'return [...document.querySelectorAll("#lanes .lane")].map(l => l.dataset.branch).includes("side")');
  await append(server, sid, 'side', [['user', 'SIDE-ONE: on the new branch']]);
  const lane = await browser.waitFor('the node on the side lane', `
    const r = [...document.querySelectorAll('#dag .row')].find(r => r.textContent.includes('SIDE-ONE'));
    return r && r.dataset.lane;`);
  assert.equal(lane, 'side');
  assert.equal(await rowsWith('SIDE-ONE'), 1);
  assert.equal(await browser.run('return window.__stay'), 'here');
});

test('a summary committed while the page is open shows its overlay', async () => {
  assert.equal(await browser.run('return document.querySelectorAll(".overlay[data-summary]").length'), 0);
  const log = (await getJson(server, `/api/sessions/${sid}/log?branch=main&limit=100`)).body;
  const text = (n) => (n.content.message ? n.content.message.parts[0].text : '');
  const from = log.nodes.find((n) => text(n).startsWith('opening message 0:'));
  const to = log.nodes.find((n) => text(n).startsWith('opening message 3:'));
  const out = cli(server, ['compact', sid, '--from', from.node_id, '--to', to.node_id, '--text', 'The opening, summarised.']);
  assert.doesNotMatch(out, /not applied/);
  await browser.waitFor('the summary overlay', 'return document.querySelector(".overlay[data-summary]")');
  assert.equal(await browser.run('return window.__stay'), 'here');
  await browser.screenshot(path.join(SHOTS, 'live-summary.png'));
});

test('after the server goes away the page reconnects and resumes: nothing missed, nothing twice', async () => {
  await waitLive();
  const before = (await labels()).length;
  // A reload of the DAG (what a stream that could not resume falls back to) would replace this
  // element: kept, it shows the node came through the resumed stream (Last-Event-ID).
  await browser.run('document.getElementById("dag").dataset.mark = "kept"');
  const addr = server.httpAddr;
  await server.kill();
  await browser.waitFor('the reconnecting state', 'return document.getElementById("live").dataset.state === "reconnecting"');
  // The same database on the same inspector address, as after a restart.
  server = await serve(db, [], { http: addr });
  // Most likely appended before the page has reconnected (it waits a second between attempts):
  // the resumed stream (Last-Event-ID) then brings it. Either way it must show, and once.
  await append(server, sid, 'main', [['user', 'AFTER-RESTART: appended while the page was away']]);
  await browser.waitFor('the node appended while away', 'return [...document.querySelectorAll("#dag .row")].some(r => r.textContent.includes("AFTER-RESTART"))', 15000);
  await waitLive();
  await append(server, sid, 'main', [['assistant', 'AFTER-RECONNECT: appended on the new stream']]);
  await browser.waitFor('the node appended after', 'return [...document.querySelectorAll("#dag .row")].some(r => r.textContent.includes("AFTER-RECONNECT"))');
  for (const t of ['LIVE-ONE', 'LIVE-TWO', 'SIDE-ONE', 'AFTER-RESTART', 'AFTER-RECONNECT']) assert.equal(await rowsWith(t), 1, t);
  assert.equal((await labels()).length, before + 2);
  assert.equal(await browser.run('return window.__stay'), 'here', 'the page was not reloaded');
  assert.equal(await browser.run('return document.getElementById("dag").dataset.mark'), 'kept', 'resumed, not reloaded');
  // The page's count agrees with the server's.
  const { node_count: count } = (await getJson(server, `/api/sessions/${sid}`)).body;
  await browser.waitFor('the count after the restart', 'return document.getElementById("node-count").textContent === arguments[0]', 10000, `${count} nodes`);
});

test('leaving the page stops its stream', async () => {
  await browser.run('window.__streams = 0; const f = window.fetch; window.fetch = (u, o) => { if (String(u).includes("/events")) window.__streams++; return f(u, o); };');
  await browser.run('location.hash = "#/"');
  await browser.waitFor('the sessions page', 'return document.body.dataset.ready === "#/"');
  await server.kill();
  server = await serve(db, [], { http: server.httpAddr });
  // Had the stream of the session page lived on, it would reconnect within a second or so.
  const deadline = Date.now() + 2500;
  while (Date.now() < deadline) {
    assert.equal(await browser.run('return window.__streams'), 0);
    await new Promise((r) => setTimeout(r, 100));
  }
});

test('a session deleted while its page is open says so', async () => {
  await browser.open(server.web, `#/s/${sid}`);
  await waitLive();
  cli(server, ['sessions', 'rm', sid]);
  await browser.waitFor('the deletion', 'return document.getElementById("session-deleted")');
  assert.equal(await liveState(), 'deleted');
  // The page keeps what it showed.
  assert.ok((await labels()).length > 0);
  await browser.screenshot(path.join(SHOTS, 'live-deleted.png'));
});
