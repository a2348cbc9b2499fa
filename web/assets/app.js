// Corral's rack page. Plain JavaScript, no build step, no external
// resources. The bearer token lives in sessionStorage (never a cookie)
// and goes out as "Authorization: Bearer" on every fetch. It reads and
// acts through the appliance's REST API under /v1/ (protojson: lowerCamel
// fields, unset fields omitted, enums by name; errors {"code","message"}
// with a gRPC code number); lists are kept live by its /v1/watch/...
// streams (newline-delimited JSON, a line {"result":<event>} per event),
// or by polling the list when the appliance has no Watch (HTTP 501 or
// 404).
'use strict';

const TOKEN_KEY = 'corral.token';
const POLL_MS = 3000;
const RETRY_MS = 3000;
const MAX_LINE = 8 << 20; // a stream line longer than this ends the stream
const MAX_TIMELINE = 1000;

const $ = (id) => document.getElementById(id);

// ---- DOM helpers (text only: data never becomes markup) ----

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

const SVGNS = 'http://www.w3.org/2000/svg';
function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVGNS, tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// ---- formatting ----

function num(v) { return v === undefined || v === null || v === '' ? 0 : Number(v); }

function bytes(v) {
  let n = num(v);
  if (!n) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (n >= 100 || i === 0 ? n.toFixed(0) : n.toFixed(1).replace(/\.0$/, '')) + ' ' + units[i];
}

function when(ts) {
  if (!ts) return '—';
  const d = new Date(ts);
  if (isNaN(d)) return '—';
  return d.toLocaleString();
}

function ago(ts) {
  if (!ts) return '—';
  const sec = Math.round((Date.now() - new Date(ts).getTime()) / 1000);
  if (isNaN(sec)) return '—';
  if (sec < 5) return 'just now';
  if (sec < 60) return sec + ' s ago';
  if (sec < 3600) return Math.round(sec / 60) + ' min ago';
  if (sec < 86400) return Math.round(sec / 3600) + ' h ago';
  return Math.round(sec / 86400) + ' d ago';
}

function power(p) {
  return ({ POWER_STATE_ON: 'on', POWER_STATE_OFF: 'off', POWER_STATE_UNKNOWN: 'unknown' })[p] || '—';
}

function badge(state, kind) {
  const st = state || 'UNSPECIFIED';
  return h('span', { class: 'badge ' + (kind || 'state') + '-' + st }, st.replace(/^NODE_/, ''));
}

function cpuSummary(f) {
  const c = f && f.cpu;
  if (!c) return '—';
  const shape = [c.sockets && c.sockets + ' socket' + (c.sockets > 1 ? 's' : ''), c.cores && c.cores + ' cores', c.threads && c.threads + ' threads'].filter(Boolean).join(', ');
  return [c.model, shape].filter(Boolean).join(' · ') || '—';
}

// cpuShort is the list's CPU column: model, cores and threads.
function cpuShort(f) {
  const c = f && f.cpu;
  if (!c) return '—';
  const shape = (c.cores ? c.cores + 'C' : '') + (c.threads ? '/' + c.threads + 'T' : '');
  return [c.model, shape].filter(Boolean).join(' · ') || '—';
}

function disksSummary(f) {
  const ds = (f && f.disks) || [];
  if (!ds.length) return '—';
  const total = ds.reduce((a, d) => a + num(d.sizeBytes), 0);
  return ds.length + ' · ' + bytes(total);
}

function nicsSummary(f) {
  const ns = (f && f.nics) || [];
  if (!ns.length) return '—';
  const up = ns.filter((n) => n.link).length;
  return ns.length + ' · ' + up + ' up';
}

// ---- notices and confirmation ----

function notice(text, kind) {
  const n = $('notice');
  $('notice-text').textContent = text;
  n.className = 'notice ' + (kind || 'error');
  n.hidden = false;
}

function clearNotice() { $('notice').hidden = true; }

function confirmAction(text) {
  const d = $('confirm');
  $('confirm-text').textContent = text;
  return new Promise((resolve) => {
    const done = (v) => {
      $('confirm-ok').removeEventListener('click', ok);
      $('confirm-cancel').removeEventListener('click', cancel);
      d.removeEventListener('cancel', cancel);
      if (d.open) d.close();
      resolve(v);
    };
    const ok = () => done(true);
    const cancel = () => done(false);
    $('confirm-ok').addEventListener('click', ok);
    $('confirm-cancel').addEventListener('click', cancel);
    d.addEventListener('cancel', cancel);
    d.showModal();
    $('confirm-ok').focus();
  });
}

function setLive(mode, detail) {
  const l = $('live');
  l.hidden = false;
  l.className = 'live live-' + mode;
  l.textContent = ({ live: 'Live', polling: 'Polling every ' + POLL_MS / 1000 + ' s', connecting: 'Connecting…', error: 'Disconnected' })[mode] || mode;
  l.title = detail || (mode === 'polling' ? 'This appliance has no Watch API: the page re-reads the list.' : '');
}

// ---- API ----

class APIError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// CODES names the gRPC status codes a REST error carries as numbers.
const CODES = ['OK', 'Canceled', 'Unknown', 'InvalidArgument', 'DeadlineExceeded', 'NotFound', 'AlreadyExists', 'PermissionDenied',
  'ResourceExhausted', 'FailedPrecondition', 'Aborted', 'OutOfRange', 'Unimplemented', 'Internal', 'Unavailable', 'DataLoss', 'Unauthenticated'];

// statusOf reads an error body: REST's google.rpc.Status {"code":7,
// "message":...} (a watch's last line too), or /api/whoami's
// {"error":{"code":"PermissionDenied","message":...}}. It returns
// { code (a name), message }, or null when data is neither.
function statusOf(data) {
  if (!data || typeof data !== 'object') return null;
  const e = data.error && typeof data.error === 'object' ? data.error : data;
  if (e.code === undefined || e.code === null) return null;
  const code = typeof e.code === 'number' ? (CODES[e.code] || 'Code ' + e.code) : String(e.code);
  return { code, message: typeof e.message === 'string' ? e.message : '' };
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ''; }
function authHeaders() { return { Authorization: 'Bearer ' + token() }; }

async function api(path, opts) {
  opts = opts || {};
  const headers = authHeaders();
  let body;
  if (opts.body !== undefined) {
    headers['Content-Type'] = 'application/json';
    body = JSON.stringify(opts.body);
  }
  const res = await fetch(path, { method: opts.method || 'GET', headers, body, cache: 'no-store', signal: opts.signal });
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
  if (!res.ok) {
    const e = statusOf(data) || { code: 'HTTP ' + res.status, message: text.trim() || res.statusText };
    if (res.status === 401 && !opts.login) signOut('Signed out: ' + e.message);
    throw new APIError(res.status, e.code, e.message);
  }
  return data;
}

