// The ctxd inspector: plain JavaScript, no framework, no build step (embedded in the binary).
// Every piece of session content reaches the page through `textContent` (the `h` helper), never
// as HTML, so a node holding `<script>` shows as text; the server's CSP forbids inline script
// besides.
'use strict';

const KEY = 'ctxd-api-key';
const ROW = 22; // px per DAG row
const MSG = 48; // px per rendered message row
const LANE = 16; // px per lane
const OVERSCAN = 20;

// ------------------------------------------------------------------ basics

/** An element with attributes (on* as listeners) and children (strings become text nodes). */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    // Through the CSSOM: the page's CSP (no 'unsafe-inline' styles) refuses style attributes.
    else if (k === 'style') el.style.cssText = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Replaces an element's children (strings as text; arrays flattened; null skipped). */
function fill(el, ...children) {
  el.replaceChildren();
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const enc = encodeURIComponent;
const view = () => document.getElementById('view');
const fmtTime = (ms) => (ms ? new Date(Number(ms)).toISOString().replace('T', ' ').slice(0, 19) : '');
const short = (id) => (id ? id.slice(-8) : '');
const num = (n) => Number(n || 0).toLocaleString('en');

/** What a ledger change says, in words: why the provider wrote its cache again. */
function changeMeaning(change) {
  const step = /^step:(\d+)(?::payback:(\d+))?$/.exec(change || '');
  if (step) return `a step cleared the results before ${step[1]}` + (step[2] ? `; its saving pays back the rewrite within ${step[2]} calls` : '');
  const expired = /^expired:(-?\d+)$/.exec(change || '');
  if (expired) return `the provider's cache had expired (${Math.round(Number(expired[1]) / 1000)} s idle)`;
  return { first: 'the first call', budget: 'over budget', marker_moved: 'a cache marker moved', client_changed: 'the client changed its history' }[change] || '';
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/**
 * Aborted when the route changes: every request and stream of the page shown uses its signal,
 * so leaving a page stops its work (a live stream, lazy loads) and nothing it still had in flight
 * can draw over the next page.
 */
let pageAbort = new AbortController();

function authHeaders() {
  const key = sessionStorage.getItem(KEY);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

/** An error answer's `{code, message}` (the body's `error`, or the HTTP status). */
async function errorOf(res) {
  let body = null;
  try {
    body = await res.json();
  } catch (_) {
    body = null;
  }
  return body && body.error ? body.error : { code: String(res.status), message: res.statusText };
}

/**
 * GET an /api path; with a stored key, sends it as a bearer token. On 401, asks for a key.
 * `signal` defaults to the current page's.
 */
async function api(path, signal) {
  const res = await fetch(path, { headers: authHeaders(), signal: signal || pageAbort.signal });
  if (!res.ok) {
    const err = await errorOf(res);
    if (res.status === 401) askForKey(err.message);
    throw new ApiError(res.status, err.code, err.message);
  }
  return res.json();
}

const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
});

/** `part` of `whole` saved, as a percentage and a ratio: "63% saved (0.37×)". */
function saved(part, whole) {
  if (!whole) return '—';
  const ratio = part / whole;
  const pct = Math.round(100 * (1 - ratio));
  return `${pct >= 0 ? `${pct}% saved` : `${-pct}% more`} (${ratio.toFixed(2)}×)`;
}

function askForKey(message) {
  const form = document.getElementById('key-form');
  form.hidden = false;
  document.getElementById('key-error').textContent = sessionStorage.getItem(KEY) ? message : '';
}

function showError(e) {
  fill(view(), h('p', { class: 'error', id: 'error' }, `${e.code || 'error'}: ${e.message}`));
}

/** The text of a node's or message's parts; media as a placeholder. */
function partsText(parts) {
  return (parts || []).map((p) => (p.text !== undefined ? p.text : `[${(p.media && p.media.mime_type) || 'media'}]`)).join('\n');
}

/** A node's kind and a one-line preview of it. */
function describe(n) {
  const c = n.content || {};
  if (c.message) {
    const calls = c.message.tool_calls.map((t) => `${t.name}(…)`).join(' ');
    return [c.message.role.replace('ROLE_', '').toLowerCase(), `${partsText(c.message.parts)} ${calls}`.trim()];
  }
  if (c.tool_result) return [`result ${c.tool_result.name}`, partsText(c.tool_result.parts)];
  if (c.function_call) return [`function ${c.function_call.name}`, c.function_call.input];
  if (c.function_result) return ['fn result', c.function_result.output];
  return [n.kind, ''];
}

/** Long text folded: the head shown, the rest behind a <details>. */
function folded(text, limit = 1500) {
  if (text.length <= limit) return h('pre', {}, text);
  return h('div', {}, h('pre', {}, text.slice(0, limit) + '…'),
    h('details', {}, h('summary', {}, `show all ${num(text.length)} characters`), h('pre', {}, text)));
}

function nodeDetail(n) {
  const c = n.content || {};
  const [kind] = describe(n);
  const out = [h('h3', {}, kind), h('p', { class: 'mono muted' }, `node ${n.node_id}`, h('br'), `parent ${n.parent_id || '—'}`,
    h('br'), `created ${fmtTime(n.created_at_unix_ms)}`, n.pinned ? ' · pinned' : '', n.function_id ? h('span', {}, h('br'), `in function ${n.function_id}`) : '')];
  if (c.message) {
    out.push(folded(partsText(c.message.parts)));
    for (const t of c.message.tool_calls) out.push(h('p', {}, h('b', {}, `call ${t.name}`), ` ${t.call_id}`), folded(t.arguments_json, 600));
  } else if (c.tool_result) {
    out.push(h('p', {}, `answers ${c.tool_result.call_id}`, c.tool_result.is_error ? ' (error)' : ''), folded(partsText(c.tool_result.parts)));
  } else if (c.function_call) {
    out.push(h('p', {}, `expose ${c.function_call.expose}`), h('h4', {}, 'input'), folded(c.function_call.input));
  } else if (c.function_result) {
    out.push(h('p', {}, `${c.function_result.status}, closes ${c.function_result.function_id}`), h('h4', {}, 'output'), folded(c.function_result.output));
  }
  return out;
}

function crumbs(sid, here) {
  const links = [h('a', { href: '#/' }, 'Sessions')];
  if (sid) {
    links.push(h('a', { href: `#/s/${enc(sid)}` }, `Session ${short(sid)}`),
      h('a', { href: `#/s/${enc(sid)}/render` }, 'Render'), h('a', { href: `#/s/${enc(sid)}/summaries` }, 'Summaries'));
  }
  for (const a of links) if (a.textContent.startsWith(here)) a.setAttribute('aria-current', 'page');
  fill(document.getElementById('crumbs'), ...links);
}

/**
 * Renders only the rows of a tall list that are in view, so lists of 10,000 stay cheap. `count`
 * is a function: a list grows when a function's internal chain is opened.
 */
function virtualList(box, count, height, draw) {
  const inner = h('div', { class: 'dag-inner' });
  fill(box, inner);
  let last = '';
  const paint = () => {
    const n = count();
    inner.style.height = `${n * height}px`;
    const first = Math.max(0, Math.floor(box.scrollTop / height) - OVERSCAN);
    const end = Math.min(n, Math.ceil((box.scrollTop + box.clientHeight) / height) + OVERSCAN);
    const key = `${n}:${first}:${end}`;
    if (key === last) return;
    last = key;
    fill(inner, ...draw(first, end));
  };
  box.onscroll = paint;
  paint();
  return {
    repaint: () => { last = ''; paint(); },
    scrollTo: (i) => { box.scrollTop = Math.max(0, i * height - box.clientHeight / 2); last = ''; paint(); },
  };
}

// ------------------------------------------------------------------ sessions

/** "a=1 b=2, c=3" as pairs; a word without `=` (or with an empty key) is an error. */
function metadataPairs(text) {
  const pairs = [];
  for (const word of text.split(/[\s,]+/).filter(Boolean)) {
    const at = word.indexOf('=');
    if (at <= 0) throw new ApiError(400, 'INVALID_ARGUMENT', `metadata: ${JSON.stringify(word)} is not key=value`);
    pairs.push([word.slice(0, at), word.slice(at + 1)]);
  }
  return pairs;
}

/**
 * What the sessions list measures savings at: the default policy in a 200,000-token window with
 * 16,000 reserved for output (as `benches/economy.rs` does), over each session's newest 50 calls.
 */
const LIST_SAVINGS = 'calls=50&context_window=200000&output_reserve=16000';

/** A session's savings in one cell: the cache-weighted cost over its last calls, "cost −63%". */
function savingsCell(sv) {
  const r = sv.replayed;
  if (!sv.calls_replayed || !r.unpruned_cost) return ['—', sv.calls_total ? 'nothing to save' : 'no model calls'];
  const pct = Math.round(100 * (1 - r.sent_cost / r.unpruned_cost));
  return [`cost ${pct > 0 ? '−' : pct < 0 ? '+' : '±'}${Math.abs(pct)}%`,
    `default policy in a 200,000-token window, last ${num(sv.calls_replayed)} of ${num(sv.calls_total)} model calls: ${num(r.sent_tokens)} tokens sent of ${num(r.unpruned_tokens)} unpruned; `
    + `cache-weighted cost ${num(Math.round(r.sent_cost))} vs ${num(Math.round(r.unpruned_cost))}`];
}

/**
 * Fetches each session's savings once its row comes into view, a few at a time (a savings answer
 * replays up to 50 renders), and fills the row's savings and provider-cache cells.
 */
function savingsLoader(signal) {
  const LIMIT = 3;
  const queue = [];
  let running = 0;
  const one = async (tr) => {
    const cell = tr.querySelector('.savings');
    const cache = tr.querySelector('.cache');
    try {
      const sv = await api(`/api/sessions/${enc(tr.dataset.session)}/savings?${LIST_SAVINGS}`, signal);
      const [text, title] = savingsCell(sv);
      cell.textContent = text;
      cell.title = title;
      const g = sv.gateway;
      cache.textContent = g ? `reads ${num(g.cache_read_tokens)} · writes ${num(g.cache_write_tokens)}` : '';
      if (g) cache.title = `${num(g.calls)} gateway call(s); weighted input ${num(Math.round(g.weighted_input))}`;
    } catch (e) {
      if (signal.aborted) return;
      cell.textContent = '?';
      cell.title = `${e.code || 'error'}: ${e.message}`;
    }
    cell.dataset.loaded = '1';
  };
  const pump = () => {
    while (running < LIMIT && queue.length && !signal.aborted) {
      running++;
      one(queue.shift()).finally(() => { running--; pump(); });
    }
  };
  const observer = new IntersectionObserver((entries) => {
    for (const e of entries) {
      if (!e.isIntersecting) continue;
      observer.unobserve(e.target);
      queue.push(e.target);
    }
    pump();
  });
  signal.addEventListener('abort', () => observer.disconnect(), { once: true });
  return (tr) => observer.observe(tr);
}

async function sessionsPage(params, signal) {
  crumbs(null, 'Sessions');
  const prefix = (params.get('id') || '').trim();
  const metaText = (params.get('meta') || '').trim();
  const state = { loaded: 0, next: '' };
  const idInput = h('input', { id: 'search-id', class: 'mono', type: 'search', placeholder: 'id prefix', value: prefix, autocomplete: 'off' });
  const metaInput = h('input', { id: 'search-meta', type: 'search', placeholder: 'key=value key=value', value: metaText, autocomplete: 'off' });
  const form = h('form', { id: 'search-form', class: 'toolbar', onsubmit: (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    if (idInput.value.trim()) q.set('id', idInput.value.trim());
    if (metaInput.value.trim()) q.set('meta', metaInput.value.trim());
    navigate(`#/${q.toString() ? `?${q}` : ''}`);
  } }, h('label', {}, 'id prefix', idInput), h('label', {}, 'metadata', metaInput),
  h('button', { id: 'search-go', type: 'submit' }, 'search'),
  prefix || metaText ? h('a', { href: '#/', id: 'search-clear' }, 'all sessions') : null);
  const tbody = h('tbody');
  const more = h('button', { id: 'more', hidden: true }, 'more');
  const status = h('p', { class: 'muted', id: 'sessions-status' });
  const problem = h('div', { id: 'search-problem' });
  const observe = savingsLoader(signal);
  const row = (s) => h('tr', { class: 'session-row', 'data-session': s.session_id },
    h('td', {}, h('a', { href: `#/s/${enc(s.session_id)}`, class: 'mono' }, s.session_id)),
    h('td', {}, fmtTime(s.created_at_unix_ms)),
    h('td', { class: 'node-count num' }, num(s.node_count)),
    h('td', { class: 'savings num' }, '…'),
    h('td', { class: 'cache' }),
    h('td', {}, s.branches.map((b) => b.name).join(', ')),
    h('td', { class: 'mono' }, Object.entries(s.metadata).map(([k, v]) => `${k}=${v}`).join(' ')));
  let filter = '';
  const load = async () => {
    const page = await api(`/api/sessions?page_size=50${filter}${state.next ? `&page_token=${enc(state.next)}` : ''}`, signal);
    const rows = page.sessions.map(row);
    tbody.append(...rows);
    rows.forEach(observe);
    state.loaded += page.sessions.length;
    state.next = page.next_page_token || '';
    more.hidden = !state.next;
    status.textContent = `${num(state.loaded)} session(s)${prefix || metaText ? ' matching' : ''}${state.next ? ', more to load' : ''}`;
  };
  const failed = (e) => {
    if (signal.aborted) return;
    fill(problem, h('p', { class: 'error', id: 'search-error' }, `${e.code || 'error'}: ${e.message}`));
  };
  more.addEventListener('click', () => { more.disabled = true; load().catch(failed).finally(() => { more.disabled = false; }); });
  const head = [['session'], ['created'], ['nodes', 'every node stored: all branches, sub-agent chains included', 'num'],
    ['savings', 'cache-weighted cost of the last 50 model calls, sent vs unpruned', 'num'], ['provider cache', 'gateway sessions: the provider\'s cache reads and writes'],
    ['branches'], ['metadata']];
  fill(view(), h('h2', {}, 'Sessions'), form, problem,
    h('table', { id: 'sessions' }, h('thead', {}, h('tr', {}, head.map(([t, title, cls]) => h('th', { title, class: cls }, t)))), tbody), more, status);
  try {
    const f = new URLSearchParams();
    if (prefix) f.set('id_prefix', prefix);
    for (const [k, v] of metadataPairs(metaText)) f.append('metadata', `${k}=${v}`);
    filter = f.toString() ? `&${f}` : '';
    await load();
  } catch (e) {
    if (e.status === 401 || e.name === 'AbortError') throw e;
    failed(e);
  }
}

// ------------------------------------------------------------------ the DAG

/**
 * One page of `Log` from `start`: 1,000 nodes, fewer when that answer would be over the server's
 * response size limit (RESOURCE_EXHAUSTED), as a session of huge tool results can make it.
 */
async function logPage(sid, start, signal) {
  for (let limit = 1000; ; limit = Math.floor(limit / 4)) {
    try {
      return await api(`/api/sessions/${enc(sid)}/log?node_id=${enc(start)}&limit=${limit}`, signal);
    } catch (e) {
      if (e.code !== 'RESOURCE_EXHAUSTED' || limit <= 1) throw e;
    }
  }
}

/** Every top-level node reachable from a branch head, each branch's path, and lanes. */
async function loadDag(sid, session, signal) {
  session = session || await api(`/api/sessions/${enc(sid)}`, signal);
  const nodes = new Map();
  const branches = [...session.branches].sort((a, b) => (a.name === 'main' ? -1 : b.name === 'main' ? 1 : a.name.localeCompare(b.name)));
  for (const b of branches) {
    let start = b.head_id;
    // Walks back from the head until the path joins nodes already loaded (a fork point).
    while (start && !nodes.has(start)) {
      const page = await logPage(sid, start, signal);
      let joined = false;
      for (const n of page.nodes) {
        if (nodes.has(n.node_id)) { joined = true; break; }
        nodes.set(n.node_id, n);
      }
      start = joined ? '' : page.next_page_token;
    }
  }
  const depth = new Map();
  const depthOf = (id) => {
    const chain = [];
    let cur = id;
    while (cur && !depth.has(cur) && nodes.has(cur)) { chain.push(cur); cur = nodes.get(cur).parent_id; }
    let d = cur && depth.has(cur) ? depth.get(cur) : -1;
    for (let i = chain.length - 1; i >= 0; i--) depth.set(chain[i], ++d);
    return depth.get(id);
  };
  const lane = new Map();
  const lanes = branches.map((b, i) => {
    let cur = b.head_id;
    let own = 0;
    while (cur && !lane.has(cur) && nodes.has(cur)) { lane.set(cur, i); own++; cur = nodes.get(cur).parent_id; }
    return { name: b.name, head: b.head_id, fork: cur || '', own };
  });
  const top = [...nodes.values()];
  for (const n of top) depthOf(n.node_id);
  top.sort((a, b) => (a.created_at_unix_ms - b.created_at_unix_ms) || (depth.get(a.node_id) - depth.get(b.node_id)) || (lane.get(a.node_id) - lane.get(b.node_id)));
  const results = new Map(); // function call id -> its result node
  for (const n of top) if (n.content.function_result) results.set(n.content.function_result.function_id, n);
  return { sid, signal, session, nodes, top, lane, lanes, depth, results, chains: new Map(), expanded: new Set(), fresh: new Set(), total: nodes.size };
}

const LANE_COLORS = ['#2f6feb', '#e07a1f', '#2e9e5b', '#a347c8', '#c23b3b', '#1b9aaa', '#7a6a2f'];

/** The rows shown: top-level nodes, with the internal chains of expanded functions after their call. */
function dagRows(dag) {
  const rows = [];
  for (const n of dag.top) {
    rows.push({ node: n, lane: dag.lane.get(n.node_id), inner: false });
    if (n.content.function_call && dag.expanded.has(n.node_id)) {
      for (const c of dag.chains.get(n.node_id) || []) rows.push({ node: c, lane: dag.lane.get(n.node_id), inner: true });
    }
  }
  return rows;
}

async function toggleFunction(dag, call) {
  if (dag.expanded.has(call)) { dag.expanded.delete(call); return; }
  if (!dag.chains.has(call)) {
    const result = dag.results.get(call);
    const chain = [];
    let start = result && result.content.function_result.chain_head_id;
    while (start) {
      const page = await logPage(dag.sid, start, dag.signal);
      chain.push(...page.nodes.filter((n) => n.function_id === call));
      start = page.next_page_token;
    }
    dag.chains.set(call, chain.reverse());
  }
  dag.expanded.add(call);
}

/**
 * The DAG as a picture: one lane per branch, a row per node (virtualised), fork lines, function
 * calls collapsible, and summaries as bands over the rows they cover. `opts.highlight` is a set
 * of node ids to mark (a summary's covered range); `opts.onSelect` gets the clicked node.
 */
function dagView(dag, opts) {
  const box = h('div', { class: 'dag', id: 'dag' });
  const laneX = (l) => 10 + l * LANE;
  const labelX = laneX(dag.lanes.length) + 8;
  let rows = dagRows(dag);
  let index = new Map(rows.map((r, i) => [r.node.node_id, i]));
  let selected = opts.selected || '';
  const draw = (first, end) => {
    const out = [];
    const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
    svg.setAttribute('width', labelX);
    svg.setAttribute('height', (end - first) * ROW);
    svg.style.top = `${first * ROW}px`;
    const line = (x1, y1, x2, y2, color, dash) => {
      const l = document.createElementNS(svg.namespaceURI, 'line');
      Object.entries({ x1, y1, x2, y2, stroke: color, 'stroke-width': 2 }).forEach(([k, v]) => l.setAttribute(k, v));
      if (dash) l.setAttribute('stroke-dasharray', '3 2');
      svg.append(l);
    };
    for (let i = first; i < end; i++) {
      const r = rows[i];
      const n = r.node;
      const color = LANE_COLORS[r.lane % LANE_COLORS.length];
      const y = (i - first) * ROW + ROW / 2;
      const x = laneX(r.lane) + (r.inner ? LANE / 2 : 0);
      const parent = r.inner ? null : index.get(n.parent_id);
      if (parent !== undefined && parent !== null) {
        // The parent's lane down to this row; a fork bends into this lane on its last step.
        const px = laneX(rows[parent].lane);
        const py = Math.max((parent - first) * ROW + ROW / 2, -ROW);
        if (px === x) line(x, py, x, y, color);
        else { line(px, py, px, y - ROW / 2, color, true); line(px, y - ROW / 2, x, y, color); }
      }
      const dot = document.createElementNS(svg.namespaceURI, 'circle');
      Object.entries({ cx: x, cy: y, r: n.content.function_call ? 6 : 4, fill: r.inner ? '#fff' : color, stroke: color, 'stroke-width': 2 }).forEach(([k, v]) => dot.setAttribute(k, v));
      svg.append(dot);
      const [kind, preview] = describe(n);
      const heads = dag.lanes.filter((l) => l.head === n.node_id).map((l) => h('span', { class: 'badge branch-head' }, l.name));
      const call = n.content.function_call;
      const toggle = call ? h('button', { class: 'toggle', 'data-call': n.node_id, onclick: async (ev) => {
        ev.stopPropagation();
        await toggleFunction(dag, n.node_id).catch(showError);
        rows = dagRows(dag);
        index = new Map(rows.map((rr, k) => [rr.node.node_id, k]));
        list.repaint();
      } }, dag.expanded.has(n.node_id) ? '−' : `+ ${dag.results.has(n.node_id) ? 'internal chain' : 'running'}`) : null;
      const classes = ['row', n.content.function_call ? 'function-call' : '', n.content.function_result ? 'function-result' : '',
        r.inner ? 'inner' : '', n.node_id === selected ? 'selected' : '', dag.fresh.has(n.node_id) ? 'fresh' : '', opts.highlight && opts.highlight.has(n.node_id) ? 'covered' : ''];
      out.push(h('div', { class: classes.join(' '), 'data-node': n.node_id, 'data-lane': dag.lanes[r.lane] ? dag.lanes[r.lane].name : '',
        style: `top:${i * ROW}px; padding-left:${labelX + (r.inner ? 16 : 0)}px`,
        onclick: () => { selected = n.node_id; list.repaint(); opts.onSelect && opts.onSelect(n); } },
      heads, toggle, h('span', { class: 'kind' }, kind), h('span', { class: 'label' }, preview.slice(0, 200))));
    }
    out.unshift(svg);
    // Summaries: a band over the rows of each summary's covered nodes that are drawn here.
    for (const s of opts.summaries || []) {
      const covered = s.covers_ids.map((id) => index.get(id)).filter((i) => i !== undefined);
      if (!covered.length) continue;
      const lo = Math.min(...covered);
      const hi = Math.max(...covered);
      if (hi < first || lo >= end) continue;
      out.push(h('div', { class: 'overlay', 'data-summary': s.summary_id, style: `top:${lo * ROW}px; height:${(hi - lo + 1) * ROW}px; left:2px; right:2px` },
        h('span', {}, `summary ${short(s.summary_id)}${s.active ? '' : ' (inactive)'}`)));
    }
    return out;
  };
  const list = virtualList(box, () => rows.length, ROW, draw);
  const legend = h('div', { class: 'lanes', id: 'lanes' });
  const drawLegend = () => fill(legend, dag.lanes.map((l, i) => h('span', { class: 'lane', 'data-branch': l.name },
    h('i', { class: 'lane-key', style: `background:${LANE_COLORS[i % LANE_COLORS.length]}` }), l.name,
    h('span', { class: 'muted' }, ` ${l.own} own node(s)${l.fork ? `, forks at ${short(l.fork)}` : ''}`))));
  drawLegend();
  return {
    el: h('div', {}, legend, box),
    box,
    list,
    rowOf: (id) => index.get(id),
    /** Redraws after `dag` grew; a view scrolled to its end stays there, following new rows. */
    update: () => {
      const atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - ROW;
      rows = dagRows(dag);
      index = new Map(rows.map((rr, k) => [rr.node.node_id, k]));
      drawLegend();
      list.repaint();
      if (atEnd && box.scrollHeight > box.clientHeight) {
        box.scrollTop = box.scrollHeight;
        list.repaint();
      }
    },
    setSummaries: (summaries) => { opts.summaries = summaries; list.repaint(); },
  };
}

/** Where `n` goes in `dag.top` (creation order, as `loadDag` sorts): new nodes go last. */
function insertTop(dag, n) {
  const key = (x) => [Number(x.created_at_unix_ms), dag.depth.get(x.node_id), dag.lane.get(x.node_id)];
  const k = key(n);
  let i = dag.top.length;
  while (i > 0) {
    const p = key(dag.top[i - 1]);
    if (p[0] < k[0] || (p[0] === k[0] && (p[1] < k[1] || (p[1] === k[1] && p[2] <= k[2])))) break;
    i--;
  }
  dag.top.splice(i, 0, n);
}

/**
 * Follows `/events` of a session: parses the event stream (fetch, not EventSource, which cannot
 * send the API key) and hands each event to `on.event(name, data)`. On the stream's end or a
 * network error it reconnects after a second with `Last-Event-ID`, the cursor of the last event
 * received, so nothing is missed or repeated; it stops after `deleted`, on a 4xx answer, and when
 * `signal` is aborted (the page is left). A resume the server refuses (4xx) is retried once
 * from now, after `on.resync()`.
 */
async function follow(sid, signal, on) {
  let cursor = '';
  let attempt = 0;
  while (!signal.aborted) {
    if (attempt++) {
      on.state('reconnecting');
      await sleep(1000, signal);
      if (signal.aborted) return;
    }
    const headers = { ...authHeaders(), Accept: 'text/event-stream' };
    if (cursor) headers['Last-Event-ID'] = cursor;
    let res;
    try {
      res = await fetch(`/api/sessions/${enc(sid)}/events`, { headers, signal, cache: 'no-store' });
    } catch (e) {
      if (signal.aborted) return;
      continue;
    }
    if (!res.ok) {
      const err = await errorOf(res);
      if (res.status >= 400 && res.status < 500) {
        if (res.status === 401) askForKey(err.message);
        if (cursor && res.status !== 401 && res.status !== 403 && res.status !== 404) {
          // The cursor is not accepted (too old, say): start from now and catch up by reloading.
          cursor = '';
          attempt = 0;
          await on.resync();
          continue;
        }
        on.stopped(err);
        return;
      }
      continue; // 5xx: try again
    }
    on.state('live', Boolean(cursor));
    let ended = false;
    let failure = null;
    try {
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      let name = '';
      let data = [];
      let id = null;
      while (!ended) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        const lines = buf.split('\n');
        buf = lines.pop();
        for (let line of lines) {
          if (line.endsWith('\r')) line = line.slice(0, -1);
          if (line === '') {
            if (data.length) {
              const payload = JSON.parse(data.join('\n'));
              const event = name || 'message';
              if (event === 'error') failure = payload.error || { code: 'error', message: 'stream error' };
              else on.event(event, payload);
              if (id !== null && event !== 'error') cursor = id;
              else if (payload.cursor && event !== 'error') cursor = payload.cursor;
              if (event === 'deleted') { ended = true; break; }
            }
            name = '';
            data = [];
            id = null;
          } else if (!line.startsWith(':')) {
            const at = line.indexOf(':');
            const field = at < 0 ? line : line.slice(0, at);
            const val = at < 0 ? '' : line.slice(at + 1).replace(/^ /, '');
            if (field === 'event') name = val;
            else if (field === 'data') data.push(val);
            else if (field === 'id') id = val;
          }
        }
      }
      if (ended) { reader.cancel().catch(() => {}); return; }
    } catch (e) {
      if (signal.aborted) return;
    }
    if (failure) {
      on.error(failure);
      // A cursor the server cannot resume from: start from now (the reload catches up).
      if (['INVALID_ARGUMENT', 'OUT_OF_RANGE', 'FAILED_PRECONDITION'].includes(failure.code)) {
        cursor = '';
        await on.resync();
      }
    }
  }
}

