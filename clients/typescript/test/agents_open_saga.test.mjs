// A ReAct agent (the OpenAI Agents SDK's runner, a scripted model) books a
// trip through open sagas on a real `idem serve`, the travel providers over
// HTTP keeping their ledger: the loop books and commits; the model repeats
// a booking (same call id on a restarted run, same arguments under a new
// id); the server is SIGKILLed mid-call and restarted and the retry with the
// same call id gets the recorded answer; a rollback undoes everything. Each
// test has its own providers, ledger and journal, so the ledger's counts are
// the test's.

import assert from "node:assert/strict";
import { afterEach, before, describe, test } from "node:test";

import { IdemCallIdReusedError, IdemClient, IdemNotFoundError } from "../dist/index.js";
import { DecisionRecorder, idemTools } from "../dist/openai_agents.js";
import { CAR, FLIGHT, HOTEL, ScriptedModel, TRAVEL_TOOL_NAMES, runAgent, travelTools } from "./fake_model.mjs";
import { cleanup, ledgerClean, readLedger, startProviders, startServer, tempDir, toolsFile } from "./helpers.mjs";

const TOOLS = ["flights.reserve", "hotels.book", "cars.rent"];

/** provider.operation of every effect in the ledger, sorted. */
function effects(ledger) {
  return readLedger(ledger)
    .effects.map((e) => `${e.provider}.${e.operation}`)
    .sort();
}

async function world(name, providerArgs = [], { open = true } = {}) {
  const dir = tempDir(name);
  const providers = await startProviders(dir, providerArgs);
  const server = await startServer(dir, { tools: toolsFile(dir, providers.port, { open }) });
  const retries = [];
  const client = new IdemClient({
    baseUrl: server.baseUrl,
    retry: { attempts: 40, baseDelayMs: 50, maxDelayMs: 400, onRetry: (e) => retries.push(e) },
  });
  return {
    dir,
    providers,
    server,
    client,
    retries,
    async close() {
      await server.stop();
      await providers.stop();
      cleanup(dir);
    },
  };
}