// live keeps a collection current: it opens the watch stream and, when
// the appliance answers 501 (no Watch) or 503 (too many streams), polls
// load() instead. keyOf(obj) keys objects (DELETED removes); without
// keyOf, events are appended (a timeline). onChange gets an array of the
// objects, the Set of keys that changed since the last call (null: look
// at everything, as after a sync or a poll) and the Map by key.
function live(opt) {
  const ctl = new AbortController();
  let stopped = false;
  let timer = null;
  let items = new Map();
  let seq = 0;
  const emit = (changed) => opt.onChange([...items.values()], opt.keyOf ? changed : null, items);
  const put = (m, obj) => {
    if (opt.keyOf) { m.set(opt.keyOf(obj), obj); return; }
    m.set(seq++, obj);
    if (m.size > MAX_TIMELINE) m.delete(m.keys().next().value);
  };
  const later = (fn, ms) => { if (!stopped) timer = setTimeout(fn, ms); };

  async function poll() {
    if (stopped) return;
    try {
      const list = await opt.load(ctl.signal);
      items = new Map();
      for (const it of list) put(items, it);
      if (!stopped) { setLive('polling'); emit(null); }
    } catch (e) {
      if (stopped) return;
      setLive('error', e.message);
    }
    later(poll, POLL_MS);
  }

  async function watch(rev) {
    if (stopped) return;
    let res;
    try {
      res = await fetch(opt.watch + (rev ? (opt.watch.includes('?') ? '&' : '?') + 'fromRevision=' + rev : ''),
        { headers: authHeaders(), cache: 'no-store', signal: ctl.signal });
    } catch (e) {
      if (!stopped) { setLive('error', e.message); later(() => watch(rev), RETRY_MS); }
      return;
    }
    // 501: the RPC is not implemented; 404: an appliance without this
    // watch route; 503: too many streams open.
    if (res.status === 501 || res.status === 404 || res.status === 503) { poll(); return; }
    if (!res.ok) {
      let e = {};
      try { e = statusOf(await res.json()) || {}; } catch (x) { e = {}; }
      if (res.status === 401) { signOut('Signed out: ' + (e.message || 'token refused')); return; }
      setLive('error', (e.code || res.status) + ': ' + (e.message || ''));
      later(() => watch(0), RETRY_MS * 2);
      return;
    }
    let synced = rev > 0;
    let last = rev;
    let pending = new Map();
    if (synced) setLive('live');
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        // changed: the keys this chunk changed; null once everything may
        // have (SYNCED, or an append-only collection).
        let changed = new Set();
        let any = false;
        let start = 0;
        let i;
        while ((i = buf.indexOf('\n', start)) >= 0) {
          const line = buf.slice(start, i).trim();
          start = i + 1;
          if (!line) continue;
          const frame = JSON.parse(line);
          const ev = frame && frame.result;
          if (!ev || typeof ev !== 'object') {
            // The last line of a stream a status ended.
            const st = statusOf(frame) || { code: 'Unknown', message: 'unexpected stream line' };
            // OUT_OF_RANGE: the revision is compacted, re-list from 0.
            if (st.code === 'OutOfRange') last = 0;
            const p = perf();
            p.streamErrors = (p.streamErrors || 0) + 1;
            p.lastStreamError = st.code + ': ' + st.message;
            setLive('error', st.code + ': ' + st.message);
            throw new Error(st.message);
          }
          // Resume from a revision only once the list is complete: a
          // stream cut during the initial list (a slow reader is cut
          // with ResourceExhausted) must list again from 0, or the
          // objects not yet received would be missing.
          if (ev.revision && (synced || ev.type === 'SYNCED')) last = Number(ev.revision);
          const obj = ev[opt.field];
          switch (ev.type) {
            case 'ADDED':
            case 'MODIFIED':
              put(synced ? items : pending, obj);
              if (synced) {
                any = true;
                if (changed && opt.keyOf) changed.add(opt.keyOf(obj));
              }
              break;
            case 'DELETED':
              if (opt.keyOf && obj) {
                items.delete(opt.keyOf(obj));
                any = true;
                if (changed) changed.add(opt.keyOf(obj));
              }
              break;
            case 'SYNCED':
              items = pending;
              pending = new Map();
              synced = true;
              any = true;
              changed = null;
              setLive('live');
              break;
          }
        }
        buf = buf.slice(start);
        if (buf.length > MAX_LINE) throw new Error('stream line too long');
        if (any) emit(changed);
      }
    } catch (e) {
      if (stopped) return;
    }
    later(() => watch(last), 1000);
  }

  setLive('connecting');
  watch(0);
  return {
    stop() { stopped = true; ctl.abort(); clearTimeout(timer); },
  };
}

// ---- session ----

// caller is the /api/whoami answer for the token: its role and, per
// action of the page, whether the role may do it. It is null until
// loaded; an appliance that does not say (501) gives { role: '' } and
// every action is shown (the API still refuses what the role may not).
let caller = null;

async function loadCaller(opts) {
  try {
    caller = await api('/api/whoami', opts);
  } catch (e) {
    if (e.status !== 501) throw e;
    // No whoami: check the token with a call every role may make.
    await api('/v1/machines?pageSize=1&view=MACHINE_VIEW_SUMMARY', opts);
    caller = { role: '', actions: null };
  }
}

// may reports whether the caller's role may do the page's action
// (accept, power, maintenance); unknown means yes.
function may(action) {
  const a = caller && caller.actions && caller.actions[action];
  return !a || a.allowed;
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  caller = null;
  if (message) notice(message, 'error');
  location.hash = '#/login';
  route();
}

function showLogin() {
  $('nav').hidden = true;
  $('signout').hidden = true;
  $('live').hidden = true;
  $('who').hidden = true;
  const input = h('input', { id: 'token', type: 'password', autocomplete: 'off', spellcheck: 'false', required: true, placeholder: 'token' });
  const err = h('p', { id: 'login-error', class: 'error', role: 'alert' });
  const form = h('form', {
    id: 'login', class: 'card login',
    onsubmit: async (ev) => {
      ev.preventDefault();
      const t = input.value.trim();
      if (!t) return;
      sessionStorage.setItem(TOKEN_KEY, t);
      try {
        await loadCaller({ login: true });
        clearNotice();
        // A new hash routes (hashchange); the same one must be routed here.
        if (location.hash === '#/machines') route(); else location.hash = '#/machines';
      } catch (e) {
        sessionStorage.removeItem(TOKEN_KEY);
        caller = null;
        err.textContent = e.status === 401 ? 'The appliance does not accept this token (' + e.message + ').' : e.code + ': ' + e.message;
      }
    },
  },
  h('h1', null, 'Sign in to Corral'),
  h('p', { class: 'muted' }, 'Paste a token. An admin makes one with ', h('code', { id: 'token-command' }, 'corral token create --role viewer'),
    ' (or ', h('code', null, '--role operator'), '), or use the token in admin.conf. It is kept in this tab only (sessionStorage) and sent as a bearer token; viewers see, operators may also accept, power and set maintenance.'),
  h('label', { for: 'token' }, 'Token'),
  input,
  h('button', { type: 'submit', class: 'primary', id: 'login-submit' }, 'Sign in'),
  err);
  $('main').replaceChildren(form);
  input.focus();
}

// ---- actions ----

// ACTION_PATHS: each action's REST route after /v1/machines/{name}.
const ACTION_PATHS = { accept: ':accept', power: '/power', maintenance: ':maintenance' };

// POWER_ACTIONS: the power menu's values as the API's enum names.
const POWER_ACTIONS = { on: 'POWER_ACTION_ON', off: 'POWER_ACTION_OFF', 'soft-off': 'POWER_ACTION_SOFT_OFF', cycle: 'POWER_ACTION_CYCLE', reset: 'POWER_ACTION_RESET' };

// act does the page's action (accept, power, maintenance) on machine
// name with body, the RPC's request fields, after asking.
async function act(name, what, action, body, done) {
  clearNotice();
  if (!(await confirmAction(what + ' ' + name + '?'))) return;
  try {
    await api('/v1/machines/' + encodeURIComponent(name) + ACTION_PATHS[action], { method: 'POST', body });
    notice(what + ' ' + name + ': done', 'ok');
    if (done) done();
  } catch (e) {
    if (e.code !== 'PermissionDenied') {
      notice(what + ' ' + name + ' failed: ' + e.message + ' (' + e.code + ')', 'error');
      return;
    }
    // A refusal for the role is said in words (/api/whoami's), not as
    // the RPC's name; the role may have changed under the page, so ask
    // again.
    try { await loadCaller(); } catch (x) { /* keep the old answer */ }
    const a = caller && caller.actions && caller.actions[action];
    notice(what + ' ' + name + ' refused. ' + (a && a.refusal ? a.refusal : 'Your token\'s role may not do this.'), 'error');
  }
}