async function sessionPage(sid, signal) {
  crumbs(sid, 'Session');
  fill(view(), h('p', { class: 'muted' }, 'loading…'));
  const t0 = performance.now();
  let dag = await loadDag(sid, null, signal);
  let summaries = (await api(`/api/sessions/${enc(sid)}/summaries`, signal)).summaries;
  const drawnIn = Math.round(performance.now() - t0);
  const ui = { selected: '' };
  const detail = h('div', { class: 'panel', id: 'detail' }, h('p', { class: 'muted' }, 'click a node to see its content'));
  const onSelect = (n) => { ui.selected = n.node_id; fill(detail, ...nodeDetail(n)); };
  const meta = h('p', { class: 'muted', id: 'session-meta' });
  const gateway = h('div', { id: 'gateway' });
  // Folded under the gateway line, so the DAG keeps its place; it opens by itself the first time
  // it holds an unexplained miss, which is what a reader of a gateway session looks for.
  const ledger = h('details', { class: 'ledger', id: 'ledger', hidden: true });
  // The ledger is read again when the session's call count moves (the gateway records a call
  // once its answer is whole, so a live page sees it with the session's next refresh).
  let ledgerCalls = -1;
  let ledgerAll = false;
  let ledgerOpened = false;
  const loadLedger = () => gatewayCalls(sid, signal).then((calls) => {
    if (signal.aborted) return;
    ledger.hidden = false;
    fill(ledger, ledgerView(calls, ledgerAll, () => { ledgerAll = true; loadLedger(); }));
    if (!ledgerOpened && calls.some((c) => c.unexplained_miss)) ledger.open = true;
    ledgerOpened = ledgerOpened || ledger.open;
  }).catch((e) => {
    if (signal.aborted) return;
    ledger.hidden = false;
    ledger.open = true;
    fill(ledger, h('summary', {}, 'gateway ledger'), h('p', { class: 'error', id: 'ledger-error' }, `${e.code || 'error'}: ${e.message}`));
  });
  const banner = h('div', { id: 'live-banner' });
  const live = h('span', { id: 'live', class: 'live', 'data-state': 'connecting', title: 'following the session as it changes' }, 'connecting…');
  const holder = h('div', { class: 'dag-holder' });
  const writeMeta = () => {
    const s = dag.session;
    fill(meta, `created ${fmtTime(s.created_at_unix_ms)} · `, h('span', { id: 'node-count' }, `${num(s.node_count)} nodes`),
      ` (${num(dag.total)} top-level) · ${s.branches.length} branch(es) · ${s.compaction_count} compaction(s) · `,
      Object.entries(s.metadata).map(([k, val]) => `${k}=${val}`).join(' '), ` · drawn in ${drawnIn} ms`);
    fill(gateway, gatewayLine(s.gateway));
    if (s.gateway && Number(s.gateway.calls) !== ledgerCalls) {
      ledgerCalls = Number(s.gateway.calls);
      loadLedger();
    }
  };
  let v = null;
  const draw = () => {
    const top = v ? v.box.scrollTop : 0;
    v = dagView(dag, { summaries, onSelect, selected: ui.selected });
    fill(holder, v.el);
    v.box.scrollTop = top;
    v.list.repaint();
  };
  writeMeta();
  draw();
  fill(view(), h('h2', {}, 'Session ', h('span', { class: 'mono' }, sid), ' ', live), meta, gateway, ledger, banner,
    h('div', { class: 'split' }, holder, detail));
  v.list.repaint();

  // ---- live: the stream's events, applied one at a time (a reload holds the ones behind it).
  let queue = Promise.resolve();
  const then = (f) => { queue = queue.then(f).catch((e) => { if (!signal.aborted) fill(banner, h('p', { class: 'error' }, `${e.code || 'error'}: ${e.message}`)); }); return queue; };
  // The session's counts (node_count counts function chains too) a moment after a change.
  let refreshing = null;
  const refreshSession = () => {
    if (refreshing) return;
    refreshing = setTimeout(async () => {
      refreshing = null;
      const s = await api(`/api/sessions/${enc(sid)}`, signal).catch(() => null);
      if (s && !signal.aborted) { dag.session = s; writeMeta(); }
    }, 1000);
  };
  signal.addEventListener('abort', () => clearTimeout(refreshing), { once: true });
  // Everything again, keeping what the reader opened and where they were.
  const reload = async () => {
    const fresh = await loadDag(sid, null, signal);
    for (const call of dag.expanded) if (fresh.nodes.has(call)) fresh.expanded.add(call);
    for (const [call, chain] of dag.chains) if (fresh.nodes.has(call)) fresh.chains.set(call, chain);
    dag = fresh;
    writeMeta();
    draw();
  };
  const addNode = (n, branch) => {
    if (n.function_id) {
      // A node of a sub-agent's chain: shown if that chain is open, counted either way.
      const chain = dag.chains.get(n.function_id);
      if (chain && chain.some((c) => c.node_id === n.node_id)) return null;
      if (chain) chain.push(n);
      dag.session.node_count = Number(dag.session.node_count || 0) + 1;
      return 'counted';
    }
    if (dag.nodes.has(n.node_id)) return null; // already drawn (a reload fetched it)
    const li = dag.lanes.findIndex((l) => l.name === branch);
    if (li < 0 || (n.parent_id && !dag.nodes.has(n.parent_id))) return 'reload';
    dag.nodes.set(n.node_id, n);
    dag.depth.set(n.node_id, n.parent_id ? dag.depth.get(n.parent_id) + 1 : 0);
    dag.lane.set(n.node_id, li);
    dag.lanes[li].head = n.node_id;
    dag.lanes[li].own++;
    const b = dag.session.branches.find((x) => x.name === branch);
    if (b) b.head_id = n.node_id;
    insertTop(dag, n);
    if (n.content.function_result) {
      const call = n.content.function_result.function_id;
      dag.results.set(call, n);
      // A chain gathered while the function ran may lack its start: read whole when next opened.
      if (!dag.expanded.has(call)) dag.chains.delete(call);
    }
    dag.total++;
    dag.fresh.add(n.node_id);
    dag.session.node_count = Number(dag.session.node_count || 0) + 1;
    return 'added';
  };
  const sameHeads = (branches) => branches.length === dag.lanes.length
    && branches.every((b) => dag.lanes.some((l) => l.name === b.name && l.head === b.head_id));
  const apply = async (name, e) => {
    if (name === 'started') {
      // A resume goes on exactly where it stopped; a fresh start may have missed nodes.
      if (!e.resumed && !sameHeads(e.started.branches || [])) await reload();
    } else if (name === 'node') {
      const done = addNode(e.node, e.branch);
      if (done === 'reload') await reload();
      else if (done) { writeMeta(); v.update(); refreshSession(); }
    } else if (name === 'head_moved' || name === 'branch_created' || name === 'branch_deleted') {
      await reload();
    } else if (name === 'compaction') {
      const [listing, s] = await Promise.all([api(`/api/sessions/${enc(sid)}/summaries`, signal), api(`/api/sessions/${enc(sid)}`, signal)]);
      summaries = listing.summaries;
      dag.session = s;
      writeMeta();
      v.setSummaries(summaries);
      const c = e.compaction;
      fill(banner, h('p', { class: 'muted', id: 'live-compaction' }, `${fmtTime(c.created_at_unix_ms)}: compaction ${c.kind} on ${c.branch}`,
        c.kind === 'committed' ? ` (tokens ${num(c.tokens_before)} → ${num(c.tokens_after)})` : c.message ? `: ${c.message}` : ''));
    } else if (name === 'deleted') {
      fill(banner, h('p', { class: 'error', id: 'session-deleted' }, 'This session was deleted: the page shows it as it was.'));
    }
  };
  let resumed = false;
  const setState = (state, text, title) => {
    live.dataset.state = state;
    live.className = `live is-${state}`;
    live.textContent = text;
    if (title) live.title = title;
  };
  follow(sid, signal, {
    state: (state, fromCursor) => {
      resumed = Boolean(fromCursor);
      if (state === 'live') setState('live', '● live', 'following the session as it changes');
      else setState('reconnecting', '○ reconnecting…', 'the stream ended; reconnecting');
    },
    event: (name, e) => {
      if (name === 'started') e = { ...e, resumed };
      if (name === 'deleted') setState('deleted', 'deleted', 'the session was deleted');
      then(() => (signal.aborted ? null : apply(name, e)));
    },
    resync: () => then(reload),
    error: (err) => setState('reconnecting', '○ reconnecting…', `${err.code}: ${err.message}`),
    stopped: (err) => setState('stopped', 'not live', `${err.code}: ${err.message}`),
  }).catch(() => {});
}

