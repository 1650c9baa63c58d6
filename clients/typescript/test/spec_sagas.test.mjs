// The client against a real `idem serve` on loopback and the travel
// providers over HTTP: spec sagas under an Idempotency-Key, approvals,
// control requests, typed errors from the real server, and a submit retried
// with the same key across a server restart.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  IdemClient,
  IdemConflictError,
  IdemError,
  IdemForbiddenError,
  IdemNotFoundError,
  IdemUnauthorizedError,
  IdemValidationError,
} from "../dist/index.js";
import {
  TRIP,
  TRIP_INPUT,
  authFile,
  cleanup,
  ledgerClean,
  readLedger,
  startProviders,
  startServer,
  tempDir,
  toolsFile,
} from "./helpers.mjs";

const fast = { attempts: 8, baseDelayMs: 50, maxDelayMs: 500 };

describe("spec sagas through a real idem serve", () => {
  let dir, providers, server, auth, agent, other, approver, ops;

  before(async () => {
    dir = tempDir("spec");
    providers = await startProviders(dir);
    auth = authFile(dir);
    server = await startServer(dir, { tools: toolsFile(dir, providers.port), auth: auth.file });
    agent = new IdemClient({ baseUrl: server.baseUrl, token: auth.tokens.agent, retry: fast });
    other = new IdemClient({ baseUrl: server.baseUrl, token: auth.tokens.other, retry: fast });
    approver = new IdemClient({ baseUrl: server.baseUrl, token: auth.tokens.approver, retry: fast });
    ops = new IdemClient({ baseUrl: server.baseUrl, token: auth.tokens.operator, retry: fast });
  });

  after(async () => {
    await server?.stop();
    await providers?.stop();
    if (dir) cleanup(dir);
  });

  test("submit, replay with the same key, approve: one effect per step", async () => {
    const first = await agent.submit({ spec: TRIP, input: TRIP_INPUT }, { intentKey: "ana-tokyo" });
    assert.equal(first.created, true);
    assert.equal(first.replayed, false);
    const again = await agent.submit({ spec: TRIP, input: TRIP_INPUT }, { intentKey: "ana-tokyo" });
    assert.equal(again.saga.saga_id, first.saga.saga_id);
    assert.equal(again.replayed, true);

    const waiting = await agent.waitForSaga(first.saga.saga_id, { until: (s) => s.state === "awaiting_approval" });
    assert.equal(waiting.state, "awaiting_approval");
    const approvals = (await approver.approvals()).filter((a) => a.saga_id === first.saga.saga_id);
    assert.equal(approvals.length, 1);
    assert.equal(approvals[0].step, "charge_payment");
    const approved = await approver.approve(approvals[0].token, { note: "within budget" });
    assert.equal(approved.state, "succeeded");

    const listed = await agent.listSagas({ status: "succeeded" });
    assert.ok(listed.sagas.some((s) => s.saga_id === first.saga.saga_id));
    const effects = readLedger(providers.ledger).effects.filter((e) => e.idempotency_key.startsWith(first.saga.saga_id));
    assert.deepEqual(effects.map((e) => `${e.provider}.${e.operation}`).sort(), [
      "cars.rent",
      "flights.reserve",
      "hotels.book",
      "payments.charge",
    ]);
    assert.ok(ledgerClean(providers.ledger));
  });

  test("the same intent key with other content is a typed error naming the key", async () => {
    await agent.submit({ spec: TRIP, input: TRIP_INPUT }, { intentKey: "bob-1" });
    const err = await agent
      .submit({ spec: TRIP, input: { ...TRIP_INPUT, traveller: "Bob" } }, { intentKey: "bob-1" })
      .catch((e) => e);
    assert.ok(err instanceof IdemError, String(err));
    assert.ok(err instanceof IdemConflictError || err instanceof IdemValidationError, err.constructor.name);
    assert.ok([409, 422].includes(err.status));
    assert.match(err.type, /^urn:idem:problem:/);
    assert.ok(err.title.length > 0);
  });

  test("the real server's refusals are typed: 401, 403, 404, 422", async () => {
    const nobody = new IdemClient({ baseUrl: server.baseUrl, token: "not-a-token", retry: false });
    const e401 = await nobody.listSagas().catch((e) => e);
    assert.ok(e401 instanceof IdemUnauthorizedError, String(e401));
    assert.equal(e401.status, 401);

    const e403 = await agent.approvals().catch((e) => e);
    assert.ok(e403 instanceof IdemForbiddenError, String(e403));
    assert.equal(e403.status, 403);

    const e404 = await agent.getSaga("sg_doesnotexist").catch((e) => e);
    assert.ok(e404 instanceof IdemNotFoundError, String(e404));
    assert.equal(e404.type, "urn:idem:problem:not-found");

    const bad = await agent.submit({ spec: { name: "x", steps: "no" } }, { intentKey: "bad-1" }).catch((e) => e);
    assert.ok(bad instanceof IdemValidationError, String(bad));
    assert.ok(bad.detail.length > 0);

    // Another agent's saga is not this agent's to read.
    const mine = await agent.submit({ spec: TRIP, input: TRIP_INPUT }, { intentKey: "mine-1" });
    const theirs = await other.getSaga(mine.saga.saga_id).catch((e) => e);
    assert.ok(theirs instanceof IdemForbiddenError || theirs instanceof IdemNotFoundError, String(theirs));
  });

  test("pause and cancel are durable requests (pause: operator); cancel rolls back what was done", async () => {
    const s = await agent.submit({ spec: TRIP, input: { ...TRIP_INPUT, traveller: "Cid" } }, { intentKey: "cid-1" });
    const id = s.saga.saga_id;
    await agent.waitForSaga(id, { until: (x) => x.state === "awaiting_approval" });
    const notAllowed = await agent.pause(id, { reason: "agents may not" }).catch((e) => e);
    assert.ok(notAllowed instanceof IdemForbiddenError, String(notAllowed));
    const paused = await ops.pause(id, { reason: "checking" }).catch((e) => e);
    // A saga waiting for a person cannot be paused (docs/cli.md): a typed 409.
    assert.ok(paused instanceof IdemConflictError, String(paused));
    const cancelled = await agent.cancel(id, { reason: "changed plans" });
    assert.equal(typeof cancelled.control.recorded, "boolean");
    const done = await agent.waitForSaga(id);
    assert.ok(["compensated", "cancelled"].includes(done.state), done.state);
    const again = await ops.cancel(id, { reason: "again" }).catch((e) => e);
    // A finished saga: refused or recorded nothing, never a second rollback.
    if (!(again instanceof IdemError)) assert.equal(again.control.recorded, false);
    const effects = readLedger(providers.ledger).effects.filter((e) => e.idempotency_key.startsWith(id));
    const operations = effects.map((e) => `${e.provider}.${e.operation}`).sort();
    assert.deepEqual(operations, ["cars.rent", "cars.return", "flights.cancel", "flights.reserve", "hotels.book", "hotels.cancel"]);
  });

  test("a submit sent while the server is down is retried with the same key and records one saga", async () => {
    await server.kill("SIGKILL");
    const retries = [];
    const client = new IdemClient({
      baseUrl: server.baseUrl,
      token: auth.tokens.agent,
      retry: { attempts: 20, baseDelayMs: 50, maxDelayMs: 300, onRetry: (e) => retries.push(e) },
    });
    const pending = client.submit({ spec: TRIP, input: { ...TRIP_INPUT, traveller: "Dee" } }, { intentKey: "dee-1" });
    await new Promise((r) => setTimeout(r, 300));
    await server.run();
    const out = await pending;
    assert.ok(retries.length >= 1, "the first attempts found no server");
    assert.ok(retries.every((e) => e.key === "dee-1" && e.error.kind === "network"));
    const again = await client.submit({ spec: TRIP, input: { ...TRIP_INPUT, traveller: "Dee" } }, { intentKey: "dee-1" });
    assert.equal(again.saga.saga_id, out.saga.saga_id);
    const mine = (await client.listSagas()).sagas.filter((s) => s.intent_key === "dee-1");
    assert.equal(mine.length, 1);
  });
});
