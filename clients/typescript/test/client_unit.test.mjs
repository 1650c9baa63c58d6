// The client's own rules, with a scripted fetch (the answers a server or a
// broken network gives, in order): typed errors from problem documents,
// retries that resend the same key and body, no blind retry of a POST
// without a key, Retry-After, Prefer: wait.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  IdemClient,
  IdemCallIdReusedError,
  IdemConflictError,
  IdemError,
  IdemForbiddenError,
  IdemNetworkError,
  IdemNotFoundError,
  IdemSagaNotOpenError,
  IdemUnauthorizedError,
  IdemUnavailableError,
  IdemValidationError,
} from "../dist/index.js";

/** A fetch that plays `script` (functions or Responses) in order and records every request. */
function scriptedFetch(script) {
  const requests = [];
  const f = async (url, init) => {
    requests.push({ url, method: init.method, headers: { ...init.headers }, body: init.body });
    const step = script.shift();
    if (!step) throw new Error("scripted fetch: no answer left");
    return typeof step === "function" ? step() : step;
  };
  return { f, requests };
}

const json = (status, body, headers = {}) =>
  new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json", ...headers } });
const problem = (status, name, detail, headers = {}) =>
  new Response(JSON.stringify({ type: `urn:idem:problem:${name}`, title: name, status, detail }), {
    status,
    headers: { "Content-Type": "application/problem+json", ...headers },
  });
const refused = () => {
  throw new TypeError("fetch failed", { cause: new Error("connect ECONNREFUSED 127.0.0.1:1") });
};
const fast = { attempts: 4, baseDelayMs: 1, maxDelayMs: 5 };
const saga = { saga_id: "sg_1", state: "running", steps: [], effects: [] };

test("a submit that loses its answer is resent with the same Idempotency-Key and body", async () => {
  const { f, requests } = scriptedFetch([refused, refused, json(201, saga)]);
  const retries = [];
  const client = new IdemClient({ baseUrl: "http://idem.test/", fetch: f, retry: { ...fast, onRetry: (e) => retries.push(e) } });
  const out = await client.submit({ spec: "trip", input: { a: 1 } }, { intentKey: "ana-tokyo" });
  assert.equal(out.saga.saga_id, "sg_1");
  assert.equal(out.created, true);
  assert.equal(requests.length, 3);
  for (const r of requests) {
    assert.equal(r.url, "http://idem.test/v1/sagas");
    assert.equal(r.headers["Idempotency-Key"], "ana-tokyo");
    assert.equal(r.body, requests[0].body);
  }
  assert.deepEqual(
    retries.map((e) => [e.attempt, e.key, e.error.kind]),
    [
      [1, "ana-tokyo", "network"],
      [2, "ana-tokyo", "network"],
    ],
  );
});

test("an open-saga call is resent with the same call_id after a 503, waiting Retry-After", async () => {
  const answer = { call_id: "call_1", state: "succeeded", result: { ok: true }, deduplicated: false };
  const { f, requests } = scriptedFetch([problem(503, "saga-busy", "busy", { "Retry-After": "0" }), json(200, answer)]);
  const client = new IdemClient({ baseUrl: "http://idem.test", fetch: f, retry: fast });
  const got = await client.call("sg_1", { call_id: "call_1", tool: "flights.reserve", args: { x: 1 } }, { wait: 5 });
  assert.deepEqual(got, answer);
  assert.equal(requests.length, 2);
  assert.equal(requests[0].body, requests[1].body);
  assert.equal(JSON.parse(requests[1].body).call_id, "call_1");
  assert.equal(requests[0].headers.Prefer, "wait=5");
});

