// The web UI (/ui) in a real browser: Debian's chromium, headless, driven by
// playwright-core (tests/ui/package-lock.json; no browser is downloaded),
// against a real `idem serve` on loopback with the travel example's HTTP
// providers (travel-providers) and an auth file made here.
//
//   node ui_test.mjs IDEM TRAVEL_PROVIDERS SOURCE_DIR SCREENSHOT_DIR
//
// The payment step is two-phase with a person's approval. The providers
// reprice the payment's resource on the 2nd commit (--fault
// payments.charge=reprice@2), so the 2nd approved commit is stale: idem
// previews again and asks again; and they lose the answer to the 7th car
// rental (cars.rent=lose_response@7: no key, no status lookup), so that
// saga needs attention and an operator resolves it. The checks run in order (commits are
// counted) and each prints `ok N - name` (TAP); the first failure ends the
// run with exit 1. Screenshots of the inbox and a timeline go to
// SCREENSHOT_DIR (printed).

import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

const [IDEM, PROVIDERS, ROOT, SHOTS] = process.argv.slice(2).map((a) => path.resolve(a));
if (process.argv.length !== 6) {
  console.error('usage: node ui_test.mjs IDEM TRAVEL_PROVIDERS SOURCE_DIR SCREENSHOT_DIR');
  process.exit(2);
}
const CHROMIUM = process.env.IDEM_CHROMIUM || '/usr/bin/chromium';
const WORK = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-ui-test-'));
const children = [];
let browser = null;
let checks = 0;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
    s.on('error', reject);
  });
}

function start(bin, args, log) {
  const out = fs.openSync(path.join(WORK, log), 'w');
  const child = spawn(bin, args, { cwd: WORK, stdio: ['ignore', out, out] });
  children.push(child);
  return child;
}

async function waitHttp(url) {
  for (let i = 0; i < 200; i++) {
    try { if ((await fetch(url)).ok) return; } catch (_) { /* not yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('no answer from ' + url);
}

function expect(cond, what) { if (!cond) throw new Error('expected ' + what); }
function has(text, part, what) { expect(String(text).includes(part), `${what}: "${part}" in "${text}"`); }

async function check(name, fn) {
  checks += 1;
  try {
    await fn();
    console.log(`ok ${checks} - ${name}`);
  } catch (err) {
    console.log(`not ok ${checks} - ${name}\n# ${String(err && err.stack || err).split('\n').join('\n# ')}`);
    throw err;
  }
}

async function cleanup(rc) {
  if (browser) await browser.close().catch(() => {});
  for (const c of children) { try { c.kill('SIGTERM'); } catch (_) { /* gone */ } }
  await new Promise((r) => setTimeout(r, 300));
  if (rc !== 0) {
    for (const f of ['server.log', 'providers.log']) {
      const p = path.join(WORK, f);
      if (fs.existsSync(p)) {
        console.log(`# ---- last lines of ${f}`);
        for (const l of fs.readFileSync(p, 'utf8').split('\n').slice(-25)) console.log('# ' + l);
      }
    }
  }
  fs.rmSync(WORK, { recursive: true, force: true });
  process.exit(rc);
}

// ---- the server and its callers

const sha = (t) => createHash('sha256').update(t).digest('hex');
const tokens = {};
for (const n of ['agent', 'maria', 'ops', 'sam', 'lea', 'noor']) tokens[n] = randomBytes(32).toString('hex');
fs.writeFileSync(path.join(WORK, 'auth.json'), JSON.stringify([
  { name: 'agent-1', token_sha256: sha(tokens.agent), roles: ['agent'] },
  { name: 'maria', token_sha256: sha(tokens.maria), roles: ['approver'] },
  { name: 'ops', token_sha256: sha(tokens.ops), roles: ['operator', 'approver'] },
  { name: 'sam', token_sha256: sha(tokens.sam), roles: ['agent', 'approver'] },
  // An approval policy's role (finance): two people for the largest payments.
  { name: 'lea', token_sha256: sha(tokens.lea), roles: ['finance'] },
  { name: 'noor', token_sha256: sha(tokens.noor), roles: ['finance', 'approver'] },
]), { mode: 0o600 });