/** What the model gateway forwarded for a session it recorded (none for other sessions). */
function gatewayLine(g) {
  if (!g) return null;
  const input = g.input_tokens + g.cache_read_tokens + g.cache_write_tokens;
  const pct = (a, b) => (b ? `${Math.round((100 * a) / b)}%` : '–');
  return h('p', { class: 'muted', id: 'gateway-usage' },
    `gateway: ${num(g.calls)} call(s) · client sent ${num(g.client_tokens)} tokens · forwarded ${num(g.forwarded_tokens)} (${pct(g.forwarded_tokens, g.client_tokens)}) · `
    + `provider input ${num(input)}: ${num(g.cache_read_tokens)} cache reads (${pct(g.cache_read_tokens, input)}), ${num(g.cache_write_tokens)} cache writes, ${num(g.input_tokens)} uncached · output ${num(g.output_tokens)}`);
}

// ------------------------------------------------------------------ the gateway's ledger

/** Calls the ledger shows until all are asked for: the newest, as `ctxd context` shows them. */
const LEDGER_NEWEST = 20;

/** Every gateway call of a session in the order made, newest last (pages of 1,000 followed). */
async function gatewayCalls(sid, signal) {
  const calls = [];
  let token = '';
  do {
    const page = await api(`/api/sessions/${enc(sid)}/gateway-calls?page_size=1000${token ? `&page_token=${enc(token)}` : ''}`, signal);
    calls.push(...page.calls);
    token = page.next_page_token;
  } while (token);
  return calls;
}

