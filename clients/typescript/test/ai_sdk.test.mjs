// The Vercel AI SDK adapter (@idem/client/ai-sdk) against a real `idem
// serve` (auth file: the agent agent-1, the person maria) and the travel
// providers, with `ai/test`'s mock language model scripted by turn: a
// repeated tool call, an approval and a rejection through the SDK's own
// tool approval, and the agent process SIGKILLed between two calls and run
// again. The providers' ledger shows one effect per intended call.

import assert from "node:assert/strict";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, describe, test } from "node:test";

import { IdemClient } from "../dist/index.js";
import { beginAiRun } from "../dist/ai_sdk.js";
import { CAR, CHARGE, FLIGHT, HOTEL, TOOLS, approvalRequests, scriptedModel, step, toolOutputs } from "./ai_sdk_agent.mjs";
import { adapterWorld, child } from "./helpers.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const USER = [{ role: "user", content: "Book Ana's trip to Tokyo" }];

/**
 * A run that books the flight, then asks for the charge: the step ends with
 * the SDK's approval request for it, and nothing is charged yet. `answer`
 * gives the person's response and runs the next step from it.
 */
async function chargeRequested(w, runId, finalText) {
  const run = await beginAiRun(w.agent, { runId, tools: TOOLS, approver: w.person });
  const model = scriptedModel([
    [{ call: "reserve_flight", args: FLIGHT, id: "call_f1" }],
    [{ call: "charge_card", args: CHARGE, id: "call_p1" }],
    finalText,
  ]);
  const first = await step(run, model, USER);
  const [request] = approvalRequests(first);
  assert.ok(request, `no approval request: ${JSON.stringify(first.content)}`);
  assert.equal(request.toolCall.toolCallId, "call_p1");
  const waiting = await run.session.getCall("call_p1");
  assert.equal(waiting.state, "awaiting_approval");
  assert.match(waiting.approval.summary, /./);
  assert.deepEqual(w.effects(), ["flights.reserve"], "nothing charged before the person decides");
  // The app shows the request; the person answers in the app.
  const answer = (approved, reason) =>
    step(run, model, [
      ...USER,
      ...first.response.messages,
      { role: "tool", content: [{ type: "tool-approval-response", approvalId: request.approvalId, approved, reason }] },
    ]);
  return { run, waiting, answer };
}