function machineActions(m, done) {
  const name = m.name;
  const st = m.state || 'UNSPECIFIED';
  const out = [];
  if ((st === 'INVENTORIED' || st === 'FAILED') && may('accept')) {
    out.push(h('button', { type: 'button', 'data-action': 'accept', onclick: () => act(name, 'Accept', 'accept', { disk: 'auto' }, done) }, 'Accept'));
  }
  const sel = h('select', { 'data-action': 'power', 'aria-label': 'Power action' },
    h('option', { value: '' }, 'Power…'),
    h('option', { value: 'on' }, 'On'),
    h('option', { value: 'off' }, 'Off'),
    h('option', { value: 'soft-off' }, 'Soft off'),
    h('option', { value: 'cycle' }, 'Cycle'),
    h('option', { value: 'reset' }, 'Reset'));
  sel.addEventListener('change', () => {
    const a = sel.value;
    sel.value = '';
    if (POWER_ACTIONS[a]) act(name, 'Power ' + a, 'power', { action: POWER_ACTIONS[a] }, done);
  });
  if (may('power')) out.push(sel);
  if (!may('maintenance')) {
    // Nothing to add.
  } else if (st === 'MAINTENANCE') {
    out.push(h('button', { type: 'button', 'data-action': 'maintenance-off', onclick: () => act(name, 'End maintenance of', 'maintenance', { on: false }, done) }, 'End maintenance'));
  } else {
    out.push(h('button', { type: 'button', 'data-action': 'maintenance-on', onclick: () => act(name, 'Put into maintenance', 'maintenance', { on: true, reason: 'set from the web page' }, done) }, 'Maintenance'));
  }
  return out.length ? h('div', { class: 'actions' }, out) : null;
}

// anyAction reports whether the caller may do any of the page's actions.
function anyAction() { return may('accept') || may('power') || may('maintenance'); }

// ---- pages ----

let current = null; // the page's live subscriptions

function table(cls, head, rows, empty) {
  return h('table', { class: cls },
    h('thead', null, h('tr', null, head.map((c) => h('th', null, c)))),
    h('tbody', null, rows.length ? rows : h('tr', { class: 'empty' }, h('td', { colspan: head.length }, empty))));
}

// The machines page keeps one row per machine, keyed by name: a live
// update rebuilds the cells of the rows it changed and moves them only
// when their place in the sort order changed. Search (name, serial, MAC),
// the state filter and the sort (click a column's heading) work on every
// machine; the table lists the first MACHINE_ROWS that match (more on
// request), so a rack of thousands stays responsive.

const MACHINE_ROWS = 200;

const MACHINE_STATES = ['DISCOVERED', 'INVENTORIED', 'INSTALLING', 'READY', 'ALLOCATED', 'DEPLOYING', 'DEPLOYED', 'RELEASING', 'FAILED', 'MAINTENANCE', 'CONFLICT'];

// Plain order, not numeric: machine names are often hex MACs (m-525400…).
const collator = new Intl.Collator(undefined, { sensitivity: 'base' });

function diskTotal(f) { return ((f && f.disks) || []).reduce((a, d) => a + num(d.sizeBytes), 0); }

// MACHINE_COLUMNS: heading, sort key (null: not sortable) and the value
// sorted by.
const MACHINE_COLUMNS = [
  ['Name', 'name', (m) => m.name],
  ['State', 'state', (m) => m.state || 'UNSPECIFIED'],
  ['Power', 'power', (m) => power(m.powerState)],
  ['Serial', 'serial', (m) => m.serial || ''],
  ['CPU', 'cpu', (m) => cpuShort(m.facts)],
  ['Memory', 'memory', (m) => num(m.facts && m.facts.memory && m.facts.memory.totalBytes)],
  ['Disks', 'disks', (m) => diskTotal(m.facts)],
  ['NICs', 'nics', (m) => ((m.facts && m.facts.nics) || []).length],
  ['Node', 'node', (m) => m.nodeName || ''],
  ['Pool', 'pool', (m) => placeShort(m)],
];

// placeShort is the list's Pool column: pool, then zone ("ci / a").
function placeShort(m) {
  return [m.pool, m.zone].filter(Boolean).join(' / ');
}

// labelsText is a machine's labels as sorted k=v pairs.
function labelsText(m) {
  return Object.keys(m.labels || {}).sort().map((k) => k + '=' + m.labels[k]).join(', ');
}

// allocationText says who holds a machine, until when, or how its last
// allocation ended.
function allocationText(m) {
  const a = m.allocation;
  if (!a || !a.owner) return '';
  const who = a.owner + (a.ownerName ? ' (' + a.ownerName + ')' : '');
  if (a.releasedAt) return who + ', ended ' + when(a.releasedAt) + ': ' + (a.releaseReason || '');
  return who + ' since ' + when(a.allocatedAt) + (a.expiresAt ? ', until ' + when(a.expiresAt) : '');
}

function machineCells(m, actions) {
  const cells = [
    h('td', null, h('a', { href: '#/machines/' + encodeURIComponent(m.name) }, m.name),
      (m.flags || []).length ? h('span', { class: 'flag', title: m.flags.join(', ') }, '!') : null),
    h('td', { class: 'state', title: m.stateReason || '' }, badge(m.state)),
    h('td', { class: 'power' }, h('span', { class: 'power-' + power(m.powerState) }, power(m.powerState))),
    h('td', { class: 'mono' }, m.serial || '—'),
    h('td', { class: 'cpu', title: cpuSummary(m.facts) }, cpuShort(m.facts)),
    h('td', null, bytes(m.facts && m.facts.memory && m.facts.memory.totalBytes)),
    h('td', null, disksSummary(m.facts)),
    h('td', null, nicsSummary(m.facts)),
    h('td', null, m.nodeName || '—'),
    h('td', { title: labelsText(m) }, placeShort(m) || '—'),
  ];
  if (actions) cells.push(h('td', null, machineActions(m)));
  return cells;
}

// machineSig is what a row shows: a row whose signature did not change
// is left alone.
function machineSig(m) {
  const f = m.facts || {};
  return JSON.stringify([m.state, m.stateReason, m.powerState, m.serial, m.flags, m.nodeName, m.pool, m.zone, m.labels,
    f.cpu, f.memory && f.memory.totalBytes, diskTotal(f), (f.disks || []).length, (f.nics || []).map((n) => n.link)]);
}

// machineHay is what the search looks in: name, serial and every MAC.
function machineHay(m) {
  const macs = [m.bootMac, ...(m.macs || []), ...((m.facts && m.facts.nics) || []).map((n) => n.mac)];
  return [m.name, m.serial, ...macs].filter(Boolean).join(' ').toLowerCase();
}

// perf holds page timings for tests and the curious:
// window.corralPerf.initialRender (ms from opening the machines page to
// its first complete table), .updates[name] (wall-clock ms when a live
// update of the row reached a frame) and .streamErrors (watch streams
// ended by a status, e.g. a slow reader cut with ResourceExhausted).
function perf() {
  window.corralPerf = window.corralPerf || { updates: {} };
  return window.corralPerf;
}