/**
 * The gateway's ledger: a row per call (the newest LEDGER_NEWEST until `onAll` asks for every
 * one), what the client sent against what was forwarded, what the provider's cache read and
 * wrote, what the forwarded request kept of the previous one and why it changed; a call whose
 * cache read fell short of what was kept, with nothing to explain it, is marked; totals below.
 */
function ledgerView(calls, all, onAll) {
  const shown = all ? calls : calls.slice(-LEDGER_NEWEST);
  const skipped = calls.length - shown.length;
  const figures = ['client_tokens', 'forwarded_tokens', 'cache_read_tokens', 'cache_write_tokens', 'input_tokens', 'kept_tokens'];
  const sum = (k) => calls.reduce((a, c) => a + Number(c[k] || 0), 0);
  const misses = calls.filter((c) => c.unexplained_miss).length;
  const head = [['#', '', 'num'], ['recorded'], ['model'], ['client', 'tokens of the messages the client sent (estimated)', 'num'],
    ['forwarded', 'tokens of the messages forwarded (estimated)', 'num'], ['cache read', 'the provider\'s count', 'num'],
    ['cache write', 'the provider\'s count', 'num'], ['uncached', 'the provider\'s input read from no cache', 'num'],
    ['kept', 'tokens identical to the previous forwarded request up to its last cache breakpoint', 'num'],
    ['change', 'why the forwarded prefix differs from the previous request\'s'], ['', 'the provider read less than was kept, and nothing explains it']];
  const rows = shown.map((c, i) => h('tr', { class: c.unexplained_miss ? 'miss' : null, 'data-miss': c.unexplained_miss ? 'true' : 'false' },
    h('td', { class: 'num' }, String(skipped + i + 1)), h('td', {}, fmtTime(c.at_unix_ms)), h('td', {}, `${c.api} ${c.model}`),
    figures.map((k) => h('td', { class: 'num' }, num(c[k]))), h('td', { class: 'mono', title: changeMeaning(c.change) }, (c.change || '—') + reasoningNote(c)),
    h('td', { class: 'mark' }, c.unexplained_miss ? '✗ miss' : '')));
  const totals = h('tr', { id: 'ledger-totals' }, h('td', {}, ''), h('td', {}, 'total'), h('td', {}, `${num(calls.length)} call(s)`),
    figures.map((k) => h('td', { class: 'num' }, num(sum(k)))), h('td', {}, ''),
    h('td', { class: 'mark' }, misses ? `${num(misses)} miss(es)` : ''));
  const entries = [...new Set(calls.map((c) => c.priced_by).filter(Boolean))].sort();
  const cost = calls.reduce((a, c) => a + Number(c.cost || 0), 0);
  return [h('summary', { id: 'ledger-summary' }, `gateway ledger: ${num(calls.length)} call(s) · `,
      h('span', { class: misses ? 'error' : null }, `${num(misses)} unexplained cache miss(es)`)),
    entries.length ? h('p', { class: 'muted', id: 'ledger-priced' }, `priced by the model table's ${entries.join(', ')}: cache-weighted input ${num(Math.round(cost))}`) : null,
    skipped ? h('p', { class: 'muted' }, `the newest ${num(shown.length)} of ${num(calls.length)} calls · `, h('button', { id: 'ledger-all', onclick: onAll }, 'show all')) : null,
    h('table', { class: 'ledger-table', id: 'gateway-ledger' }, h('thead', {}, h('tr', {}, head.map(([t, title, cls]) => h('th', { title, class: cls }, t)))),
      h('tbody', {}, rows), h('tfoot', {}, totals))];
}