test("a keyed submit that overtakes its first attempt (409 idempotency-key-in-flight) is retried", async () => {
  const { f, requests } = scriptedFetch([problem(409, "idempotency-key-in-flight", "in flight", { "Retry-After": "0" }), json(201, saga)]);
  const client = new IdemClient({ baseUrl: "http://idem.test", fetch: f, retry: fast });
  assert.equal((await client.submit({ spec: "t" }, { intentKey: "k" })).saga.saga_id, "sg_1");
  assert.equal(requests.length, 2);
  assert.equal(requests[1].headers["Idempotency-Key"], "k");
  // saga-busy on a POST without a key (resolve) is the caller's to retry.
  const { f: f2, requests: r2 } = scriptedFetch([problem(409, "saga-busy", "being driven"), json(200, saga)]);
  const c2 = new IdemClient({ baseUrl: "http://idem.test", fetch: f2, retry: fast });
  await assert.rejects(c2.resolve("sg_1", { step: "s", decision: "retry" }), IdemConflictError);
  assert.equal(r2.length, 1);
});

test("a POST without a key (approve) is never retried, even after a network error", async () => {
  const { f, requests } = scriptedFetch([refused, json(200, saga)]);
  const client = new IdemClient({ baseUrl: "http://idem.test", fetch: f, retry: fast });
  await assert.rejects(client.approve("tok"), (e) => e instanceof IdemNetworkError && e.status === 0);
  assert.equal(requests.length, 1);
});

test("retries stop after the configured attempts and give the last error", async () => {
  const { f, requests } = scriptedFetch([refused, refused, refused, refused, json(200, saga)]);
  const client = new IdemClient({ baseUrl: "http://idem.test", fetch: f, retry: fast });
  await assert.rejects(client.getSaga("sg_1"), IdemNetworkError);
  assert.equal(requests.length, 4);
  const { f: f2, requests: r2 } = scriptedFetch([refused, json(200, saga)]);
  const noRetry = new IdemClient({ baseUrl: "http://idem.test", fetch: f2, retry: false });
  await assert.rejects(noRetry.getSaga("sg_1"), IdemNetworkError);
  assert.equal(r2.length, 1);
});

test("problem documents become typed errors with type, status, title and detail", async () => {
  const cases = [
    [409, "intent-conflict", IdemConflictError, "conflict"],
    [409, "saga-not-open", IdemSagaNotOpenError, "saga_not_open"],
    [409, "call-id-reused", IdemCallIdReusedError, "call_id_reused"],
    [404, "not-found", IdemNotFoundError, "not_found"],
    [401, "unauthorized", IdemUnauthorizedError, "unauthorized"],
    [403, "tool-not-allowed", IdemForbiddenError, "forbidden"],
    [422, "invalid-args", IdemValidationError, "invalid"],
    [503, "store-unavailable", IdemUnavailableError, "unavailable"],
  ];
  for (const [status, name, Cls, kind] of cases) {
    const { f } = scriptedFetch([problem(status, name, `detail of ${name}`)]);
    const client = new IdemClient({ baseUrl: "http://idem.test", fetch: f, retry: false });
    await assert.rejects(client.getSaga("sg_x"), (e) => {
      assert.ok(e instanceof Cls, `${name}: ${e?.constructor?.name}`);
      assert.ok(e instanceof IdemError);
      assert.equal(e.kind, kind);
      assert.equal(e.type, `urn:idem:problem:${name}`);
      assert.equal(e.problemName, name);
      assert.equal(e.status, status);
      assert.equal(e.title, name);
      assert.equal(e.detail, `detail of ${name}`);
      assert.match(e.message, new RegExp(`GET /v1/sagas/sg_x: ${status} ${name}: detail of ${name}`));
      return true;
    });
  }
  // 409 is final: never retried, even for a keyed request.
  const { f, requests } = scriptedFetch([problem(409, "intent-conflict", "x"), json(201, saga)]);
  const client = new IdemClient({ baseUrl: "http://idem.test", fetch: f, retry: fast });
  await assert.rejects(client.submit({ spec: "t" }, { intentKey: "k" }), IdemConflictError);
  assert.equal(requests.length, 1);
});

