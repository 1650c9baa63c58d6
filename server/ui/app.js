// idem web UI: the approval inbox and the saga timeline (docs/server.md,
// "Web UI"). Plain JavaScript, no build step. Every string that comes from a
// spec, arguments, results or reasons is put in the page with textContent
// (the helper `el` below), never parsed as HTML.

// Every saga state of server/openapi.json (SagaState), in its order;
// clients/python/tests/test_vocabulary.py checks the two agree.
const STATES = ['pending', 'running', 'awaiting_approval', 'awaiting_completion', 'succeeded',
  'compensating', 'compensated', 'failed', 'cancelled', 'needs_attention', 'paused', 'open'];
const SETTLED = new Set(['succeeded', 'compensated', 'failed', 'cancelled', 'needs_attention']);
const PAGE = 25;

const $ = (id) => document.getElementById(id);
let me = null;             // the session: {name, roles, csrf_token, may_approve, may_operate}
let countdown = null;      // the inbox's timer
let source = null;         // the open EventSource of a saga page
let page = { offset: 0, more: false };

// An element with text (never HTML) and attributes.
function el(tag, text, attrs) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function show(text) { return typeof text === 'string' ? text : JSON.stringify(text); }

async function api(method, path, body) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (method !== 'GET' && me) headers['X-CSRF-Token'] = me.csrf_token;
  let res;
  try {
    res = await fetch(path, { method, headers, credentials: 'same-origin',
      body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (err) {
    return { status: 0, body: { detail: 'the server did not answer (' + err.message + ')' } };
  }
  let data = null;
  try { data = await res.json(); } catch (_) { data = {}; }
  if (res.status === 401 && path !== '/ui/api/session') signedOut('Your session ended: sign in again.');
  return { status: res.status, body: data };
}

// ---- sign-in

function signedOut(message) {
  me = null;
  if (source) { source.close(); source = null; }
  $('nav').hidden = true;
  $('who').hidden = true;
  showView('signin');
  $('signin-error').textContent = message || '';
  $('signin-token').focus();
}

async function signIn(ev) {
  ev.preventDefault();
  const token = $('signin-token').value;
  const r = await api('POST', '/ui/api/session', { token });
  $('signin-token').value = '';
  if (r.status !== 200) {
    $('signin-error').textContent = r.body.detail || 'Sign-in refused';
    return;
  }
  signedIn(r.body);
  if (!location.hash || location.hash === '#/signin') location.hash = '#/inbox';
  else route();
}

function signedIn(session) {
  me = session;
  $('nav').hidden = false;
  $('who').hidden = false;
  $('who-name').textContent = 'Signed in as ' + me.name + ' (' + me.roles.join(', ') + ')';
}

async function signOut() {
  await api('POST', '/ui/api/session/end', {});
  signedOut('Signed out.');
}

// ---- views

function showView(name) {
  for (const v of ['signin', 'inbox', 'sagas', 'saga']) $('view-' + v).hidden = v !== name;
  for (const [id, v] of [['nav-inbox', 'inbox'], ['nav-sagas', 'sagas']]) {
    if (v === name) $(id).setAttribute('aria-current', 'page');
    else $(id).removeAttribute('aria-current');
  }
}

function route() {
  if (countdown) { clearInterval(countdown); countdown = null; }
  if (source) { source.close(); source = null; }
  if (!me) return signedOut();
  const hash = location.hash || '#/inbox';
  const m = hash.match(/^#\/sagas\/([A-Za-z0-9_-]{1,128})$/);
  if (m) return sagaPage(m[1]);
  if (hash.startsWith('#/sagas')) return sagasPage();
  return inboxPage();
}

// ---- the inbox

function money(changes) {
  if (!changes || typeof changes !== 'object') return '';
  let cents = null, currency = changes.currency || '';
  if (typeof changes.amount_cents === 'number') cents = changes.amount_cents;
  else if (changes.price && typeof changes.price.amount_cents === 'number') {
    cents = changes.price.amount_cents;
    currency = changes.price.currency || currency;
  } else if (typeof changes.amount === 'number') return show(changes.amount) + ' ' + currency;
  if (cents === null) return '';
  return (cents / 100).toFixed(2) + ' ' + currency;
}

function timeLeft(expiresAt) {
  const ms = Date.parse(expiresAt) - Date.now();
  if (!(ms > 0)) return 'expired';
  const s = Math.floor(ms / 1000);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  return (h ? h + ' h ' : '') + m + ' min ' + r + ' s';
}

function whyOf(a) {
  const d = a.model_decision || a.decision || a.why;
  if (!d) return 'no recorded decision';
  if (typeof d === 'string') return d;
  // A recorded model decision (saga/open_saga.h): the model, what it said,
  // else the prompt's hash, so a person sees which call this is.
  const said = d.reasoning || d.reason || d.rationale || d.why ||
      (d.prompt_sha256 ? 'prompt sha256 ' + String(d.prompt_sha256).slice(0, 12) + '…' : '');
  return [d.model, said].filter(Boolean).map(show).join(': ') || show(d);
}

function fillChanges(tbody, changes) {
  tbody.replaceChildren();
  const entries = changes && typeof changes === 'object' ? Object.entries(changes) : [['', changes]];
  for (const [k, v] of entries) {
    const tr = el('tr');
    tr.append(el('th', k, { scope: 'row' }), el('td', show(v)));
    tbody.append(tr);
  }
}

function card(a) {
  const li = $('approval-card').content.firstElementChild.cloneNode(true);
  fillCard(li, a);
  const form = li.querySelector('form.decide');
  form.addEventListener('submit', (ev) => { ev.preventDefault(); decide(li, true); });
  li.querySelector('button.reject').addEventListener('click', () => decide(li, false));
  return li;
}

function fillCard(li, a) {
  li.dataset.token = a.token;
  li.dataset.saga = a.saga_id;
  li.dataset.step = a.step;
  li.dataset.expires = a.expires_at;
  li.querySelector('.title').textContent = a.spec + ': ' + a.step + ' (' + a.tool + ')';
  li.querySelector('.summary').textContent = a.preview ? a.preview.summary : '';
  li.querySelector('.amount').textContent = money(a.preview && a.preview.changes) || '—';
  li.querySelector('.by').textContent = a.requested_by || '—';
  li.querySelector('.key').textContent = a.intent_key || '—';
  li.querySelector('.why').textContent = whyOf(a);
  li.querySelector('.left').textContent = timeLeft(a.expires_at);
  const link = li.querySelector('.saga-link');
  link.textContent = a.saga_id;
  link.setAttribute('href', '#/sagas/' + a.saga_id);
  fillChanges(li.querySelector('.changes tbody'), a.preview && a.preview.changes);
  li.querySelector('.args').textContent = JSON.stringify(a.args, null, 2);
  li.querySelector('.quorum').textContent = quorumText(a);
  const own = a.own === true;
  for (const b of li.querySelectorAll('button')) b.disabled = own || !me.may_approve;
  if (own) li.querySelector('.outcome').textContent = 'You asked for this commit: another person decides.';
  // Someone who may not decide (not the policy's role, or decided already)
  // sees why instead of the buttons.
  const mayNot = li.querySelector('.may-not');
  const refused = !own && a.may_decide === false;
  mayNot.hidden = !refused;
  mayNot.textContent = refused ? 'You may not decide on this commit: ' + (a.why_not || '') : '';
  li.querySelector('form.decide').hidden = refused;
}

// "1 of 2 finance approvals: maria at 12:03" (the policy's rule and the
// approvals so far); "1 approver" for "approval": "human".
function quorumText(a) {
  const p = a.policy || { role: 'approver', quorum: 1, rule: null };
  const got = a.approvals || [];
  if (p.rule === null && got.length === 0) return '1 approver';
  let text = got.length + ' of ' + p.quorum + ' ' + p.role + (p.quorum === 1 ? ' approval' : ' approvals');
  if (got.length) {
    text += ': ' + got.map((g) => g.by + ' at ' + String(g.at || '').slice(11, 16)).join(', ');
  }
  return text;
}

async function inboxPage() {
  showView('inbox');
  const list = $('inbox-list');
  if (!me.may_approve) {
    list.replaceChildren();
    $('inbox-status').textContent = 'Your role (' + me.roles.join(', ') + ') cannot approve commits.';
    return;
  }
  $('inbox-status').textContent = 'Loading…';
  const r = await api('GET', '/ui/api/approvals');
  if (r.status !== 200) {
    $('inbox-status').textContent = r.body.detail || ('error ' + r.status);
    return;
  }
  list.replaceChildren(...r.body.approvals.map(card));
  $('inbox-status').textContent = r.body.approvals.length
    ? r.body.approvals.length + ' commit(s) waiting for a person'
    : 'Nothing waits for a person.';
  countdown = setInterval(() => {
    for (const li of list.children) li.querySelector('.left').textContent = timeLeft(li.dataset.expires);
  }, 1000);
}

async function decide(li, approve) {
  const out = li.querySelector('.outcome');
  const field = approve ? li.querySelector('.note') : li.querySelector('.reason');
  if (!approve && !field.value.trim()) {
    out.textContent = 'A reason is required to reject.';
    field.focus();
    return;
  }
  for (const b of li.querySelectorAll('button')) b.disabled = true;
  out.className = 'outcome';
  out.textContent = approve ? 'Approving…' : 'Rejecting…';
  const token = li.dataset.token;
  const r = await api('POST', '/ui/api/approvals/' + encodeURIComponent(token) +
    (approve ? '/approve' : '/reject'), approve ? { note: field.value } : { reason: field.value });
  if (r.status !== 200) {
    out.className = 'outcome bad';
    out.textContent = 'Refused (' + r.status + '): ' + (r.body.detail || r.body.title || '');
    for (const b of li.querySelectorAll('button')) b.disabled = false;
    return;
  }
  if (approve && r.body.state === 'awaiting_approval') {
    // Counted toward the quorum: the commit waits for another person.
    const again = await api('GET', '/ui/api/approvals');
    const next = again.status === 200 &&
      again.body.approvals.find((x) => x.saga_id === li.dataset.saga && x.step === li.dataset.step);
    if (next && next.token === token) {
      fillCard(li, next);
      out.className = 'outcome ok';
      out.textContent = 'Approved: ' + quorumText(next) + '. The commit waits for another person.';
      return;
    }
  }
  out.textContent = (approve ? 'Approved' : 'Rejected') + '; following the saga…';
  follow(li, token);
}

// Follows the saga after a decision until it settles, or until the same
// step waits again with a new preview (the old one was stale).
async function follow(li, token) {
  const out = li.querySelector('.outcome');
  for (let i = 0; i < 240; i++) {
    const r = await api('GET', '/ui/api/sagas/' + li.dataset.saga);
    if (r.status !== 200) break;
    const saga = r.body;
    const step = saga.steps.find((s) => s.id === li.dataset.step);
    if (saga.state === 'awaiting_approval' && step && step.state === 'awaiting_approval') {
      const again = await api('GET', '/ui/api/approvals');
      const next = again.status === 200 &&
        again.body.approvals.find((a) => a.saga_id === li.dataset.saga && a.step === li.dataset.step);
      if (next && next.token !== token) {
        fillCard(li, next);
        li.querySelector('.note').value = '';
        const stale = li.querySelector('.stale');
        stale.hidden = false;
        stale.textContent = 'The preview was stale: the resource changed before the commit. ' +
          'This is the new preview; decide again.';
        out.className = 'outcome';
        out.textContent = 'New preview waiting for your decision.';
        li.querySelector('button.approve').focus();
        return;
      }
    }
    if (SETTLED.has(saga.state)) {
      out.className = 'outcome ' + (saga.state === 'succeeded' ? 'ok' : 'bad');
      out.textContent = 'Saga ' + saga.state + (saga.reason ? ': ' + saga.reason : '') + '.';
      return;
    }
    out.textContent = 'Saga ' + saga.state + '…';
    await new Promise((res) => setTimeout(res, 500));
  }
  out.textContent = 'Still running: see the saga page.';
}

// ---- the saga list

function ms(input) {
  if (!input.value) return '';
  const t = Date.parse(input.value);
  return Number.isFinite(t) ? String(t) : '';
}

async function sagasPage() {
  showView('sagas');
  const q = new URLSearchParams();
  for (const [name, id] of [['state', 'filter-state'], ['spec', 'filter-spec'], ['intent_key', 'filter-key']]) {
    if ($(id).value) q.set(name, $(id).value);
  }
  if (ms($('filter-since'))) q.set('since', ms($('filter-since')));
  if (ms($('filter-until'))) q.set('until', ms($('filter-until')));
  q.set('offset', String(page.offset));
  q.set('limit', String(PAGE));
  $('sagas-status').textContent = 'Loading…';
  const r = await api('GET', '/ui/api/sagas?' + q.toString());
  const body = $('sagas-body');
  if (r.status !== 200) {
    body.replaceChildren();
    $('sagas-status').textContent = r.body.detail || ('error ' + r.status);
    return;
  }
  body.replaceChildren(...r.body.sagas.map((s) => {
    const tr = el('tr');
    const link = el('a', s.saga_id, { href: '#/sagas/' + s.saga_id });
    const first = el('td');
    first.append(link);
    tr.append(first, el('td', s.spec), el('td', s.state, { class: 'state-' + s.state }),
      el('td', s.intent_key), el('td', s.requested_by), el('td', s.created_at));
    return tr;
  }));
  page.more = r.body.more;
  $('page-prev').disabled = page.offset === 0;
  $('page-next').disabled = !page.more;
  $('page-info').textContent = r.body.sagas.length
    ? 'sagas ' + (page.offset + 1) + '–' + (page.offset + r.body.sagas.length) : '';
  $('sagas-status').textContent = r.body.sagas.length ? '' : 'No saga matches.';
}

// ---- one saga and its live timeline

let current = null;  // {id, last: highest journal seq shown, saga}

function describe(e) {
  const d = e.data || {};
  const bits = [];
  const who = d.by || d.who || d.as;
  if (who) bits.push('by ' + show(who));
  for (const k of ['note', 'reason', 'error', 'summary', 'decision', 'code']) {
    if (d[k] !== undefined && d[k] !== null && d[k] !== '') bits.push(k + ': ' + show(d[k]));
  }
  for (const k of ['external_ref', 'key', 'attempt']) {
    if (d[k] !== undefined && d[k] !== null && d[k] !== '') bits.push(k + ' ' + show(d[k]));
  }
  return bits.join(' · ');
}

function addEntry(e) {
  if (!current || e.seq <= current.last) return;
  current.last = e.seq;
  const li = el('li', null, { 'data-seq': String(e.seq), 'data-event': e.event });
  li.append(el('span', e.at + ' ', { class: 'when' }),
    el('span', (e.step ? e.step + ': ' : '') + e.event, { class: 'event' }));
  const text = describe(e);
  if (text) li.append(el('div', text, { class: 'detail' }));
  $('timeline').append(li);
}

function renderSaga(s) {
  current.saga = s;
  $('saga-title').textContent = 'Saga ' + s.saga_id;
  const facts = $('saga-facts');
  facts.replaceChildren();
  for (const [k, v] of [['Spec', s.spec + (s.spec_version ? ' v' + s.spec_version : ' (inline)')],
    ['Description', s.description], ['State', s.state], ['Intent key', s.intent_key],
    ['Asked by', s.requested_by], ['Created', s.created_at], ['Updated', s.updated_at],
    ['Input', JSON.stringify(s.input)]]) {
    facts.append(el('dt', k), el('dd', v || '—', k === 'State' ? { class: 'state-' + v, id: 'saga-state' } : {}));
  }
  const attention = s.state === 'needs_attention';
  $('saga-attention').hidden = !attention && !s.reason;
  $('saga-attention-title').textContent = attention ? 'Needs attention' : 'Reason';
  $('saga-reason').textContent = (s.park_code ? '[' + s.park_code + '] ' : '') + (s.reason || '');
  const operate = me.may_operate;
  $('saga-actions').hidden = !operate || SETTLED.has(s.state) && !attention;
  $('act-resolve').hidden = !attention;
  $('act-pause').hidden = s.state === 'paused';
  $('act-resume').hidden = s.state !== 'paused' && !attention;
  const steps = $('steps-body');
  steps.replaceChildren(...s.steps.map((st) => {
    const tr = el('tr');
    tr.append(el('td', st.id), el('td', st.tool), el('td', st.state, { class: 'state-' + st.state }),
      el('td', st.attempts), el('td', st.external_ref || ''));
    return tr;
  }));
  $('effects-body').replaceChildren(...s.effects.map((f) => {
    const tr = el('tr');
    tr.append(el('td', f.step), el('td', f.kind), el('td', f.tool), el('td', f.external_ref || ''),
      el('td', f.at || ''));
    return tr;
  }));
}

let refetch = null;
function scheduleRefetch() {
  if (refetch) return;
  refetch = setTimeout(async () => {
    refetch = null;
    if (!current) return;
    const r = await api('GET', '/ui/api/sagas/' + current.id);
    if (r.status === 200 && current && r.body.saga_id === current.id) renderSaga(r.body);
  }, 150);
}

async function sagaPage(id) {
  showView('saga');
  current = { id, last: 0, saga: null };
  $('timeline').replaceChildren();
  $('saga-status').textContent = 'Loading…';
  const r = await api('GET', '/ui/api/sagas/' + id);
  if (r.status !== 200) {
    $('saga-status').textContent = r.body.detail || ('error ' + r.status);
    return;
  }
  $('saga-status').textContent = '';
  renderSaga(r.body);
  for (const e of r.body.journal) addEntry(e);
  source = new EventSource('/ui/api/sagas/' + id + '/events?after=' + current.last);
  source.addEventListener('open', () => { $('live').textContent = '(live)'; });
  source.addEventListener('error', () => { $('live').textContent = '(reconnecting)'; });
  source.addEventListener('journal', (ev) => {
    try { addEntry(JSON.parse(ev.data)); } catch (_) { return; }
    scheduleRefetch();
  });
  source.addEventListener('end', () => { source.close(); signedOut('Your session ended: sign in again.'); });
}

// ---- operator actions, each confirmed in a dialog

const ACTIONS = {
  cancel: { title: 'Cancel this saga?', text: 'Completed steps are rolled back in reverse order.', reason: 'Reason' },
  pause: { title: 'Pause this saga?', text: 'It stops after the step in progress until resumed.', reason: 'Reason' },
  resume: { title: 'Resume this saga?', text: 'Its drive goes on where it stopped.', reason: 'Reason' },
  resolve: { title: 'Resolve a parked step?', text: 'Record what happened to the step; the saga goes on from your decision.', reason: 'Note' },
};
let opener = null;

function openAction(name, button) {
  const a = ACTIONS[name];
  opener = button;
  const dlg = $('confirm');
  dlg.dataset.action = name;
  $('confirm-title').textContent = a.title;
  $('confirm-text').textContent = a.text;
  $('confirm-reason-label').textContent = a.reason;
  $('confirm-reason').value = '';
  $('confirm-error').textContent = '';
  $('confirm-go').textContent = 'Confirm ' + name;
  $('confirm-resolve').hidden = name !== 'resolve';
  if (name === 'resolve') {
    const sel = $('confirm-step');
    sel.replaceChildren(...current.saga.steps
      .filter((s) => s.state === 'needs_attention' || s.state === 'compensation_failed' || s.state === 'unknown')
      .map((s) => el('option', s.id + ' (' + s.state + ')', { value: s.id })));
  }
  dlg.showModal();
  $('confirm-reason').focus();
}

async function confirmAction(ev) {
  ev.preventDefault();
  const dlg = $('confirm');
  const name = dlg.dataset.action;
  let body;
  if (name === 'resolve') {
    body = { step: $('confirm-step').value, decision: $('confirm-decision').value };
    if ($('confirm-reason').value) body.note = $('confirm-reason').value;
    if ($('confirm-result').value.trim()) {
      try { body.result = JSON.parse($('confirm-result').value); } catch (err) {
        $('confirm-error').textContent = 'Result: not JSON (' + err.message + ')';
        return;
      }
    }
  } else {
    body = $('confirm-reason').value ? { reason: $('confirm-reason').value } : {};
  }
  const r = await api('POST', '/ui/api/sagas/' + current.id + '/' + name, body);
  if (r.status !== 200 && r.status !== 202) {
    $('confirm-error').textContent = 'Refused (' + r.status + '): ' + (r.body.detail || '');
    return;
  }
  dlg.close();
  $('saga-status').textContent = name + (r.status === 202 ? ': recorded; the driving process carries it out' : ': done');
  scheduleRefetch();
  if (opener) opener.focus();
}

// ---- start

function start() {
  const sel = $('filter-state');
  for (const s of STATES) sel.append(el('option', s, { value: s }));
  $('signin-form').addEventListener('submit', signIn);
  $('sign-out').addEventListener('click', signOut);
  $('inbox-refresh').addEventListener('click', route);
  $('saga-filter').addEventListener('submit', (ev) => { ev.preventDefault(); page.offset = 0; sagasPage(); });
  $('page-prev').addEventListener('click', () => { page.offset = Math.max(0, page.offset - PAGE); sagasPage(); });
  $('page-next').addEventListener('click', () => { page.offset += PAGE; sagasPage(); });
  for (const b of document.querySelectorAll('#saga-actions button')) {
    b.addEventListener('click', () => openAction(b.dataset.action, b));
  }
  $('confirm-form').addEventListener('submit', confirmAction);
  $('confirm-back').addEventListener('click', () => { $('confirm').close(); if (opener) opener.focus(); });
  window.addEventListener('hashchange', route);
  api('GET', '/ui/api/session').then((r) => {
    if (r.status === 200) { signedIn(r.body); route(); } else signedOut();
  });
}

start();