/**
 * What a call's reasoning rules did, after its change: the edit ctxd asked of the provider and
 * what it reported clearing (`edit:A/B`), the thinking ctxd left out (`thinking-N`) and the
 * thinking the provider dropped (`dropped-N`).
 */
function reasoningNote(c) {
  let out = '';
  if (c.edit_clear !== null && c.edit_clear !== undefined) {
    out += ` edit:${c.edit_clear}/${c.provider_cleared ?? '?'}`;
  }
  if (c.thinking_dropped) out += ` thinking-${c.thinking_dropped}`;
  if (c.provider_thinking_dropped) out += ` dropped-${c.provider_thinking_dropped}`;
  return out;
}

// ------------------------------------------------------------------ render

const POLICIES = { stepped: { microcompact: 'stepped' }, over_budget: { microcompact: 'over_budget' }, reactive: { reactive: 'true' } };

/** What a render did to a message: verbatim, or each reduction it underwent. */
function marks(m) {
  if (!m.node_ids.length) return ['summarised'];
  const out = [];
  if (m.cleared) out.push('cleared');
  if (m.truncated) out.push('truncated');
  if (m.inputs_stubbed) out.push('input-stubbed');
  return out.length ? out : ['verbatim'];
}

/** The context report as one stacked bar, the picture `ctxd context` draws. */
function contextBar(report) {
  const t = report.tokens || {};
  const b = report.budget || {};
  const segs = [
    ['system', (t.system || 0) + (b.system_tokens || 0)],
    ['tools', (b.tools_tokens || 0) + (b.schema_tokens || 0)],
    ['messages', (t.user || 0) + (t.assistant_text || 0) + (t.markers || 0)],
    ['tool calls', t.tool_calls || 0],
    ['tool results', t.tool_results || 0],
    ['summary', t.summaries || 0],
  ];
  const used = segs.reduce((a, [, n]) => a + n, 0);
  const window = b.context_window ? b.context_window - (b.output_reserve || 0) : 0;
  const scale = Math.max(window, used, 1);
  const cls = (name) => `seg-${name.replace(' ', '-')}`;
  const bar = h('div', { class: 'bar', id: 'context-bar' }, segs.filter(([, n]) => n > 0).map(([name, n]) =>
    h('div', { class: cls(name), 'data-segment': name, title: `${name}: ${num(n)} tokens`, style: `width:${(100 * n) / scale}%` })));
  const legend = h('div', { class: 'legend' }, segs.map(([name, n]) => h('span', {}, h('i', { class: cls(name) }), `${name} ${num(n)}`)),
    window ? h('span', {}, h('i', { class: 'seg-free' }), `free ${num(Math.max(0, window - used))}`) : null);
  const verdict = !report.budget ? 'no budget: the bar is the whole context'
    : report.fits ? `fits: ${num(report.total_tokens)} of ${num(report.history_budget)} history tokens`
      : `OVER by ${num(report.over_by)} tokens${report.summary_needed ? ': summary needed' : ''}`;
  const why = report.microcompact_trigger === 'count' ? (report.payback_calls ? ` (pays back in ${report.payback_calls} calls)` : ' (forced by the budget)')
    : report.microcompact_trigger === 'idle' ? ' (the cache had expired)' : '';
  const tiers = `truncated ${report.results_truncated} · cleared ${report.results_cleared} · inputs stubbed ${report.inputs_stubbed} · turns snipped ${report.turns_snipped} · summaries ${report.summary_ids.length}${report.microcompact_trigger ? ` · microcompact: ${report.microcompact_trigger}${why}` : ''}`;
  return h('div', { id: 'report' }, bar, legend, h('p', {}, verdict), h('p', { class: 'muted' }, tiers));
}

