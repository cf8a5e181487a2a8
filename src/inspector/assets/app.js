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

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** GET an /api path; with a stored key, sends it as a bearer token. On 401, asks for a key. */
async function api(path) {
  const key = sessionStorage.getItem(KEY);
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  const res = await fetch(path, { headers });
  let body = null;
  try {
    body = await res.json();
  } catch (_) {
    body = null;
  }
  if (!res.ok) {
    const err = body && body.error ? body.error : { code: String(res.status), message: res.statusText };
    if (res.status === 401) askForKey(err.message);
    throw new ApiError(res.status, err.code, err.message);
  }
  return body;
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

async function sessionsPage(params) {
  crumbs(null, 'Sessions');
  const state = { sessions: [], next: '', query: params.get('q') || '' };
  const search = h('input', { id: 'search', type: 'search', placeholder: 'id or metadata', value: state.query });
  const tbody = h('tbody');
  const more = h('button', { id: 'more' }, 'load more');
  const status = h('span', { class: 'muted' });
  const draw = () => {
    const q = search.value.trim().toLowerCase();
    const shown = state.sessions.filter((s) => !q || s.session_id.includes(q)
      || Object.entries(s.metadata).some(([k, v]) => `${k}=${v}`.toLowerCase().includes(q)));
    fill(tbody, ...shown.map((s) => h('tr', { class: 'session-row' },
      h('td', {}, h('a', { href: `#/s/${enc(s.session_id)}`, class: 'mono' }, s.session_id)),
      h('td', {}, fmtTime(s.created_at_unix_ms)),
      h('td', { class: 'node-count', 'data-session': s.session_id }, s.nodes === undefined ? '…' : num(s.nodes)),
      h('td', {}, s.branches.map((b) => b.name).join(', ')),
      h('td', { class: 'mono' }, Object.entries(s.metadata).map(([k, v]) => `${k}=${v}`).join(' ')))));
    status.textContent = `${shown.length} of ${state.sessions.length} loaded${state.next ? '' : ' (all)'}`;
    // A whole id need not be on a loaded page: offer it directly (the server says if it exists).
    if (!shown.length && /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/.test(q)) {
      tbody.append(h('tr', {}, h('td', { colspan: 5 }, h('a', { href: `#/s/${enc(q)}` }, `open session ${q}`))));
    }
    more.hidden = !state.next;
  };
  const load = async () => {
    const page = await api(`/api/sessions?page_size=50${state.next ? `&page_token=${enc(state.next)}` : ''}`);
    state.sessions.push(...page.sessions);
    state.next = page.next_page_token;
    draw();
    // Node counts: no RPC answers them, so they are counted from the log, one session at a time.
    for (const s of page.sessions) {
      if (s.nodes === undefined) {
        const dag = await loadDag(s.session_id, s).catch(() => null);
        s.nodes = dag ? dag.total : 0;
        const cell = tbody.querySelector(`[data-session="${CSS.escape(s.session_id)}"]`);
        if (cell) cell.textContent = num(s.nodes);
      }
    }
  };
  search.addEventListener('input', draw);
  more.addEventListener('click', () => load().catch(showError));
  fill(view(), h('h2', {}, 'Sessions'), h('div', { class: 'toolbar' }, h('label', {}, 'search', search), status),
    h('table', { id: 'sessions' }, h('thead', {}, h('tr', {}, ['session', 'created', 'top-level nodes', 'branches', 'metadata'].map((t) => h('th', {}, t)))), tbody), more);
  await load();
}

// ------------------------------------------------------------------ the DAG

/**
 * One page of `Log` from `start`: 1,000 nodes, fewer when that answer would be over the server's
 * response size limit (RESOURCE_EXHAUSTED), as a session of huge tool results can make it.
 */
async function logPage(sid, start) {
  for (let limit = 1000; ; limit = Math.floor(limit / 4)) {
    try {
      return await api(`/api/sessions/${enc(sid)}/log?node_id=${enc(start)}&limit=${limit}`);
    } catch (e) {
      if (e.code !== 'RESOURCE_EXHAUSTED' || limit <= 1) throw e;
    }
  }
}

/** Every top-level node reachable from a branch head, each branch's path, and lanes. */
async function loadDag(sid, session) {
  session = session || await api(`/api/sessions/${enc(sid)}`);
  const nodes = new Map();
  const branches = [...session.branches].sort((a, b) => (a.name === 'main' ? -1 : b.name === 'main' ? 1 : a.name.localeCompare(b.name)));
  for (const b of branches) {
    let start = b.head_id;
    // Walks back from the head until the path joins nodes already loaded (a fork point).
    while (start && !nodes.has(start)) {
      const page = await logPage(sid, start);
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
  return { sid, session, nodes, top, lane, lanes, depth, results, chains: new Map(), expanded: new Set(), total: nodes.size };
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
      const page = await logPage(dag.sid, start);
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
        r.inner ? 'inner' : '', n.node_id === selected ? 'selected' : '', opts.highlight && opts.highlight.has(n.node_id) ? 'covered' : ''];
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
  const legend = h('div', { class: 'lanes', id: 'lanes' }, dag.lanes.map((l, i) => h('span', { class: 'lane', 'data-branch': l.name },
    h('i', { class: 'lane-key', style: `background:${LANE_COLORS[i % LANE_COLORS.length]}` }), l.name,
    h('span', { class: 'muted' }, ` ${l.own} own node(s)${l.fork ? `, forks at ${short(l.fork)}` : ''}`))));
  return { el: h('div', {}, legend, box), list, rowOf: (id) => index.get(id) };
}

async function sessionPage(sid) {
  crumbs(sid, 'Session');
  fill(view(), h('p', { class: 'muted' }, 'loading…'));
  const t0 = performance.now();
  const dag = await loadDag(sid);
  const summaries = await api(`/api/sessions/${enc(sid)}/summaries`);
  const detail = h('div', { class: 'panel', id: 'detail' }, h('p', { class: 'muted' }, 'click a node to see its content'));
  const v = dagView(dag, { summaries: summaries.summaries, onSelect: (n) => fill(detail, ...nodeDetail(n)) });
  const s = dag.session;
  fill(view(), h('h2', {}, 'Session ', h('span', { class: 'mono' }, sid)),
    h('p', { class: 'muted', id: 'session-meta' }, `created ${fmtTime(s.created_at_unix_ms)} · ${num(dag.total)} top-level nodes · ${s.branches.length} branch(es) · ${s.compaction_count} compaction(s) · `,
      Object.entries(s.metadata).map(([k, val]) => `${k}=${val}`).join(' '), ` · drawn in ${Math.round(performance.now() - t0)} ms`),
    gatewayLine(s.gateway),
    h('div', { class: 'split' }, v.el, detail));
  v.list.repaint();
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
  const tiers = `truncated ${report.results_truncated} · cleared ${report.results_cleared} · inputs stubbed ${report.inputs_stubbed} · turns snipped ${report.turns_snipped} · summaries ${report.summary_ids.length}${report.microcompact_trigger ? ` · microcompact: ${report.microcompact_trigger}` : ''}`;
  return h('div', { id: 'report' }, bar, legend, h('p', {}, verdict), h('p', { class: 'muted' }, tiers));
}

async function renderPage(sid, params) {
  crumbs(sid, 'Render');
  const session = await api(`/api/sessions/${enc(sid)}`);
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
    location.hash = `#/s/${enc(sid)}/render?${q}`;
  } }, field('branch', branch), field('context window', budget), field('output reserve', reserve), field('tokenizer', tokenizer), field('policy', policy), go);
  fill(view(), h('h2', {}, 'Render ', h('span', { class: 'mono' }, short(sid))), form, out);
  if (!params.has('branch')) return;
  const q = new URLSearchParams({ branch: branch.value, tokenizer: tokenizer.value, ...POLICIES[policy.value] });
  if (budget.value) { q.set('context_window', budget.value); q.set('output_reserve', reserve.value || '0'); }
  const r = await api(`/api/sessions/${enc(sid)}/render?${q}`);
  const report = r.report;
  let s = 0;
  const summaryOf = r.messages.map((m) => (m.node_ids.length ? '' : report.summary_ids[s++] || ''));
  const detail = h('div', { class: 'panel', id: 'message-detail' }, h('p', { class: 'muted' }, 'click a message to see it whole'));
  const list = h('div', { class: 'msgs', id: 'messages' });
  fill(out, contextBar(report),
    report.turns_snipped ? h('p', { class: 'snipped-note' }, h('span', { class: 'badge snipped' }, 'snipped'),
      `${report.turns_snipped} oldest turn(s) dropped: ${report.snipped_node_ids.length} node(s) not sent`) : null,
    h('p', { class: 'muted' }, `${num(r.messages.length)} messages · ${num(r.total_tokens)} tokens (${r.tokenizer})`),
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

async function summariesPage(sid, params) {
  crumbs(sid, 'Summaries');
  const branchName = params.get('branch') || 'main';
  const [dag, listing] = await Promise.all([loadDag(sid), api(`/api/sessions/${enc(sid)}/summaries?branch=${enc(branchName)}`)]);
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
  const branchSel = h('select', { id: 'summary-branch', onchange: (ev) => { location.hash = `#/s/${enc(sid)}/summaries?branch=${enc(ev.target.value)}`; } },
    dag.session.branches.map((b) => h('option', { selected: b.name === branchName }, b.name)));
  fill(view(), h('h2', {}, 'Summaries ', h('span', { class: 'mono' }, short(sid))),
    h('div', { class: 'toolbar' }, h('label', {}, 'branch', branchSel), h('span', { class: 'muted' }, `${listing.events.length} event(s), ${listing.summaries.length} summary(ies)`)),
    h('div', { class: 'split' }, h('div', {}, h('div', { class: 'panel', id: 'attempts' }, cards.length ? [...cards.slice(0, listing.events.length), ...imported] : h('p', { class: 'muted' }, 'no compaction attempts')), holder), detail));
  show(null);
}

// ------------------------------------------------------------------ routing

async function route() {
  const [path, query] = (location.hash.slice(1) || '/').split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  document.getElementById('forget-key').hidden = !sessionStorage.getItem(KEY);
  try {
    if (parts[0] === 's' && parts[1]) {
      if (parts[2] === 'render') await renderPage(parts[1], params);
      else if (parts[2] === 'summaries') await summariesPage(parts[1], params);
      else await sessionPage(parts[1]);
    } else {
      await sessionsPage(params);
    }
    document.body.dataset.ready = location.hash || '#/';
  } catch (e) {
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