const PPORT = await freePort();
const SPORT = await freePort();
const BASE = `http://127.0.0.1:${SPORT}`;
const toolsText = fs.readFileSync(path.join(ROOT, 'examples/travel_booking/tools.http.json'), 'utf8')
  .replaceAll('http://127.0.0.1:8091', `http://127.0.0.1:${PPORT}`);
fs.writeFileSync(path.join(WORK, 'tools.json'), toolsText);
const trip = JSON.parse(fs.readFileSync(path.join(ROOT, 'examples/travel_booking/trip.json'), 'utf8'));
const input = JSON.parse(fs.readFileSync(path.join(ROOT, 'examples/travel_booking/input.json'), 'utf8'));

async function rest(method, p, token, body, extra) {
  const res = await fetch(BASE + p, {
    method,
    headers: { Authorization: 'Bearer ' + token, 'Content-Type': 'application/json', ...(extra || {}) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: res.status, body: await res.json().catch(() => ({})) };
}

async function submit(who, key, spec, inp) {
  const r = await rest('POST', '/v1/sagas', tokens[who], { spec, input: inp }, { 'Idempotency-Key': key });
  expect(r.status === 201, `201 for saga ${key}, got ${r.status} ${JSON.stringify(r.body)}`);
  return r.body.saga_id;
}

async function sagaState(id, who = 'agent') {
  return (await rest('GET', '/v1/sagas/' + id, tokens[who])).body.state;
}

async function waitState(id, want, who = 'agent') {
  let s;
  for (let i = 0; i < 300; i++) {
    s = await sagaState(id, who);
    if (s === want) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`saga ${id}: state ${s}, expected ${want}`);
}

// Reads the event stream of `id` from after `after` (Last-Event-ID) and
// answers the first event's id.
function firstEventId(cookie, id, after) {
  return new Promise((resolve, reject) => {
    const req = http.get(`${BASE}/ui/api/sagas/${id}/events`,
      { headers: { Cookie: cookie, 'Last-Event-ID': String(after), Accept: 'text/event-stream' } }, (res) => {
        if (res.statusCode !== 200) { reject(new Error('events: HTTP ' + res.statusCode)); res.resume(); return; }
        let buf = '';
        res.on('data', (d) => {
          buf += d;
          const m = buf.match(/^id: (\d+)$/m);
          if (m) { resolve(Number(m[1])); req.destroy(); }
        });
      });
    req.on('error', (e) => { if (e.code !== 'ECONNRESET') reject(e); });
    setTimeout(() => { req.destroy(); reject(new Error('no event within 10 s')); }, 10000);
  });
}

// ---- the browser

async function signedInPage(who) {
  const ctx = await browser.newContext({ viewport: { width: 1200, height: 900 } });
  const page = await ctx.newPage();
  page.on('pageerror', (e) => console.log('# page error: ' + e.message));
  await page.goto(BASE + '/ui');
  await page.getByLabel('Bearer token').fill(tokens[who]);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#who-name').waitFor({ state: 'visible' });
  return page;
}

const card = (page, id) => page.locator(`#inbox-list li[data-saga="${id}"]`);

async function main() {
  fs.mkdirSync(SHOTS, { recursive: true });
  console.log('# screenshots: ' + path.resolve(SHOTS));
  start(PROVIDERS, ['--listen', `127.0.0.1:${PPORT}`, '--ledger', path.join(WORK, 'ledger.sqlite'),
    '--fault', 'payments.charge=reprice@2', '--fault', 'cars.rent=lose_response@7'], 'providers.log');
  await waitHttp(`http://127.0.0.1:${PPORT}/healthz`);
  start(IDEM, ['--store', path.join(WORK, 'journal.db'), 'serve', '--listen', `127.0.0.1:${SPORT}`,
    '--auth', path.join(WORK, 'auth.json'), '--tools', path.join(WORK, 'tools.json'), '--workers', '2'],
  'server.log');
  await waitHttp(BASE + '/healthz');

  const evil = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>';
  const evilSpec = { ...trip, description: 'Evil ' + evil };
  // One after another, each waiting before the next is submitted: the inbox
  // orders by when a commit began to wait, and two workers driving sagas
  // submitted together may bring them there in either order.
  const sagas = {};
  const submitAndWait = async (name, who, key, spec, body) => {
    sagas[name] = await submit(who, key, spec, body);
    await waitState(sagas[name], 'awaiting_approval', who);
  };
  await submitAndWait('approve', 'agent', 'ana-approve', trip, { ...input, amount_cents: 111100 });
  await submitAndWait('reject', 'agent', 'bob-reject', trip, { ...input, traveller: 'Bob', amount_cents: 222200 });
  await submitAndWait('stale', 'agent', 'cy-stale', trip, { ...input, traveller: 'Cy', amount_cents: 333300 });
  await submitAndWait('evil', 'agent', 'evil-' + evil, evilSpec, { ...input, traveller: evil, amount_cents: 444400 });
  await submitAndWait('keyboard', 'agent', 'kim-keys', trip, { ...input, traveller: 'Kim', amount_cents: 555500 });
  await submitAndWait('own', 'sam', 'sam-own', trip, { ...input, traveller: 'Sam', amount_cents: 666600 });

  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    // A fresh, empty --user-data-dir: playwright makes one per launch (it
    // refuses the flag in args) and removes it at close.
  });

  await check('the page is served with a strict policy, the session cookie is HttpOnly and SameSite=Strict', async () => {
    const page = await fetch(BASE + '/ui');
    expect(page.status === 200, '/ui 200');
    expect(page.headers.get('content-type') === 'text/html; charset=utf-8', 'text/html');
    const csp = page.headers.get('content-security-policy') || '';
    expect(csp.includes("script-src 'self'") && csp.includes("frame-ancestors 'none'") &&
      !csp.includes('unsafe-inline'), 'a strict CSP, got ' + csp);
    expect(page.headers.get('x-content-type-options') === 'nosniff', 'nosniff');
    const js = await fetch(BASE + '/ui/app.js');
    expect(js.headers.get('content-type') === 'text/javascript; charset=utf-8', 'a JavaScript type');
    const html = await page.text();
    expect(!/<script(?![^>]*\bsrc=)[^>]*>/.test(html), 'no inline script in index.html');
    const bad = await fetch(BASE + '/ui/api/session', { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ token: 'not-a-token' }) });
    expect(bad.status === 401, 'a wrong token is refused 401');
    const good = await fetch(BASE + '/ui/api/session', { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ token: tokens.maria }) });
    const cookie = good.headers.get('set-cookie') || '';
    expect(good.status === 200 && /HttpOnly/.test(cookie) && /SameSite=Strict/.test(cookie) && /Path=\//.test(cookie),
      'the session cookie, got ' + cookie);
    const bearer = await fetch(BASE + '/ui/api/approvals', { headers: { Authorization: 'Bearer ' + tokens.maria } });
    expect(bearer.status === 401, 'the UI API takes no bearer token');
    const v1cookie = await fetch(BASE + '/v1/approvals', { headers: { Cookie: cookie.split(';')[0] } });
    expect(v1cookie.status === 401, 'the /v1 API takes no cookie');
  });

  const maria = await signedInPage('maria');
  await check('an approver signs in and sees every waiting commit, newest first, with its preview', async () => {
    await card(maria, sagas.keyboard).waitFor();
    const order = await maria.locator('#inbox-list li').evaluateAll((els) => els.map((e) => e.dataset.saga));
    expect(order.length === 6, '6 cards, got ' + order.length);
    expect(order[0] === sagas.own && order[5] === sagas.approve, 'newest first: ' + order.join(' '));
    const c = card(maria, sagas.approve);
    has(await c.locator('.summary').textContent(), 'charge EUR 1,111.00 to Ana', 'the summary');
    has(await c.locator('.amount').textContent(), '1111.00 EUR', 'the amount');
    expect((await c.locator('.by').textContent()) === 'agent-1', 'who asked');
    expect(/\d+ min \d+ s/.test(await c.locator('.left').textContent()), 'the time left');
    expect((await c.locator('.changes').textContent()).includes('amount_cents'), 'the structured changes');
    expect((await c.locator('.args').textContent()).includes('"traveller": "Ana"'), 'the arguments');
    await maria.screenshot({ path: path.join(SHOTS, 'inbox.png'), fullPage: true });
  });

  await check('a request without the CSRF token, or with a wrong one, is refused 403 and changes nothing', async () => {
    const token = await card(maria, sagas.evil).getAttribute('data-token');
    const r = await maria.evaluate(async (t) => {
      const out = [];
      for (const h of [{}, { 'X-CSRF-Token': 'f'.repeat(64) }]) {
        const res = await fetch('/ui/api/approvals/' + t + '/approve', { method: 'POST',
          headers: { 'Content-Type': 'application/json', ...h }, body: '{"note":"x"}' });
        out.push([res.status, (await res.json()).type]);
      }
      return out;
    }, token);
    for (const [status, type] of r) {
      expect(status === 403 && type === 'urn:idem:problem:csrf-token-invalid', 'csrf 403, got ' + status + ' ' + type);
    }
    await new Promise((res) => setTimeout(res, 500));
    expect(await sagaState(sagas.evil) === 'awaiting_approval', 'the saga still waits');
  });

  await check('spec and argument strings holding HTML or script are shown as text, and no script runs', async () => {
    const c = card(maria, sagas.evil);
    expect((await c.locator('.summary').textContent()).includes('<script>window.__xss=2</script>'), 'the summary as text');
    expect((await c.locator('.args').textContent()).includes('<img src=x onerror='), 'the arguments as text');
    expect((await c.locator('.key').textContent()).includes('<img'), 'the intent key as text');
    expect(await maria.locator('#inbox-list img, #inbox-list script').count() === 0, 'no element made of them');
    await maria.goto(BASE + '/ui#/sagas/' + sagas.evil);
    await maria.locator('#saga-facts dd', { hasText: 'Evil <img' }).waitFor();
    expect(await maria.locator('#view-saga img, #view-saga script').count() === 0, 'no element on the saga page');
    expect(await maria.evaluate(() => window.__xss) === undefined, 'no script ran');
    await maria.goto(BASE + '/ui#/inbox');
    await card(maria, sagas.approve).waitFor();
  });

  await check('an approver approves a payment with a note, the live timeline follows, and the saga succeeds', async () => {
    const watcher = await (await maria.context()).newPage();
    await watcher.goto(BASE + '/ui#/sagas/' + sagas.approve);
    await watcher.locator('#live', { hasText: '(live)' }).waitFor();
    const before = await watcher.locator('#timeline li').count();
    const c = card(maria, sagas.approve);
    await c.locator('.note').fill('ok for Ana');
    await c.getByRole('button', { name: 'Approve' }).click();
    await c.locator('.outcome', { hasText: 'Saga succeeded' }).waitFor({ timeout: 30000 });
    expect(await sagaState(sagas.approve) === 'succeeded', 'succeeded in the API');
    // The other page saw it through server-sent events, without a reload.
    await watcher.locator('#timeline li[data-event="approved"], #timeline li[data-event="approval_granted"], #timeline li', { hasText: 'ok for Ana' }).first().waitFor({ timeout: 15000 });
    await watcher.locator('#saga-state', { hasText: 'succeeded' }).waitFor({ timeout: 15000 });
    expect(await watcher.locator('#timeline li').count() > before, 'new timeline entries');
    expect(await watcher.locator('#effects-body tr').count() === 4, 'four effects with their references');
    await watcher.close();
  });

  await check('an approver rejects a payment with a reason and sees the rollback in the timeline', async () => {
    const c = card(maria, sagas.reject);
    await c.getByRole('button', { name: 'Reject' }).click();
    await c.locator('.outcome', { hasText: 'reason is required' }).waitFor();
    await c.locator('.reason').fill('Bob cancelled his trip');
    await c.getByRole('button', { name: 'Reject' }).click();
    await c.locator('.outcome', { hasText: 'Saga compensated' }).waitFor({ timeout: 30000 });
    await maria.goto(BASE + '/ui#/sagas/' + sagas.reject);
    await maria.locator('#timeline li', { hasText: 'Bob cancelled his trip' }).first().waitFor();
    const compensated = maria.locator('#timeline li[data-event="compensated"]');
    await compensated.first().waitFor();
    expect(await compensated.count() === 3, 'three compensations (flight, hotel, car), got ' + await compensated.count());
    await maria.locator('#saga-state', { hasText: 'compensated' }).waitFor();
    await maria.screenshot({ path: path.join(SHOTS, 'timeline.png'), fullPage: true });
    await maria.goto(BASE + '/ui#/inbox');
    await card(maria, sagas.stale).waitFor();
  });

  await check('a stale preview shows the new preview and asks again', async () => {
    const c = card(maria, sagas.stale);
    const first = await c.getAttribute('data-token');
    await c.getByRole('button', { name: 'Approve' }).click();
    await c.locator('.stale', { hasText: 'stale' }).waitFor({ timeout: 30000 });
    const second = await c.getAttribute('data-token');
    expect(second !== first, 'a new commit token');
    expect(await sagaState(sagas.stale) === 'awaiting_approval', 'the saga waits again');
    await c.getByRole('button', { name: 'Approve' }).click();
    await c.locator('.outcome', { hasText: 'Saga succeeded' }).waitFor({ timeout: 30000 });
  });

  await check('keyboard only: Tab to a commit and approve it with Enter', async () => {
    await maria.goto(BASE + '/ui#/sagas');
    await maria.goto(BASE + '/ui#/inbox');
    await card(maria, sagas.keyboard).waitFor();
    await maria.locator('body').focus();
    let found = false;
    for (let i = 0; i < 120 && !found; i++) {
      await maria.keyboard.press('Tab');
      found = await maria.evaluate((id) => {
        const a = document.activeElement;
        return !!a && a.classList.contains('approve') && a.closest('li').dataset.saga === id;
      }, sagas.keyboard);
    }
    expect(found, 'Tab reaches the Approve button');
    const outline = await maria.evaluate(() => getComputedStyle(document.activeElement).outlineStyle);
    expect(outline !== 'none', 'a visible focus');
    await maria.keyboard.press('Enter');
    await card(maria, sagas.keyboard).locator('.outcome', { hasText: 'Saga succeeded' }).waitFor({ timeout: 30000 });
  });

  await check('nobody approves a saga of their own', async () => {
    const sam = await signedInPage('sam');
    const c = card(sam, sagas.own);
    await c.waitFor();
    expect(await c.getByRole('button', { name: 'Approve' }).isDisabled(), 'its buttons are disabled');
    const token = await c.getAttribute('data-token');
    const r = await sam.evaluate(async (t) => {
      const s = await (await fetch('/ui/api/session')).json();
      const res = await fetch('/ui/api/approvals/' + t + '/approve', { method: 'POST',
        headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': s.csrf_token }, body: '{}' });
      return [res.status, (await res.json()).type];
    }, token);
    expect(r[0] === 403 && r[1] === 'urn:idem:problem:self-approval', 'self-approval 403, got ' + r);
    expect(await sagaState(sagas.own, 'sam') === 'awaiting_approval', 'the saga still waits');
    await sam.context().close();
  });

  await check("an agent's session cannot approve", async () => {
    const agent = await signedInPage('agent');
    await agent.locator('#inbox-status', { hasText: 'cannot approve' }).waitFor();
    const token = (await rest('GET', '/v1/approvals', tokens.maria)).body.approvals
      .find((a) => a.saga_id === sagas.evil).token;
    const r = await agent.evaluate(async (t) => {
      const s = await (await fetch('/ui/api/session')).json();
      const res = await fetch('/ui/api/approvals/' + t + '/approve', { method: 'POST',
        headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': s.csrf_token }, body: '{}' });
      return [res.status, (await res.json()).type];
    }, token);
    expect(r[0] === 403 && r[1] === 'urn:idem:problem:forbidden', 'forbidden 403, got ' + r);
    expect(await sagaState(sagas.evil) === 'awaiting_approval', 'the saga still waits');
    // Its own sagas only, in the list.
    await agent.goto(BASE + '/ui#/sagas');
    await agent.locator('#sagas-body tr').first().waitFor();
    expect(await agent.locator('#sagas-body tr', { hasText: 'sam-own' }).count() === 0, "not sam's saga");
    await agent.context().close();
  });

  await check('the saga list filters by state, spec and intent key, and pages', async () => {
    const ops = await signedInPage('ops');
    await ops.goto(BASE + '/ui#/sagas');
    await ops.locator('#sagas-body tr').first().waitFor();
    expect(await ops.locator('#sagas-body tr').count() === 6, 'six sagas');
    await ops.getByLabel('State').selectOption('succeeded');
    await ops.getByRole('button', { name: 'Show' }).click();
    await ops.waitForFunction(() => document.querySelectorAll('#sagas-body tr').length === 3);
    await ops.getByLabel('State').selectOption('');
    await ops.getByLabel('Intent key').fill('bob');
    await ops.getByRole('button', { name: 'Show' }).click();
    await ops.waitForFunction(() => document.querySelectorAll('#sagas-body tr').length === 1);
    await ops.getByLabel('Intent key').fill('');
    await ops.getByLabel('Spec').fill('no-such-spec');
    await ops.getByRole('button', { name: 'Show' }).click();
    await ops.locator('#sagas-status', { hasText: 'No saga matches' }).waitFor();
    const paged = await ops.evaluate(async () => (await (await fetch('/ui/api/sagas?limit=4&offset=4')).json()));
    expect(paged.sagas.length === 2 && paged.more === false, 'page 2 of 4: 2 sagas');
    await ops.context().close();
  });

  await check('an operator cancels a saga after a confirmation step', async () => {
    const ops = await signedInPage('ops');
    await ops.goto(BASE + '/ui#/sagas/' + sagas.evil);
    await ops.getByRole('button', { name: 'Cancel…' }).click();
    await ops.getByRole('dialog').waitFor();
    await ops.getByRole('button', { name: 'Back' }).click();
    await new Promise((r) => setTimeout(r, 500));
    expect(await sagaState(sagas.evil) === 'awaiting_approval', 'Back changes nothing');
    await ops.getByRole('button', { name: 'Cancel…' }).click();
    await ops.getByRole('dialog').getByLabel('Reason').fill('test cancel');
    await ops.getByRole('button', { name: 'Confirm cancel' }).click();
    await ops.locator('#saga-state', { hasText: /cancelled|compensated/ }).waitFor({ timeout: 30000 });
    await ops.context().close();
  });

  await check('a saga that needs attention shows the reason, and an operator resolves it after confirming', async () => {
    const parked = await submit('agent', 'dee-parked', trip, { ...input, traveller: 'Dee' });
    await waitState(parked, 'needs_attention');
    const ops = await signedInPage('ops');
    await ops.goto(BASE + '/ui#/sagas/' + parked);
    await ops.locator('#saga-attention-title', { hasText: 'Needs attention' }).waitFor();
    has(await ops.locator('#saga-reason').textContent(), 'rent_car', 'the reason names the step');
    for (const name of ['Resolve a step…', 'Cancel…', 'Pause…', 'Resume…']) {
      expect(await ops.getByRole('button', { name }).isVisible(), name + ' offered');
    }
    await ops.getByRole('button', { name: 'Resolve a step…' }).click();
    const dialog = ops.getByRole('dialog');
    await dialog.getByLabel('Step').selectOption('rent_car');
    await dialog.getByLabel('Decision').selectOption('not_applied');
    await dialog.getByLabel('Note').fill('the car desk has no rental for Dee');
    await dialog.getByRole('button', { name: 'Confirm resolve' }).click();
    await ops.locator('#saga-state', { hasText: 'compensated' }).waitFor({ timeout: 30000 });
    await ops.locator('#timeline li', { hasText: 'the car desk has no rental for Dee' }).first().waitFor();
    await ops.context().close();
  });

  await check('the event stream resumes after Last-Event-ID', async () => {
    const r = await fetch(BASE + '/ui/api/session', { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ token: tokens.maria }) });
    const cookie = r.headers.get('set-cookie').split(';')[0];
    const saga = await (await fetch(BASE + '/ui/api/sagas/' + sagas.approve, { headers: { Cookie: cookie } })).json();
    const seqs = saga.journal.map((e) => e.seq);
    expect(await firstEventId(cookie, sagas.approve, 0) === seqs[0], 'from the start');
    expect(await firstEventId(cookie, sagas.approve, seqs[2]) === seqs[3], 'after the third entry');
  });

  await check('sign-out ends the session', async () => {
    await maria.goto(BASE + '/ui#/inbox');
    await maria.getByRole('button', { name: 'Sign out' }).click();
    await maria.getByLabel('Bearer token').waitFor();
    const status = await maria.evaluate(async () => (await fetch('/ui/api/session')).status);
    expect(status === 401, 'no session after sign-out, got ' + status);
  });

  await check('readable on a phone: the inbox fits a 390 px wide screen', async () => {
    const ctx = await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true });
    const page = await ctx.newPage();
    await page.goto(BASE + '/ui');
    await page.getByLabel('Bearer token').fill(tokens.ops);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.locator('#inbox-list li').first().waitFor();
    const wide = await page.evaluate(() => document.documentElement.scrollWidth);
    expect(wide <= 390, 'no horizontal scroll, width ' + wide);
    await page.screenshot({ path: path.join(SHOTS, 'inbox-phone.png'), fullPage: true });
    await ctx.close();
  });

  await check('two finance people approve a large payment in turn: the first is counted, the second commits', async () => {
    const quorumTrip = JSON.parse(JSON.stringify(trip));
    quorumTrip.steps.find((st) => st.id === 'charge_payment').approval = { rules: [
      { when: 'preview.changes.amount_cents <= 10000', pass: 'at or below EUR 100.00' },
      { role: 'finance', quorum: 2 }] };
    const id = await submit('agent', 'eve-two-person', quorumTrip, { ...input, traveller: 'Eve', amount_cents: 777700 });
    await waitState(id, 'awaiting_approval');
    // Someone without the role sees why, in place of the buttons.
    const ops = await signedInPage('ops');
    const oc = card(ops, id);
    await oc.waitFor();
    has(await oc.locator('.quorum').textContent(), '0 of 2 finance approvals', 'the policy on the card');
    has(await oc.locator('.may-not').textContent(), 'does not hold the role finance', 'why ops may not decide');
    expect(!(await oc.locator('button.approve').isVisible()), 'no Approve button for ops');
    await ops.context().close();

    const lea = await signedInPage('lea');
    const lc = card(lea, id);
    await lc.waitFor();
    await lc.locator('.note').fill('checked the invoice');
    await lc.locator('button.approve').click();
    await lc.locator('.outcome', { hasText: 'waits for another person' }).waitFor();
    has(await lc.locator('.quorum').textContent(), '1 of 2 finance approvals: lea at ', 'the count after one');
    expect(await sagaState(id) === 'awaiting_approval', 'still waiting after one of two');
    expect(!(await lc.locator('button.approve').isVisible()), 'lea cannot approve twice');
    has(await lc.locator('.may-not').textContent(), 'lea already approved', 'why lea may not again');
    await lea.context().close();

    const noor = await signedInPage('noor');
    const nc = card(noor, id);
    await nc.waitFor();
    has(await nc.locator('.quorum').textContent(), '1 of 2 finance approvals: lea at ', "noor sees lea's approval");
    await nc.locator('button.approve').click();
    await nc.locator('.outcome', { hasText: 'Saga succeeded' }).waitFor({ timeout: 30000 });
    await noor.screenshot({ path: path.join(SHOTS, 'two-person.png'), fullPage: true });
    await noor.context().close();
  });

  console.log(`1..${checks}`);
}

main().then(() => cleanup(0), (err) => { console.log('# ' + (err && err.message || err)); cleanup(1); });