/**
 * What the context policy saved (`/savings`): the render shown against the same history unpruned
 * (the next call's input), and the session's last model calls replayed, in tokens and in
 * cache-weighted cost; for a gateway session, what the provider's cache did.
 */
function savingsView(sv) {
  const cost = (x) => num(Math.round(x || 0));
  const figure = (name, text) => h('td', { class: 'num', 'data-figure': name }, text);
  const line = (label, key, part, whole, fmt) => h('tr', {}, h('th', {}, label),
    figure(`${key}.sent`, fmt(part)), figure(`${key}.unpruned`, fmt(whole)), figure(`${key}.saved`, saved(part, whole)));
  const n = sv.next;
  const r = sv.replayed;
  const rows = [line('this render: tokens', 'next.tokens', n.sent_tokens, n.unpruned_tokens, num),
    line('this render: cost', 'next.cost', n.sent_cost, n.unpruned_cost, cost)];
  if (sv.calls_replayed) {
    rows.push(line(`last ${num(sv.calls_replayed)} call(s): tokens`, 'replayed.tokens', r.sent_tokens, r.unpruned_tokens, num),
      line(`last ${num(sv.calls_replayed)} call(s): cost`, 'replayed.cost', r.sent_cost, r.unpruned_cost, cost));
  }
  const g = sv.gateway;
  const input = g ? g.input_tokens + g.cache_read_tokens + g.cache_write_tokens : 0;
  return [h('h3', {}, 'Savings'),
    h('p', { class: 'muted', id: 'savings-calls' }, sv.calls_total
      ? `${num(sv.calls_replayed)} of ${num(sv.calls_total)} model call(s) replayed (the newest); `
      : 'no model calls on this path yet; ',
    `cost is in tokens, priced as a provider prompt cache would: the prefix unchanged since the previous call read at 0.1×, the rest written at 1.25×; unpruned is every message as it came, no summaries (${sv.tokenizer})`),
    h('table', { class: 'savings-table' }, h('thead', {}, h('tr', {}, ['', 'sent', 'unpruned', 'saved'].map((t) => h('th', {}, t)))), h('tbody', {}, rows)),
    g ? h('p', { id: 'savings-gateway' }, `gateway (the provider's count): ${num(g.calls)} call(s) · cache reads `, h('b', { 'data-figure': 'gateway.cache_read' }, num(g.cache_read_tokens)),
      ' · cache writes ', h('b', { 'data-figure': 'gateway.cache_write' }, num(g.cache_write_tokens)), ` · uncached ${num(g.input_tokens)} · weighted input `,
      h('b', { 'data-figure': 'gateway.weighted_input' }, cost(g.weighted_input)), ` for ${num(input)} input tokens (the provider's cache: ${saved(g.weighted_input, input)})`) : null];
}