function pageMachines(main) {
  const opened = performance.now();
  const actions = anyAction();
  const count = h('span', { class: 'count', id: 'machine-count' });
  const search = h('input', { id: 'machine-search', type: 'search', placeholder: 'Search name, serial or MAC', 'aria-label': 'Search machines', autocomplete: 'off', spellcheck: 'false' });
  const stateOpts = new Map(MACHINE_STATES.map((st) => [st, h('option', { value: st }, st)]));
  const filter = h('select', { id: 'machine-state', 'aria-label': 'Filter by state' }, h('option', { value: '' }, 'All states'), [...stateOpts.values()]);
  const heads = MACHINE_COLUMNS.map(([label, key]) => h('th', { 'data-sort': key },
    h('button', { type: 'button', class: 'sort', onclick: () => sortBy(key) }, label)));
  if (actions) heads.push(h('th', null, 'Actions'));
  const tbody = h('tbody');
  const empty = h('td', { colspan: heads.length });
  const emptyRow = h('tr', { class: 'empty' }, empty);
  const moreText = h('span');
  const more = h('button', { type: 'button', id: 'machine-more', onclick: () => { limit += MACHINE_ROWS; show(); } });
  const moreRow = h('tr', { class: 'more' }, h('td', { colspan: heads.length }, moreText, ' ', more));
  const tableEl = h('table', { class: 'list machines' }, h('thead', null, h('tr', null, heads)), tbody, h('tfoot', null, emptyRow, moreRow));
  const body = h('div', { class: 'card' }, h('p', { class: 'muted' }, 'Loading…'));
  main.replaceChildren(h('div', { class: 'page-head' }, h('h1', null, 'Machines'), count,
    h('div', { class: 'filters' }, search, filter)), body);

  // rows: name -> { m, sig, hay, val (the sort value), match (passes the
  // search and filter), tr (made when the row is first shown, dropped
  // when it changes while not shown) }. order: every row, sorted.
  const rows = new Map();
  let order = [];
  let sortKey = 'name';
  let sortDir = 1;
  let query = '';
  let stateWanted = '';
  let limit = MACHINE_ROWS;
  let first = true;

  const sortVal = MACHINE_COLUMNS.reduce((o, [, key, fn]) => (o[key] = fn, o), {});
  const cmpRows = (a, b) => {
    const x = a.val, y = b.val;
    const c = typeof x === 'number' ? x - y : collator.compare(x, y);
    return (c || collator.compare(a.m.name, b.m.name)) * sortDir;
  };
  const matches = (r) => (!stateWanted || (r.m.state || 'UNSPECIFIED') === stateWanted) && (!query || r.hay.includes(query));

  // upsert takes m into its row; it reports whether the row's place in
  // the order may have changed (a new row, or a new sort value).
  const upsert = (m) => {
    const sig = machineSig(m);
    let r = rows.get(m.name);
    if (r && r.sig === sig) { r.m = m; return false; }
    const val = sortVal[sortKey](m);
    if (!r) {
      r = { m, sig, hay: machineHay(m), val, match: false, tr: null };
      r.match = matches(r);
      rows.set(m.name, r);
      return true;
    }
    r.m = m;
    r.sig = sig;
    r.hay = machineHay(m);
    r.match = matches(r);
    if (r.tr && r.tr.isConnected) r.tr.replaceChildren(...machineCells(m, actions));
    else r.tr = null;
    const moved = val !== r.val;
    r.val = val;
    return moved;
  };
  const remove = (name) => {
    const r = rows.get(name);
    if (!r) return;
    rows.delete(name);
    const i = order.indexOf(r);
    if (i >= 0) order.splice(i, 1);
  };
  // place moves a row to where the order wants it (a binary search).
  const place = (r) => {
    const i = order.indexOf(r);
    if (i >= 0) order.splice(i, 1);
    let lo = 0, hi = order.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cmpRows(order[mid], r) < 0) lo = mid + 1; else hi = mid;
    }
    order.splice(lo, 0, r);
  };
  const resort = () => {
    for (const r of rows.values()) r.val = sortVal[sortKey](r.m);
    order = [...rows.values()].sort(cmpRows);
    for (const th of heads) {
      if (th.dataset.sort) th.setAttribute('aria-sort', th.dataset.sort === sortKey ? (sortDir > 0 ? 'ascending' : 'descending') : 'none');
    }
  };
  // show puts the first `limit` matching rows, in order, into the table,
  // moving only the rows that are out of place, and writes the counts.
  const show = () => {
    const per = {};
    let matched = 0;
    let cur = tbody.firstChild;
    for (const r of order) {
      const st = r.m.state || 'UNSPECIFIED';
      per[st] = (per[st] || 0) + 1;
      if (!r.match) continue;
      matched++;
      if (matched > limit) continue;
      if (!r.tr) r.tr = h('tr', { 'data-name': r.m.name }, machineCells(r.m, actions));
      if (r.tr === cur) { cur = cur.nextSibling; continue; }
      tbody.insertBefore(r.tr, cur);
    }
    while (cur) { const n = cur.nextSibling; cur.remove(); cur = n; }
    const n = rows.size;
    const total = n.toLocaleString() + (n === 1 ? ' machine' : ' machines');
    count.textContent = matched === n ? total : matched.toLocaleString() + ' of ' + total + ' shown';
    for (const [st, opt] of stateOpts) {
      const t = st + ' (' + (per[st] || 0).toLocaleString() + ')';
      if (opt.textContent !== t) opt.textContent = t;
    }
    emptyRow.hidden = matched > 0;
    empty.textContent = n ? 'No machine matches the search and filter.' : 'No machines yet: they appear when they PXE-boot on the provisioning network.';
    moreRow.hidden = matched <= limit;
    moreText.textContent = 'The first ' + limit.toLocaleString() + ' of ' + matched.toLocaleString() + ' are listed; search or filter to find the others, or';
    more.textContent = 'list ' + Math.min(MACHINE_ROWS, matched - limit).toLocaleString() + ' more';
  };
  const refilter = () => {
    for (const r of rows.values()) r.match = matches(r);
    limit = MACHINE_ROWS;
    show();
  };
  const sortBy = (key) => {
    if (key === sortKey) sortDir = -sortDir; else { sortKey = key; sortDir = 1; }
    resort();
    show();
  };
  let pending = 0;
  search.addEventListener('input', () => {
    cancelAnimationFrame(pending);
    pending = requestAnimationFrame(() => { query = search.value.trim().toLowerCase(); refilter(); });
  });
  filter.addEventListener('change', () => { stateWanted = filter.value; refilter(); });

  const render = (ms, changed, byName) => {
    const began = performance.now();
    if (changed === null) {
      for (const m of ms) upsert(m);
      for (const name of [...rows.keys()]) if (!byName.has(name)) remove(name);
      resort();
    } else {
      const stamp = [];
      for (const name of changed) {
        const m = byName.get(name);
        if (!m) { remove(name); continue; }
        const isNew = !rows.has(name);
        if (upsert(m) || isNew) place(rows.get(name));
        stamp.push([name, m.state]);
      }
      requestAnimationFrame(() => {
        const at = Date.now();
        for (const [name, state] of stamp) perf().updates[name] = { state, at };
      });
    }
    show();
    if (first) {
      first = false;
      body.replaceChildren(tableEl);
      const built = performance.now();
      requestAnimationFrame(() => {
        const now = performance.now();
        // ms: the whole wait; dataMs: until the machines were in; jsMs:
        // taking them in and building the rows; buildMs: that and the
        // first frame (style, layout, paint).
        perf().initialRender = { rows: rows.size, shown: tbody.childElementCount, ms: now - opened, dataMs: began - opened, jsMs: built - began, buildMs: now - began };
        performance.mark('corral-machines-rendered');
      });
    }
  };
  return [live({
    load: (signal) => readPages(MACHINE_LIST, 'machines', signal),
    watch: MACHINE_WATCH, field: 'machine', keyOf: (m) => m.name, onChange: render,
  })];
}

// MACHINE_LIST and MACHINE_WATCH read machine summaries (no fact
// history, no PCI devices: a machine's own page gets them), as many a
// page as the appliance serves.
const MACHINE_LIST = '/v1/machines?view=MACHINE_VIEW_SUMMARY&pageSize=1000';
const MACHINE_WATCH = '/v1/watch/machines?view=MACHINE_VIEW_SUMMARY';

// readPages reads a paged list to its last page (the appliance answers a
// page at a time: pageToken from the previous answer's nextPageToken)
// and returns the items of field.
async function readPages(path, field, signal) {
  const all = [];
  let token = '';
  do {
    const res = await api(path + (token ? (path.includes('?') ? '&' : '?') + 'pageToken=' + encodeURIComponent(token) : ''), { signal });
    for (const it of (res && res[field]) || []) all.push(it);
    token = (res && res.nextPageToken) || '';
  } while (token);
  return all;
}