test("the bearer token goes only into Authorization, never into an error", async () => {
  const secret = "s3cr3t-token-value";
  const { f, requests } = scriptedFetch([problem(403, "forbidden", "role agent required")]);
  const client = new IdemClient({ baseUrl: "http://idem.test", token: secret, fetch: f, retry: false });
  const err = await client.approvals().catch((e) => e);
  assert.equal(requests[0].headers.Authorization, `Bearer ${secret}`);
  assert.ok(!JSON.stringify({ m: err.message, d: err.detail, p: err.problem }).includes(secret));
});

test("a commit whose answer was lost and whose retry finds the saga committed answers succeeded", async () => {
  const { f, requests } = scriptedFetch([
    refused,
    problem(409, "saga-not-open", "sg_1 is succeeded"),
    json(200, { ...saga, state: "succeeded" }),
  ]);
  const client = new IdemClient({ baseUrl: "http://idem.test", fetch: f, retry: fast });
  assert.deepEqual(await client.commit("sg_1"), { state: "succeeded", saga_id: "sg_1" });
  assert.deepEqual(
    requests.map((r) => `${r.method} ${new URL(r.url).pathname}`),
    ["POST /v1/sagas/sg_1/commit", "POST /v1/sagas/sg_1/commit", "GET /v1/sagas/sg_1"],
  );
  // Without a lost answer, saga-not-open is the caller's error.
  const { f: f2 } = scriptedFetch([problem(409, "saga-not-open", "sg_1 is compensated")]);
  await assert.rejects(new IdemClient({ baseUrl: "http://idem.test", fetch: f2, retry: fast }).commit("sg_1"), IdemSagaNotOpenError);
});

test("bad arguments are refused before anything is sent", async () => {
  const { f, requests } = scriptedFetch([]);
  const client = new IdemClient({ baseUrl: "http://idem.test", fetch: f });
  await assert.rejects(client.submit({ spec: "t" }, {}), /intentKey/);
  await assert.rejects(client.call("sg_1", { tool: "x", args: {} }), /call_id/);
  await assert.rejects(client.getSaga(""), /non-empty/);
  await assert.rejects(client.call("sg_1", { call_id: "c", tool: "x", args: {} }, { wait: -1 }), /wait/);
  assert.throws(() => new IdemClient({ baseUrl: "idem.test" }), /baseUrl/);
  assert.equal(requests.length, 0);
});

test("a call id reused with other arguments is an IdemCallIdReusedError naming both calls, not retried", async () => {
  const body = {
    type: "urn:idem:problem:call-id-reused",
    title: "Call id reused for another call",
    status: 409,
    detail: 'call_id "call_1" was recorded for tool "flights.book" with arguments sha256:aa; this call has tool "flights.book" with arguments sha256:bb',
    code: "call-id-reused",
    call_id: "call_1",
    recorded_tool: "flights.book",
    recorded_args_fingerprint: "sha256:aa",
    tool: "flights.book",
    args_fingerprint: "sha256:bb",
  };
  const { f, requests } = scriptedFetch([
    new Response(JSON.stringify(body), { status: 409, headers: { "Content-Type": "application/problem+json" } }),
  ]);
  const client = new IdemClient({ baseUrl: "http://idem.test", fetch: f, retry: fast });
  await assert.rejects(client.call("sg_1", { call_id: "call_1", tool: "flights.book", args: { to: "rome" } }), (e) => {
    assert.ok(e instanceof IdemCallIdReusedError);
    assert.ok(e instanceof IdemConflictError);
    assert.equal(e.kind, "call_id_reused");
    assert.equal(e.callId, "call_1");
    assert.equal(e.recordedTool, "flights.book");
    assert.equal(e.recordedArgsFingerprint, "sha256:aa");
    assert.equal(e.tool, "flights.book");
    assert.equal(e.argsFingerprint, "sha256:bb");
    return true;
  });
  assert.equal(requests.length, 1, "a refusal is not resent");
});