async function renderPage(sid, params, signal) {
  crumbs(sid, 'Render');
  const session = await api(`/api/sessions/${enc(sid)}`, signal);
  const field = (name, input) => h('label', {}, name, input);
  const branch = h('select', { id: 'branch' }, session.branches.map((b) => h('option', { value: b.name, selected: b.name === (params.get('branch') || 'main') }, b.name)));
  const budget = h('input', { id: 'budget', type: 'number', min: 0, placeholder: 'none', value: params.get('budget') || '' });
  const reserve = h('input', { id: 'reserve', type: 'number', min: 0, value: params.get('reserve') || '0' });
  const tokenizer = h('select', { id: 'tokenizer' }, ['heuristic', 'o200k_base', 'cl100k_base'].map((t) => h('option', { selected: t === params.get('tokenizer') }, t)));
  const policy = h('select', { id: 'policy' }, Object.keys(POLICIES).map((p) => h('option', { selected: p === params.get('policy') }, p)));
  const go = h('button', { id: 'go', type: 'submit' }, 'render');
  const out = h('div', { id: 'render-out' });
  const form = h('form', { class: 'toolbar', onsubmit: (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams({ branch: branch.value, budget: budget.value, reserve: reserve.value, tokenizer: tokenizer.value, policy: policy.value });
    navigate(`#/s/${enc(sid)}/render?${q}`);
  } }, field('branch', branch), field('context window', budget), field('output reserve', reserve), field('tokenizer', tokenizer), field('policy', policy), go);
  fill(view(), h('h2', {}, 'Render ', h('span', { class: 'mono' }, short(sid))), form, out);
  if (!params.has('branch')) return;
  const q = new URLSearchParams({ branch: branch.value, tokenizer: tokenizer.value, ...POLICIES[policy.value] });
  if (budget.value) { q.set('context_window', budget.value); q.set('output_reserve', reserve.value || '0'); }
  // The savings replay renders: asked at once, drawn when it comes, after the render if need be.
  const sq = new URLSearchParams(q);
  sq.set('calls', '100');
  const savings = h('div', { class: 'panel savings', id: 'savings', 'data-state': 'loading', 'data-query': sq.toString() },
    h('p', { class: 'muted' }, 'savings: replaying the model calls…'));
  api(`/api/sessions/${enc(sid)}/savings?${sq}`, signal).then((sv) => {
    fill(savings, savingsView(sv));
    savings.dataset.state = 'done';
  }, (e) => {
    if (signal.aborted) return;
    fill(savings, h('h3', {}, 'Savings'), h('p', { class: 'error', id: 'savings-error' }, `${e.code || 'error'}: ${e.message}`));
    savings.dataset.state = 'error';
  });
  const r = await api(`/api/sessions/${enc(sid)}/render?${q}`, signal);
  const report = r.report;
  let s = 0;
  const summaryOf = r.messages.map((m) => (m.node_ids.length ? '' : report.summary_ids[s++] || ''));
  const detail = h('div', { class: 'panel', id: 'message-detail' }, h('p', { class: 'muted' }, 'click a message to see it whole'));
  const list = h('div', { class: 'msgs', id: 'messages' });
  fill(out, contextBar(report),
    report.turns_snipped ? h('p', { class: 'snipped-note' }, h('span', { class: 'badge snipped' }, 'snipped'),
      `${report.turns_snipped} oldest turn(s) dropped: ${report.snipped_node_ids.length} node(s) not sent`) : null,
    h('p', { class: 'muted' }, `${num(r.messages.length)} messages · ${num(r.total_tokens)} tokens (${r.tokenizer})`),
    savings,
    h('div', { class: 'split' }, list, detail));
  virtualList(list, () => r.messages.length, MSG, (first, end) => {
    const rows = [];
    for (let i = first; i < end; i++) {
      const m = r.messages[i];
      const text = partsText(m.parts) + m.tool_calls.map((t) => ` ${t.name}(${t.arguments_json})`).join('');
      rows.push(h('div', { class: `msg ${marks(m).join(' ')}`, 'data-index': i, style: `top:${i * MSG}px`, onclick: () => fill(detail, 
        h('h3', {}, `#${i} ${m.role}${m.name ? ` ${m.name}` : ''}`), h('p', {}, marks(m).map((k) => h('span', { class: `badge ${k}` }, k)), `${num(m.tokens)} tokens`),
        summaryOf[i] ? h('p', { class: 'mono' }, `summary ${summaryOf[i]}`) : h('p', { class: 'mono muted' }, `nodes ${m.node_ids.join(', ')}`),
        folded(text)) },
      h('div', {}, h('b', {}, `#${i} `), m.role.replace('ROLE_', '').toLowerCase(), m.name ? ` ${m.name} ` : ' ',
        marks(m).map((k) => h('span', { class: `badge ${k}` }, k)), h('span', { class: 'muted' }, `${num(m.tokens)} tok`)),
      h('div', { class: 'preview' }, text.slice(0, 240))));
    }
    return rows;
  });
}