describe("open sagas with the OpenAI Agents SDK against a real idem serve", () => {
  let supported = true;
  let w;

  before(async () => {
    // A server without open sagas (the endpoints are not merged yet) answers 404 "no such endpoint".
    const probe = await world("probe");
    try {
      await probe.client.begin({ intent_key: "probe", tools: ["flights.reserve"] });
    } catch (e) {
      if (e instanceof IdemNotFoundError) supported = false;
      else throw e;
    } finally {
      await probe.close();
    }
  });

  afterEach(async () => {
    await w?.close();
    w = undefined;
  });

  test("a ReAct loop books flight, hotel and car and commits; repeats are answered from the journal", async (t) => {
    if (!supported) return t.skip("this idem serve has no /v1/open-sagas");
    w = await world("react");
    const session = await w.client.begin({ intent_key: "trip-ana-1", tools: TOOLS, metadata: { traveller: "Ana" } });
    assert.equal(session.info.state, "open");
    const decisions = new DecisionRecorder();
    const tools = idemTools(travelTools(), { session, toolNames: TRAVEL_TOOL_NAMES, decisions });
    const model = new ScriptedModel([
      [{ call: "reserve_flight", args: FLIGHT, callId: "call_f1" }],
      [{ call: "book_hotel", args: HOTEL, callId: "call_h1" }],
      // The model repeats the booking under a new call id.
      [{ call: "book_hotel", args: HOTEL, callId: "call_h2" }],
      [{ call: "rent_car", args: CAR, callId: "call_c1" }],
      [{ text: "Ana's trip is booked." }],
    ]);
    const run = await runAgent(decisions.wrap(model, "scripted-react"), tools);
    assert.equal(run.finalOutput, "Ana's trip is booked.");
    const seen = model.toolOutputs();
    assert.ok(JSON.parse(seen.call_f1).reservation_id, seen.call_f1);
    assert.match(seen.call_h2, /repeats call_h1/);
    assert.equal(JSON.parse(seen.call_h2).result.booking_id, JSON.parse(seen.call_h1).booking_id);

    // The agent restarts: a new run whose model replays its first call id.
    const replay = new ScriptedModel([[{ call: "reserve_flight", args: FLIGHT, callId: "call_f1" }], [{ text: "ok" }]]);
    await runAgent(decisions.wrap(replay, "scripted-react"), tools);
    const replayed = JSON.parse(replay.toolOutputs().call_f1);
    assert.equal(replayed.result.reservation_id, JSON.parse(seen.call_f1).reservation_id);
    assert.match(replayed.note, /same call_id/);

    // The same call id with other arguments is another intent: refused, nothing booked.
    await assert.rejects(
      session.call({ call_id: "call_f1", tool: "flights.reserve", args: { ...FLIGHT, note: "window seat" } }),
      (e) => e instanceof IdemCallIdReusedError && e.callId === "call_f1" && e.recordedArgsFingerprint !== e.argsFingerprint,
    );

    const answer = await w.client.getCall(session.sagaId, "call_h1");
    assert.equal(answer.state, "succeeded");
    const committed = await session.commit({}, { wait: 10 });
    assert.equal(committed.state, "succeeded");
    const saga = await session.get();
    assert.equal(saga.state, "succeeded");
    if (Array.isArray(saga.calls)) {
      const first = saga.calls.find((c) => c.call_id === "call_f1");
      assert.equal(first?.decision?.model, "scripted-react");
      assert.match(first?.decision?.prompt_sha256 ?? "", /^[0-9a-f]{64}$/);
    }
    assert.deepEqual(effects(w.providers.ledger), ["cars.rent", "flights.reserve", "hotels.book"]);
    assert.ok(ledgerClean(w.providers.ledger));
    await assert.rejects(session.call({ call_id: "call_late", tool: "cars.rent", args: CAR }), (e) => e.kind === "saga_not_open");
  });

  test("the server is SIGKILLed mid-call; the retry with the same call id gets the recorded answer", async (t) => {
    if (!supported) return t.skip("this idem serve has no /v1/open-sagas");
    // The first flight reservation takes 1.5 s at the provider: the kill lands while idem waits for it.
    w = await world("kill", ["--fault", "flights.reserve=delay(1500)@1"]);
    const session = await w.client.begin({ intent_key: "trip-kill-1", tools: TOOLS });
    const tools = idemTools(travelTools(), { session, toolNames: TRAVEL_TOOL_NAMES });
    const model = new ScriptedModel([
      [{ call: "reserve_flight", args: FLIGHT, callId: "call_f1" }],
      [{ text: "booked" }],
    ]);
    const running = runAgent(model, tools);
    await new Promise((r) => setTimeout(r, 600));
    await w.server.kill("SIGKILL");
    await new Promise((r) => setTimeout(r, 300));
    await w.server.run();
    const run = await running;
    assert.equal(run.finalOutput, "booked");
    const calls = w.retries.filter((e) => e.path.endsWith("/calls"));
    assert.ok(calls.length >= 1, "the call was retried");
    assert.ok(calls.every((e) => e.key === "call_f1"), JSON.stringify(calls.map((e) => e.key)));
    const seen = model.toolOutputs().call_f1;
    assert.ok(JSON.parse(seen).reservation_id ?? JSON.parse(seen).result?.reservation_id, seen);
    assert.equal((await w.client.getCall(session.sagaId, "call_f1")).state, "succeeded");
    assert.deepEqual(effects(w.providers.ledger), ["flights.reserve"]);
    assert.ok(ledgerClean(w.providers.ledger));
    t.diagnostic(`call_f1 sent ${calls.length + 1} times (same call id); ledger: ${effects(w.providers.ledger).length} effect`);
  });

  test("a rollback undoes every booking in reverse order", async (t) => {
    if (!supported) return t.skip("this idem serve has no /v1/open-sagas");
    w = await world("rollback");
    const session = await w.client.begin({ intent_key: "trip-undo-1", tools: TOOLS });
    const tools = idemTools(travelTools(), { session, toolNames: TRAVEL_TOOL_NAMES });
    const model = new ScriptedModel([
      [{ call: "reserve_flight", args: FLIGHT, callId: "call_f1" }],
      [{ call: "book_hotel", args: HOTEL, callId: "call_h1" }],
      [{ call: "rent_car", args: CAR, callId: "call_c1" }],
      [{ text: "Ana cancelled; undoing." }],
    ]);
    await runAgent(model, tools);
    const undone = await session.rollback({ reason: "Ana cancelled the trip" }, { wait: 10 });
    assert.ok(["compensated", "compensating"].includes(undone.state), undone.state);
    const saga = await w.client.waitForSaga(session.sagaId);
    assert.equal(saga.state, "compensated");
    assert.deepEqual(effects(w.providers.ledger), [
      "cars.rent",
      "cars.return",
      "flights.cancel",
      "flights.reserve",
      "hotels.book",
      "hotels.cancel",
    ]);
    const order = readLedger(w.providers.ledger)
      .effects.filter((e) => ["cancel", "return"].includes(e.operation))
      .sort((a, b) => a.id - b.id)
      .map((e) => e.provider);
    assert.deepEqual(order, ["cars", "hotels", "flights"]);
    assert.ok(ledgerClean(w.providers.ledger));
  });
});