function kv(pairs) {
  return h('dl', { class: 'kv' }, pairs.filter((p) => p[1] !== undefined && p[1] !== null && p[1] !== '').map(([k, v]) => [h('dt', null, k), h('dd', null, v)]));
}

// Boot phases, in the order a boot goes through them.
const PHASES = ['power', 'dhcp', 'tftp', 'script', 'kernel+initrd', 'agent', 'install', 'operator', 'other'];

function phaseOf(e) {
  const src = e.source || '';
  const ev = e.event || '';
  if (src === 'api' || ev.startsWith('maintenance')) return 'operator';
  if (src === 'bmc' || /power/.test(ev)) return 'power';
  if (src === 'dhcp' || src === 'ra') return 'dhcp';
  if (src === 'tftp') return 'tftp';
  if (src === 'http' && ev === 'script') return 'script';
  if (src === 'http') return 'kernel+initrd';
  if (src === 'agent' && ev.startsWith('progress')) return 'install';
  if (src === 'inventory' || src === 'agent') return 'agent';
  if (src === 'lifecycle' || src === 'install') return 'install';
  return 'other';
}

// timelineSVG draws the entries as phases on a time axis: one lane per
// phase, a bar from a phase's first entry until the next phase starts
// (or its own last entry), a dot per entry.
function timelineSVG(entries) {
  const es = entries.filter((e) => e.at).map((e) => ({ e, t: new Date(e.at).getTime(), p: phaseOf(e) })).filter((x) => !isNaN(x.t));
  es.sort((a, b) => a.t - b.t);
  const W = 1160, left = 110, right = 20, lane = 24, top = 10;
  const lanes = PHASES.filter((p) => es.some((x) => x.p === p));
  const H = top + lanes.length * lane + 34;
  const svg = s('svg', { class: 'timeline', viewBox: '0 0 ' + W + ' ' + H, width: W, height: H, role: 'img', 'aria-label': 'Boot timeline' });
  if (!es.length) {
    svg.setAttribute('viewBox', '0 0 ' + W + ' 40');
    svg.setAttribute('height', 40);
    svg.append(s('text', { x: 10, y: 25, class: 'axis-label' }, 'No timeline entries yet.'));
    return svg;
  }
  const t0 = es[0].t;
  const t1 = Math.max(es[es.length - 1].t, t0 + 1000);
  const x = (t) => left + ((t - t0) / (t1 - t0)) * (W - left - right);
  const y = (p) => top + lanes.indexOf(p) * lane;
  lanes.forEach((p, i) => {
    svg.append(s('rect', { x: 0, y: y(p), width: W, height: lane, class: i % 2 ? 'lane odd' : 'lane' }));
    svg.append(s('text', { x: 8, y: y(p) + 16, class: 'lane-label' }, p));
  });
  // Segments: consecutive entries of one phase.
  const segs = [];
  for (const x0 of es) {
    const last = segs[segs.length - 1];
    if (last && last.p === x0.p) { last.end = x0.t; last.n++; } else segs.push({ p: x0.p, start: x0.t, end: x0.t, n: 1 });
  }
  segs.forEach((g, i) => {
    const next = segs[i + 1];
    const end = next ? Math.max(next.start, g.end) : g.end;
    const x1 = x(g.start);
    const w = Math.max(x(end) - x1, 4);
    svg.append(s('rect', { x: x1, y: y(g.p) + 5, width: w, height: lane - 10, rx: 3, class: 'phase phase-' + g.p.replace('+', '-'), 'data-phase': g.p },
      s('title', null, g.p + ': ' + g.n + ' entr' + (g.n === 1 ? 'y' : 'ies') + ', ' + ((end - g.start) / 1000).toFixed(1) + ' s from ' + new Date(g.start).toLocaleTimeString())));
  });
  for (const x0 of es) {
    svg.append(s('circle', { cx: x(x0.t), cy: y(x0.p) + lane / 2, r: 3, class: 'entry' },
      s('title', null, new Date(x0.t).toLocaleTimeString() + ' ' + x0.e.source + '/' + x0.e.event + (x0.e.detail ? ': ' + x0.e.detail : ''))));
  }
  // Axis: five ticks, seconds from the first entry.
  const axisY = top + lanes.length * lane + 6;
  svg.append(s('line', { x1: left, x2: W - right, y1: axisY, y2: axisY, class: 'axis' }));
  for (let i = 0; i <= 5; i++) {
    const t = t0 + ((t1 - t0) * i) / 5;
    svg.append(s('line', { x1: x(t), x2: x(t), y1: axisY, y2: axisY + 5, class: 'axis' }));
    svg.append(s('text', { x: x(t), y: axisY + 18, class: 'axis-label', 'text-anchor': i === 0 ? 'start' : i === 5 ? 'end' : 'middle' },
      i === 0 ? new Date(t0).toLocaleTimeString() : '+' + fmtDur(t - t0)));
  }
  return svg;
}

function fmtDur(ms) {
  const sec = ms / 1000;
  if (sec < 120) return sec.toFixed(sec < 10 ? 1 : 0) + ' s';
  if (sec < 7200) return (sec / 60).toFixed(1) + ' min';
  return (sec / 3600).toFixed(1) + ' h';
}