// ------------------------------------------------------------------ summaries

async function summariesPage(sid, params, signal) {
  crumbs(sid, 'Summaries');
  const branchName = params.get('branch') || 'main';
  const [dag, listing] = await Promise.all([loadDag(sid, null, signal), api(`/api/sessions/${enc(sid)}/summaries?branch=${enc(branchName)}`, signal)]);
  const byId = new Map(listing.summaries.map((s) => [s.summary_id, s]));
  const detail = h('div', { class: 'panel', id: 'summary-detail' });
  let v = null;
  const holder = h('div', {});
  const show = (s) => {
    const covers = new Set(s ? s.covers_ids : []);
    v = dagView(dag, { summaries: s ? [s] : [], highlight: covers });
    fill(holder, v.el);
    v.list.repaint();
    if (s && s.covers_ids.length) { const at = v.rowOf(s.covers_ids[0]); if (at !== undefined) v.list.scrollTo(at); }
  };
  const ledger = (l) => (!l ? h('p', { class: 'muted' }, 'no evidence ledger') : h('div', { class: 'ledger' }, h('h4', {}, 'evidence ledger'),
    [['files read', l.files_read.map((f) => `${f.path} (${f.tools.join(', ')} ×${f.count})`)],
      ['files modified', l.files_modified.map((f) => `${f.path} (${f.tools.join(', ')} ×${f.count})`)],
      ['commands', l.commands.map((c) => `${c.command}${c.exit_code !== null ? ` → ${c.exit_code}` : ''}${c.is_error ? ' (error)' : ''}`)],
      ['errors', l.errors.map((e) => `${e.tool}: ${e.line}`)], ['user requests', l.user_requests],
      ['functions', l.functions.map((f) => `${f.name}: ${f.input} → ${f.output}`)]]
      .filter(([, xs]) => xs.length).map(([name, xs]) => h('div', {}, h('b', {}, name), h('ul', {}, xs.map((x) => h('li', {}, x)))))));
  const cards = listing.events.map((e) => {
    const refused = e.kind === 'rejected' || e.kind === 'cancelled';
    const s = byId.get(e.summary_id);
    const card = h('div', { class: `attempt ${e.kind}`, 'data-kind': e.kind, onclick: () => {
      for (const c of cards) c.classList.remove('selected');
      card.classList.add('selected');
      show(s || null);
      fill(detail, h('h3', {}, `${e.kind} ${short(e.compaction_id)}`), h('p', {}, e.reason, e.message ? `: ${e.message}` : ''),
        ...(s ? [h('p', { class: 'mono' }, `summary ${s.summary_id} · ${s.kind} · model ${s.model} · ${s.covers_ids.length} nodes covered${s.active ? ' · active' : s.applies ? ' · applies' : ''}`),
          h('h4', {}, 'text'), folded(s.text), ledger(s.ledger)] : [h('p', { class: 'muted' }, 'no summary stored for this attempt')]));
    } },
    h('span', { class: `badge ${e.kind === 'committed' ? 'applied' : refused ? 'refused' : ''}` }, e.kind === 'committed' ? 'applied' : refused ? 'refused' : e.kind),
    e.reason === 'COMPACTION_REASON_UNSPECIFIED' ? ' ' : h('b', {}, ` ${e.reason.replace('COMPACTION_REASON_', '').toLowerCase()} `),
    h('span', { class: 'reason' }, e.message), h('br'),
    h('span', { class: 'muted' }, `${fmtTime(e.created_at_unix_ms)} · branch ${e.branch} · tokens ${num(e.tokens_before)} → ${num(e.tokens_after)}`));
    return card;
  });
  // Imported summaries have no events: listed on their own.
  const imported = listing.summaries.filter((s) => !listing.events.some((e) => e.summary_id === s.summary_id)).map((s) => {
    const card = h('div', { class: 'attempt imported', onclick: () => { show(s); fill(detail, h('h3', {}, `summary ${short(s.summary_id)}`), folded(s.text), ledger(s.ledger)); } },
      h('span', { class: 'badge applied' }, s.active ? 'active' : 'stored'), ` ${s.kind} · ${s.covers_ids.length} nodes · tokens ${num(s.tokens_before)} → ${num(s.tokens_after)}`);
    cards.push(card);
    return card;
  });
  const branchSel = h('select', { id: 'summary-branch', onchange: (ev) => navigate(`#/s/${enc(sid)}/summaries?branch=${enc(ev.target.value)}`) },
    dag.session.branches.map((b) => h('option', { selected: b.name === branchName }, b.name)));
  fill(view(), h('h2', {}, 'Summaries ', h('span', { class: 'mono' }, short(sid))),
    h('div', { class: 'toolbar' }, h('label', {}, 'branch', branchSel), h('span', { class: 'muted' }, `${listing.events.length} event(s), ${listing.summaries.length} summary(ies)`)),
    h('div', { class: 'split' }, h('div', {}, h('div', { class: 'panel', id: 'attempts' }, cards.length ? [...cards.slice(0, listing.events.length), ...imported] : h('p', { class: 'muted' }, 'no compaction attempts')), holder), detail));
  show(null);
}

// ------------------------------------------------------------------ routing

/** Goes to `hash`; the same hash again (a search repeated, say) loads the page afresh. */
function navigate(hash) {
  document.body.dataset.ready = '';
  if (location.hash === hash || (!location.hash && hash === '#/')) route();
  else location.hash = hash;
}

async function route() {
  // The page shown before stops: its requests, its live stream, its lazy loads.
  pageAbort.abort();
  pageAbort = new AbortController();
  const signal = pageAbort.signal;
  const [path, query] = (location.hash.slice(1) || '/').split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  document.getElementById('forget-key').hidden = !sessionStorage.getItem(KEY);
  try {
    if (parts[0] === 's' && parts[1]) {
      if (parts[2] === 'render') await renderPage(parts[1], params, signal);
      else if (parts[2] === 'summaries') await summariesPage(parts[1], params, signal);
      else await sessionPage(parts[1], signal);
    } else {
      await sessionsPage(params, signal);
    }
    if (signal.aborted) return;
    document.body.dataset.ready = location.hash || '#/';
  } catch (e) {
    if (signal.aborted) return;
    showError(e);
    document.body.dataset.ready = 'error';
  }
}

document.addEventListener('DOMContentLoaded', () => {
  document.getElementById('key-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, document.getElementById('key-input').value.trim());
    document.getElementById('key-form').hidden = true;
    route();
  });
  document.getElementById('forget-key').addEventListener('click', () => { sessionStorage.removeItem(KEY); route(); });
  window.addEventListener('hashchange', () => { document.body.dataset.ready = ''; route(); });
  route();
});