describe("the Vercel AI SDK adapter against a real idem serve", () => {
  let w;
  afterEach(async () => {
    await w?.close();
    w = undefined;
  });

  test("a repeated tool call makes one effect; each call carries the model's step as its decision", async () => {
    w = await adapterWorld("ai-repeat", { IdemClient });
    const run = await beginAiRun(w.agent, { runId: "ai-run-1", tools: TOOLS, approver: w.person });
    const model = scriptedModel([
      [{ call: "reserve_flight", args: FLIGHT, id: "call_f1" }],
      // The model repeats the booking under a new id, next to the hotel.
      [{ call: "reserve_flight", args: FLIGHT, id: "call_f2" }, { call: "book_hotel", args: HOTEL, id: "call_h1" }],
      "Ana's flight and hotel are booked.",
    ]);
    const result = await step(run, model, USER);
    assert.equal(result.text, "Ana's flight and hotel are booked.");
    const out = toolOutputs(result);
    assert.ok(out.call_f1.reservation_id, JSON.stringify(out.call_f1));
    assert.match(out.call_f2, /repeats call_f1 \(same tool and arguments\); nothing was done again/);
    assert.ok(out.call_h1.booking_id);
    // Run again with the same key: the same saga, and the journal answers.
    const again = await beginAiRun(w.agent, { runId: "ai-run-1", tools: TOOLS });
    assert.equal(again.session.sagaId, run.session.sagaId);
    assert.equal((await again.session.call({ call_id: "call_f1", tool: "flights.reserve", args: FLIGHT })).deduplicated, true);
    assert.equal((await run.commit()).state, "succeeded");
    const saga = await run.session.get();
    const first = saga.calls.find((c) => c.call_id === "call_f1");
    assert.equal(first.decision.model, "mock-travel");
    assert.equal(first.decision.message_id, "resp_0");
    assert.match(first.decision.prompt_sha256, /^[0-9a-f]{64}$/);
    assert.deepEqual(w.effects(), ["flights.reserve", "hotels.book"]);
    assert.ok(w.clean());
  });

  test("a charge waits for a person as the SDK's tool-approval request; the SDK's approval is idem's decision by maria", async () => {
    w = await adapterWorld("ai-approve", { IdemClient });
    const { run, waiting, answer } = await chargeRequested(w, "ai-run-2", "Booked and paid.");
    const second = await answer(true, "within budget");
    assert.equal(second.text, "Booked and paid.");
    assert.ok(toolOutputs(second).call_p1.charge_id, JSON.stringify(toolOutputs(second)));
    const saga = await run.session.get();
    const step1 = saga.steps.find((s) => s.id === waiting.step_id);
    assert.equal(step1.state, "succeeded");
    assert.equal(step1.approval.by, "maria", "the decision is the person's, not the agent's");
    assert.equal(step1.approval.decision, "approved");
    assert.equal(step1.approval.note, "within budget", "the approval response's reason is the note");
    assert.equal((await run.commit()).state, "succeeded");
    assert.deepEqual(w.effects(), ["flights.reserve", "payments.charge"]);
    assert.ok(w.clean());
  });

  test("the person denies the charge in the SDK: idem records maria's rejection, nothing is charged; the rollback undoes the flight", async () => {
    w = await adapterWorld("ai-reject", { IdemClient });
    const { run, answer } = await chargeRequested(w, "ai-run-3", "The charge was refused; the flight is cancelled.");
    const second = await answer(false, "too expensive");
    assert.equal(second.text, "The charge was refused; the flight is cancelled.");
    const call = await run.session.getCall("call_p1");
    assert.equal(call.state, "failed");
    assert.match(call.error.message, /rejected by maria: too expensive/);
    assert.deepEqual(w.effects(), ["flights.reserve"], "nothing charged");
    await run.rollback({ reason: "the charge was refused" });
    const saga = await w.agent.waitForSaga(run.session.sagaId);
    assert.equal(saga.state, "compensated");
    assert.deepEqual(w.effects(), ["flights.cancel", "flights.reserve"]);
    assert.ok(w.clean());
  });

  test("the agent process is SIGKILLed between two calls and run again: one effect each", async () => {
    w = await adapterWorld("ai-kill", { IdemClient });
    const script = JSON.stringify([
      [{ call: "reserve_flight", args: FLIGHT, id: "call_f1" }],
      [{ call: "rent_car", args: CAR, id: "call_c1" }],
      "Flight and car booked.",
    ]);
    const env = { IDEM_URL: w.server.baseUrl, IDEM_AGENT_TOKEN: w.auth.tokens.agent, RUN_ID: "ai-run-kill", SCRIPT: script };
    const first = child(path.join(here, "children/ai_sdk_child.mjs"), { ...env, STOP_AT_TURN: "1" });
    await first.line((l) => l.between === 1);
    await first.kill();
    assert.deepEqual(w.effects(), ["flights.reserve"]);

    const second = child(path.join(here, "children/ai_sdk_child.mjs"), env);
    const done = await second.line((l) => "done" in l);
    assert.equal((await second.exited).code, 0);
    assert.equal(done.done, "Flight and car booked.");
    assert.match(done.outputs.call_f1, /repeats call_f1 \(same call_id\)/);
    assert.ok(done.outputs.call_c1.rental_id);
    assert.equal((await w.agent.openSaga(done.saga).commit({}, { wait: 10 })).state, "succeeded");
    assert.deepEqual(w.effects(), ["cars.rent", "flights.reserve"]);
    assert.ok(w.clean());
  });
});