function pageMachine(main, name) {
  const head = h('div', { class: 'page-head' }, h('h1', null, name));
  const summary = h('div', { class: 'card' }, h('p', { class: 'muted' }, 'Loading…'));
  const facts = h('div', { class: 'facts' });
  const tl = h('div', { class: 'card' }, h('h2', null, 'Boot timeline'), h('p', { class: 'muted' }, 'Loading…'));
  const hist = h('div', { class: 'card' });
  const health = h('div', { class: 'card health', id: 'bmc-health', hidden: true });
  const con = consoleCard(name, 'machine');
  con.card.hidden = true; // until the record says the machine has a BMC
  main.replaceChildren(h('p', null, h('a', { href: '#/machines' }, '← Machines')), head, summary, health, con.card, tl, facts, hist);
  const renderMachine = (ms) => {
    const m = ms[0];
    if (!m) {
      summary.replaceChildren(h('p', { class: 'error' }, 'Machine ' + name + ' is not in the inventory (deleted?).'));
      return;
    }
    const f = m.facts || {};
    const sys = f.system || {};
    head.replaceChildren(h('h1', null, m.name), h('span', { class: 'state', 'data-name': m.name }, badge(m.state)), machineActions(m));
    summary.replaceChildren(kv([
      ['State', [badge(m.state), m.stateReason ? ' ' + m.stateReason : '']],
      ['Power', power(m.powerState) + (m.powerReadAt ? ' (read ' + ago(m.powerReadAt) + ')' : '')],
      ['Serial', m.serial], ['System UUID', m.systemUuid], ['Boot MAC', m.bootMac],
      ['System', [sys.vendor, sys.product].filter(Boolean).join(' ')],
      ['CPU', cpuSummary(f)], ['Memory', bytes(f.memory && f.memory.totalBytes)],
      ['BMC', m.bmc && m.bmc.address ? m.bmc.address + (m.bmc.provider ? ' (' + m.bmc.provider + ')' : '') : 'not enrolled'],
      ['Node', m.nodeName], ['Flags', (m.flags || []).join(', ')],
      ['Zone', m.zone], ['Pool', m.pool], ['Labels', labelsText(m)], ['Allocation', allocationText(m)],
      ['Install', m.install && m.install.installId ? (m.install.step || 'planned') + (m.install.disk ? ' on ' + m.install.disk : '') + (m.install.error ? ' — ' + m.install.error : '') : ''],
      ['Created', when(m.createdAt)], ['Updated', when(m.updatedAt)],
    ]));
    const hasBMC = Boolean(m.bmc && m.bmc.address);
    con.card.hidden = !hasBMC;
    if (!hasBMC) con.close();
    renderHealth(health, m);
    facts.replaceChildren(
      h('div', { class: 'card' }, h('h2', null, 'Disks'), table('list', ['Name', 'Size', 'Model', 'Serial', 'Bus', 'Kind'],
        (f.disks || []).map((d) => h('tr', null, h('td', { class: 'mono' }, d.name), h('td', null, bytes(d.sizeBytes)), h('td', null, d.model || '—'),
          h('td', { class: 'mono' }, d.serial || '—'), h('td', null, d.bus || '—'), h('td', null, d.rotational ? 'HDD' : 'SSD', d.removable ? ', removable' : ''))),
        'No disks reported.')),
      h('div', { class: 'card' }, h('h2', null, 'NICs'), table('list', ['Name', 'MAC', 'Driver', 'Link', 'Speed'],
        (f.nics || []).map((n) => h('tr', null, h('td', { class: 'mono' }, n.name), h('td', { class: 'mono' }, n.mac), h('td', null, n.driver || '—'),
          h('td', null, n.link ? 'up' : 'down'), h('td', null, n.speedMbps ? n.speedMbps + ' Mb/s' : '—'))),
        'No NICs reported.')));
    const changes = (m.factHistory || []).slice().reverse();
    hist.replaceChildren(h('h2', null, 'Fact history'), table('list history', ['When', 'Fact', 'Before', 'After'],
      changes.map((c) => h('tr', null, h('td', null, when(c.at)), h('td', { class: 'mono' }, c.path), h('td', null, c.before || '—'), h('td', null, c.after || '—'))),
      'No fact changed since the first report.'));
  };
  const renderTimeline = (entries) => {
    const rows = entries.slice().sort((a, b) => new Date(b.at) - new Date(a.at));
    tl.replaceChildren(h('h2', null, 'Boot timeline'), timelineSVG(entries),
      table('list entries', ['When', 'Source', 'Event', 'Detail', 'MAC'],
        rows.map((e) => h('tr', null, h('td', null, when(e.at)), h('td', null, e.source), h('td', null, e.event), h('td', { class: 'detail' }, e.detail || ''), h('td', { class: 'mono' }, e.mac || ''))),
        'Nothing on the timeline yet.'));
  };
  const enc = encodeURIComponent(name);
  return [
    con,
    live({
      load: async (signal) => [await api('/v1/machines/' + enc, { signal })],
      watch: '/v1/watch/machines?name=' + enc, field: 'machine', keyOf: (m) => m.name, onChange: renderMachine,
    }),
    live({
      load: async (signal) => (((await api('/v1/machines/' + enc + '/timeline?limit=500', { signal })) || {}).entries || []),
      watch: '/v1/watch/machines/' + enc + '/timeline?limit=500', field: 'entry', onChange: renderTimeline,
    }),
  ];
}

// ---- the machine's BMC health ----

// renderHealth fills the machine page's BMC health card from the record's
// bmc.health (docs/architecture.md, "Hardware health"): the worst status,
// the sensors as last written, the event log's newest critical entry and
// the machine's bmc-* conditions. Everything the BMC said is text, never
// markup. A machine with no health record has no card.
function renderHealth(card, m) {
  const hl = m.bmc && m.bmc.health;
  const conds = (m.flags || []).filter((f) => f.startsWith('bmc-'));
  if (!hl && !conds.length) { card.hidden = true; card.replaceChildren(); return; }
  card.hidden = false;
  const hs = hl || {};
  const st = hs.status || 'unknown';
  const sensors = (hs.sensors || []).slice().sort((a, b) => String(a.name).localeCompare(String(b.name)));
  const set = (ts) => Boolean(ts) && new Date(ts).getTime() > 0; // a zero timestamp reads as 1970
  const value = (x) => (x.value === undefined || x.value === null ? '—' : String(Math.round(Number(x.value) * 100) / 100) + (x.unit ? ' ' + x.unit : ''));
  card.replaceChildren(
    h('h2', null, 'BMC health ', h('span', { class: 'badge health-' + st, id: 'bmc-health-status' }, st)),
    conds.length ? h('ul', { class: 'conditions' }, conds.map((c) => h('li', null, c))) : null,
    kv([
      ['Changed', set(hs.changedAt) ? when(hs.changedAt) + ' (' + ago(hs.changedAt) + ')' : ''],
      ['Event log', hs.logCriticalId ? ['critical entry #' + hs.logCriticalId + ': ', h('span', { class: 'log-critical' }, hs.logCritical || '')] : (set(hs.logAddedAt) ? 'no critical entry (last added ' + when(hs.logAddedAt) + ')' : 'no critical entry')],
      ['Sensors', hs.dropped ? sensors.length + ' shown, ' + hs.dropped + ' more not kept' : ''],
    ]),
    table('list sensors', ['Sensor', 'Kind', 'Reading', 'Status', 'Threshold'],
      sensors.map((x) => h('tr', { class: 'sensor-' + (x.status || 'ok') },
        h('td', null, x.name || '—'), h('td', null, x.kind || '—'), h('td', null, value(x)),
        h('td', null, x.status || 'ok'), h('td', { class: 'mono' }, x.threshold || '—'))),
      'No sensors read yet.'));
}

// ---- the machine's console ----

// xterm.js is vendored under /assets/xterm/ (docs/architecture.md,
// "Machine consoles"); it is loaded when a console is first opened.
let xtermLoading = null;
function loadXterm() {
  if (!xtermLoading) {
    styleShim();
    xtermLoading = new Promise((resolve, reject) => {
      document.head.append(h('link', { rel: 'stylesheet', href: '/assets/xterm/xterm.css' }));
      const sc = h('script', { src: '/assets/xterm/xterm.js' });
      sc.onload = () => resolve(window.Terminal);
      sc.onerror = () => { xtermLoading = null; reject(new Error('cannot load the terminal')); };
      document.head.append(sc);
    });
  }
  return xtermLoading;
}

// styleShim lets xterm.js style itself under the page's
// Content-Security-Policy (style-src 'self', no inline styles): xterm
// writes its generated rules (cell size, colours) into <style> elements
// it creates, which the policy blocks. From the first console on, a
// <style> the page's scripts create is an inert <template> whose text and
// sheet are a constructed CSSStyleSheet adopted by the document (the
// policy governs markup, not the CSS object model); removing the element
// drops its sheet. The page's own code creates no <style>.
function styleShim() {
  const create = Document.prototype.createElement;
  Document.prototype.createElement = function (tag, opts) {
    if (String(tag).toLowerCase() !== 'style') return create.call(this, tag, opts);
    const el = create.call(this, 'template');
    const sheet = new CSSStyleSheet();
    let text = '';
    const doc = this;
    doc.adoptedStyleSheets = [...doc.adoptedStyleSheets, sheet];
    const set = (v) => { text = String(v); sheet.replaceSync(text); };
    Object.defineProperty(el, 'textContent', { get: () => text, set });
    Object.defineProperty(el, 'innerText', { get: () => text, set });
    Object.defineProperty(el, 'sheet', { get: () => sheet });
    const remove = el.remove.bind(el);
    el.remove = () => { doc.adoptedStyleSheets = doc.adoptedStyleSheets.filter((x) => x !== sheet); remove(); };
    return el;
  };
}

// CONSOLE_CHUNK is the most keys one socket message carries (the
// gateway takes at most 4 KiB a message; a character is up to 4 bytes).
const CONSOLE_CHUNK = 1000;

// consoleCard is a machine's (kind 'machine') or a virtual machine's
// (kind 'vm') console: a Console button (for a role that may attach) that
// opens a terminal, read-only until the operator takes the write seat.
// The output goes to xterm.js only, never into the page's markup. The
// socket answers the appliance's pings (an empty binary message), so it
// is not closed as dead while idle. Its stop() closes the socket and
// disposes of the terminal; close() only closes the socket.
function consoleCard(name, kind) {
  const path = kind === 'vm' ? '/api/vms/' + encodeURIComponent(name) + '/console' : '/api/console/' + encodeURIComponent(name);
  const link = kind === 'vm' ? 'the node' : 'the BMC';
  const state = h('span', { id: 'console-state', class: 'muted' });
  const term = h('div', { id: 'console-term', class: 'console-term', hidden: true });
  const take = h('button', { type: 'button', id: 'console-take', hidden: true }, 'Take write');
  const close = h('button', { type: 'button', id: 'console-close', hidden: true }, 'Close');
  const open = h('button', { type: 'button', id: 'console-open', 'data-action': 'console' }, 'Console');
  const card = h('div', { class: 'card console', 'data-console': kind + '/' + name }, h('h2', null, kind === 'vm' ? 'Console of ' + name : 'Console'),
    h('div', { class: 'console-bar' }, open, take, close, state), term);
  if (!may('console')) {
    open.remove();
    state.textContent = caller && caller.actions && caller.actions.console ? caller.actions.console.refusal : '';
  }
  let xt = null;
  let ws = null;
  let writing = false;
  const say = (text) => { state.textContent = text; };
  const disconnect = () => {
    if (ws) { const w = ws; ws = null; w.onclose = null; w.close(); }
  };
  const connect = (write) => {
    disconnect();
    writing = write;
    take.hidden = write;
    say(write ? 'Taking the write seat…' : 'Attaching read-only…');
    const w = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + path);
    w.binaryType = 'arraybuffer';
    ws = w;
    w.onopen = () => w.send(JSON.stringify({ token: token(), write, take: write }));
    w.onmessage = (ev) => {
      if (ev.data instanceof ArrayBuffer) { xt.write(new Uint8Array(ev.data)); return; }
      let m = null;
      try { m = JSON.parse(ev.data); } catch (e) { return; }
      if (m.error) {
        writing = false;
        say('Console closed: ' + m.error.message + ' (' + m.error.code + ')');
        if (m.error.code === 'PermissionDenied') take.hidden = true;
        return;
      }
      switch (m.event) {
        case 'attached': say('Attached' + (writing ? ', writing.' : ', read-only: take write to type.')); break;
        case 'live': break;
        case 'ping': w.send(new Uint8Array(0)); break;
        case 'write-taken': writing = false; take.hidden = false; say('Read-only: ' + (m.detail || 'another viewer took the write seat') + '.'); break;
        case 'link-down': say('The link to ' + link + ' is down' + (m.detail ? ': ' + m.detail : '') + '; retrying.'); break;
        case 'link-up': say('The link to ' + link + ' is back.'); break;
        default: break;
      }
    };
    w.onclose = () => { if (ws === w) { ws = null; writing = false; take.hidden = false; if (!state.textContent.startsWith('Console closed')) say('Console closed.'); } };
  };
  open.onclick = async () => {
    try {
      const Terminal = await loadXterm();
      if (!xt) {
        xt = new Terminal({ convertEol: false, scrollback: 5000, cols: 100, rows: 30 });
        xt.open(term);
        xt.onData((d) => {
          if (!ws || ws.readyState !== WebSocket.OPEN || !writing) return;
          for (let i = 0; i < d.length; i += CONSOLE_CHUNK) ws.send(d.slice(i, i + CONSOLE_CHUNK));
        });
      }
      term.hidden = false;
      open.hidden = true;
      close.hidden = false;
      connect(false);
      xt.focus();
    } catch (e) {
      say(e.message);
    }
  };
  take.onclick = () => { if (xt) { xt.reset(); connect(true); xt.focus(); } };
  const shut = () => { disconnect(); term.hidden = true; take.hidden = true; close.hidden = true; open.hidden = !may('console'); say('Console closed.'); };
  close.onclick = shut;
  return { card, open: () => open.click(), close() { if (ws) shut(); }, stop() { disconnect(); if (xt) xt.dispose(); } };
}

function meter(used, total, fmt) {
  const u = num(used), t = num(total);
  return h('div', { class: 'capacity' }, h('meter', { min: 0, max: t || 1, value: Math.min(u, t || 1), high: (t || 1) * 0.85 }),
    h('span', null, fmt(u) + ' / ' + fmt(t)));
}

function pageNodes(main) {
  const body = h('div', { class: 'card' }, h('p', { class: 'muted' }, 'Loading…'));
  const count = h('span', { class: 'count' });
  main.replaceChildren(h('div', { class: 'page-head' }, h('h1', null, 'Nodes'), count), body);
  const cpu = (v) => (v / 1000).toFixed(v % 1000 ? 1 : 0) + ' CPU';
  const render = (ns) => {
    ns.sort((a, b) => a.name.localeCompare(b.name));
    count.textContent = ns.length + (ns.length === 1 ? ' node' : ' nodes');
    body.replaceChildren(table('list nodes', ['Name', 'State', 'Address', 'Rack', 'CPU reserved', 'Memory reserved', 'Storage reserved', 'Reservations', 'Heartbeat'],
      ns.map((n) => {
        const comps = Object.values(n.reservedComputes || {});
        const stors = Object.values(n.reservedStorages || {});
        const rc = comps.reduce((a, c) => a + num(c.requestCpuMilliCore), 0);
        const rm = comps.reduce((a, c) => a + num(c.requestMemoryBytes), 0);
        const rs = stors.reduce((a, c) => a + num(c.requestBytes), 0);
        return h('tr', { 'data-name': n.name },
          h('td', null, n.name), h('td', { class: 'state' }, badge(n.state, 'node')), h('td', { class: 'mono' }, n.address || '—'),
          h('td', null, [n.rack, n.unit ? 'U' + n.unit : ''].filter(Boolean).join(' ') || '—'),
          h('td', null, meter(rc, n.cpuMilliCores, cpu)), h('td', null, meter(rm, n.memoryBytes, bytes)), h('td', null, meter(rs, n.storageBytes, bytes)),
          h('td', null, comps.length + ' compute, ' + stors.length + ' storage'),
          h('td', { title: when(n.lastHeartbeat) }, ago(n.lastHeartbeat)));
      }),
      'No nodes: accepted machines join the pool when their hypervisor agent starts.'));
  };
  return [live({
    load: (signal) => readPages('/v1/nodes', 'nodes', signal),
    watch: '/v1/watch/nodes', field: 'node', keyOf: (n) => n.name, onChange: render,
  })];
}

function pageVMs(main) {
  const body = h('div', { class: 'card' }, h('p', { class: 'muted' }, 'Loading…'));
  const count = h('span', { class: 'count' });
  const conSlot = h('div');
  main.replaceChildren(h('div', { class: 'page-head' }, h('h1', null, 'Virtual machines'), count), body, conSlot);
  // One VM console at a time, below the list (its serial port through
  // its node).
  let con = null;
  const showConsole = (vm) => {
    if (con) con.stop();
    con = consoleCard(vm, 'vm');
    conSlot.replaceChildren(con.card);
    con.open();
  };
  const consoleButton = (v) => (may('console') && v.computeNodeName
    ? h('button', { type: 'button', class: 'vm-console', 'data-action': 'console', 'data-vm': v.name, onclick: () => showConsole(v.name) }, 'Console')
    : '—');
  const render = (vs) => {
    vs.sort((a, b) => a.name.localeCompare(b.name));
    count.textContent = vs.length + (vs.length === 1 ? ' VM' : ' VMs');
    body.replaceChildren(table('list vms', ['Name', 'State', 'Node', 'vCPUs', 'Memory', 'Disks', 'NICs', 'Console'],
      vs.map((v) => h('tr', { 'data-name': v.name },
        h('td', null, v.name), h('td', { class: 'state' }, badge(v.state, 'vm')), h('td', null, v.computeNodeName || '—'),
        h('td', null, String(Math.max(1, Math.floor(num(v.limitCpuMilliCore) / 1000)))), h('td', null, bytes(v.limitMemoryBytes)),
        h('td', null, (v.blockStorageNames || []).join(', ') || '—'),
        h('td', { class: 'mono' }, (v.nics || []).map((n) => n.networkName + (n.ipv4Address ? ' ' + n.ipv4Address : '')).join(', ') || '—'),
        h('td', null, consoleButton(v)))),
      'No virtual machines.'));
  };
  return [{ stop() { if (con) con.stop(); } }, live({
    load: (signal) => readPages('/v1/virtual-machines', 'virtualMachines', signal),
    watch: '/v1/watch/virtual-machines', field: 'virtualMachine', keyOf: (v) => v.name, onChange: render,
  })];
}

function pageVolumes(main) {
  const body = h('div', { class: 'card' }, h('p', { class: 'muted' }, 'Loading…'));
  const count = h('span', { class: 'count' });
  main.replaceChildren(h('div', { class: 'page-head' }, h('h1', null, 'Volumes'), count), body);
  const render = (vs) => {
    vs.sort((a, b) => a.name.localeCompare(b.name));
    count.textContent = vs.length + (vs.length === 1 ? ' volume' : ' volumes');
    body.replaceChildren(table('list volumes', ['Name', 'State', 'Node', 'Requested', 'Limit'],
      vs.map((v) => h('tr', { 'data-name': v.name },
        h('td', null, v.name), h('td', { class: 'state' }, badge(v.state, 'vol')), h('td', null, v.nodeName || '—'),
        h('td', null, bytes(v.requestBytes)), h('td', null, bytes(v.limitBytes)))),
      'No volumes.'));
  };
  return [live({
    load: (signal) => readPages('/v1/block-storages', 'blockStorages', signal),
    watch: '/v1/watch/block-storages', field: 'blockStorage', keyOf: (v) => v.name, onChange: render,
  })];
}

// The standby pools page: each pool's spec (selector, min_ready,
// readiness) and its status as the controller last wrote it (ready,
// booted, warming, allocated, deficit, last action, conditions), with a
// row for each of its READY machines and each allocated one the token
// sees, whose state and power the machine watch keeps live. Pools have no
// watch: they are polled.

function readinessText(r) {
  return ({ READINESS_BOOTED: 'booted into discovery', READINESS_POWERED_OFF: 'powered off' })[r] || '—';
}

function pagePools(main) {
  const body = h('div', { class: 'pools' }, h('p', { class: 'muted' }, 'Loading…'));
  const count = h('span', { class: 'count', id: 'pool-count' });
  main.replaceChildren(h('div', { class: 'page-head' }, h('h1', null, 'Standby pools'), count), body);
  let pools = null;
  let machines = null; // by name, once the machine list is read
  const render = () => {
    if (!pools) return;
    pools.sort((a, b) => collator.compare(a.name, b.name));
    count.textContent = pools.length + (pools.length === 1 ? ' pool' : ' pools');
    if (!pools.length) {
      body.replaceChildren(h('div', { class: 'card' }, h('p', { class: 'muted' }, 'No standby pools: corral pool apply -f FILE makes one.')));
      return;
    }
    body.replaceChildren(...pools.map((p) => {
      const st = p.status || {};
      const ready = num(st.ready), target = num(p.minReady);
      const booted = p.readiness === 'READINESS_BOOTED';
      const figures = [
        ['Selector', p.selector ? 'pool=' + p.name + ',' + p.selector : 'pool=' + p.name],
        ['Min ready', String(target)],
        ['Mode', readinessText(p.readiness)],
        ['Ready', String(ready)],
        ['Booted', booted ? String(num(st.booted)) : '—'],
        ['Warming', booted ? String(num(st.warming)) : '—'],
        ['Allocated', String(num(st.allocated))],
        ['Deficit', String(num(st.deficit))],
        ['Last action', st.lastAction ? st.lastAction + ' (' + ago(st.lastActionAt) + ')' : '—'],
        ['Seen', st.observedAt ? ago(st.observedAt) : 'not yet'],
      ];
      // Its READY machines as the controller named them, then the machines
      // of the pool this token sees held (an operator sees every one).
      const names = new Set(st.readyMachines || []);
      if (machines) {
        for (const m of machines.values()) {
          if (m.pool === p.name && m.allocation && m.allocation.owner && !m.allocation.releasedAt) names.add(m.name);
        }
      }
      const rows = [...names].sort(collator.compare).map((n) => {
        const m = (machines && machines.get(n)) || { name: n };
        return h('tr', { 'data-name': n },
          h('td', null, h('a', { href: '#/machines/' + encodeURIComponent(n) }, n)),
          h('td', { class: 'state', title: m.stateReason || '' }, m.state ? badge(m.state) : '…'),
          h('td', { class: 'power' }, h('span', { class: 'power-' + power(m.powerState) }, power(m.powerState))),
          h('td', null, (m.allocation && m.allocation.owner && !m.allocation.releasedAt) ? allocationText(m) : '—'));
      });
      return h('section', { class: 'card pool', 'data-pool': p.name },
        h('h2', null, p.name, ' ', h('span', { class: 'badge ' + (num(st.deficit) ? 'state-FAILED' : 'state-DEPLOYED') }, num(st.deficit) ? 'short ' + num(st.deficit) : 'at target')),
        h('dl', { class: 'figures' }, figures.map(([k, v]) => [h('dt', null, k), h('dd', { 'data-figure': k.toLowerCase().replace(/ /g, '-') }, v)])),
        (st.conditions || []).length ? h('ul', { class: 'conditions' }, st.conditions.map((c) => h('li', null, c))) : null,
        table('list pool-machines', ['Machine', 'State', 'Power', 'Allocated to'], rows,
          num(st.allocated) ? 'No READY machine; the allocated ones are held by other owners.' : 'No machine of the pool is READY or allocated.'));
    }));
  };
  const ctl = new AbortController();
  let stopped = false;
  let timer = null;
  async function poll() {
    try {
      pools = await readPages('/v1/standby-pools', 'pools', ctl.signal);
      render();
    } catch (e) {
      if (stopped) return;
      notice('Standby pools: ' + e.message, 'error');
    }
    if (!stopped) timer = setTimeout(poll, POLL_MS);
  }
  poll();
  return [
    { stop() { stopped = true; ctl.abort(); clearTimeout(timer); } },
    live({
      load: (signal) => readPages(MACHINE_LIST, 'machines', signal),
      watch: MACHINE_WATCH, field: 'machine', keyOf: (m) => m.name,
      onChange: (_list, _changed, byName) => { machines = byName; render(); },
    }),
  ];
}

// ---- routing ----

function route() {
  if (current) current.forEach((l) => l.stop());
  current = null;
  if (!token()) { showLogin(); return; }
  if (!caller) {
    $('main').replaceChildren(h('p', { class: 'muted' }, 'Loading…'));
    loadCaller().then(route, (e) => { if (e.status !== 401) notice('Cannot reach the appliance: ' + e.message, 'error'); });
    return;
  }
  $('nav').hidden = false;
  $('signout').hidden = false;
  const who = $('who');
  who.hidden = !caller.role;
  who.textContent = caller.role;
  who.title = caller.role ? 'Signed in with a ' + caller.role + ' token' : '';
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  const page = parts[0] || 'machines';
  for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.page === page);
  const main = $('main');
  switch (page) {
    case 'machines':
      current = parts[1] ? pageMachine(main, parts[1]) : pageMachines(main);
      break;
    case 'nodes': current = pageNodes(main); break;
    case 'vms': current = pageVMs(main); break;
    case 'volumes': current = pageVolumes(main); break;
    case 'pools': current = pagePools(main); break;
    default: location.hash = '#/machines';
  }
}

document.addEventListener('DOMContentLoaded', () => {
  $('signout').addEventListener('click', () => signOut());
  $('notice-close').addEventListener('click', clearNotice);
  window.addEventListener('hashchange', route);
  route();
});
