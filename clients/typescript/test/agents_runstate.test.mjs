// The OpenAI Agents SDK adapter's approvals against a real `idem serve` (the
// agent agent-1, the person maria): a charge that waits for a person is the
// SDK's interruption (needsApproval); the RunState is serialized, the agent
// process SIGKILLed, and a new process resumes from the string: the person
// approves on the RunState (recorded in idem as maria) and the charge is
// made once; or rejects it: idem fails the charge (nothing charged), and the
// agent rolls the flight back.

import assert from "node:assert/strict";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, describe, test } from "node:test";

import { IdemClient } from "../dist/index.js";
import { CHARGE, FLIGHT } from "./fake_model.mjs";
import { adapterWorld, child } from "./helpers.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const AGENT = path.join(here, "children/agents_child.mjs");

async function interruptedThenKilled(w, runId) {
  const env = {
    IDEM_URL: w.server.baseUrl,
    IDEM_AGENT_TOKEN: w.auth.tokens.agent,
    IDEM_APPROVER_TOKEN: w.auth.tokens.approver,
    RUN_ID: runId,
    STATE_FILE: path.join(w.dir, `${runId}.state`),
  };
  const first = child(AGENT, {
    ...env,
    MODE: "first",
    SCRIPT: JSON.stringify([
      [{ call: "reserve_flight", args: FLIGHT, callId: "call_f1" }],
      [{ call: "charge_card", args: CHARGE, callId: "call_p1" }],
      [{ text: "never reached: the run stops at the interruption" }],
    ]),
  });
  const stopped = await first.line((l) => "interrupted" in l);
  assert.deepEqual(stopped.interrupted, ["call_p1"]);
  const killed = await first.kill();
  assert.equal(killed.signal, "SIGKILL");
  return { env, saga: stopped.saga };
}

describe("the OpenAI Agents SDK adapter: interruptions and a RunState across a SIGKILL", () => {
  let w;
  afterEach(async () => {
    await w?.close();
    w = undefined;
  });

  test("approved on the RunState restored from its string in a new process: one charge, maria's", async () => {
    w = await adapterWorld("agents-approve", { IdemClient });
    const { env, saga } = await interruptedThenKilled(w, "agents-run-1");
    const waiting = await w.agent.getCall(saga, "call_p1");
    assert.equal(waiting.state, "awaiting_approval");
    assert.deepEqual(w.effects(), ["flights.reserve"], "nothing charged before the person decides");

    const second = child(AGENT, { ...env, MODE: "resume", DECISION: "approve", SCRIPT: JSON.stringify([[{ text: "Booked and paid." }]]) });
    const done = await second.line((l) => "done" in l);
    assert.equal((await second.exited).code, 0, second.stderr());
    assert.equal(done.done, "Booked and paid.");
    assert.match(done.outputs.call_p1, /charge_id/);
    const call = await w.agent.getCall(saga, "call_p1");
    assert.equal(call.state, "succeeded");
    const charged = (await w.agent.getSaga(saga)).steps.find((s) => s.id === call.step_id);
    assert.deepEqual([charged.approval.by, charged.approval.decision, charged.approval.note], ["maria", "approved", "within budget"]);
    assert.equal((await w.agent.commit(saga, {}, { wait: 10 })).state, "succeeded");
    assert.deepEqual(w.effects(), ["flights.reserve", "payments.charge"]);
    assert.ok(w.clean());
  });

  test("rejected on the restored RunState: idem fails the charge as maria's rejection; the rollback undoes the flight", async () => {
    w = await adapterWorld("agents-reject", { IdemClient });
    const { env, saga } = await interruptedThenKilled(w, "agents-run-2");
    const second = child(AGENT, { ...env, MODE: "resume", DECISION: "reject", SCRIPT: JSON.stringify([[{ text: "Not booked." }]]) });
    const done = await second.line((l) => "done" in l);
    assert.equal((await second.exited).code, 0, second.stderr());
    assert.equal(done.done, "Not booked.");
    assert.match(done.outputs.call_p1, /rejected this call: too expensive/);
    const call = await w.agent.getCall(saga, "call_p1");
    assert.equal(call.state, "failed");
    assert.match(call.error.message, /rejected by maria: too expensive/);
    assert.deepEqual(w.effects(), ["flights.reserve"], "nothing charged");
    assert.ok(["compensated", "compensating"].includes((await w.agent.rollback(saga, { reason: "Ana gave up" }, { wait: 10 })).state));
    assert.equal((await w.agent.waitForSaga(saga)).state, "compensated");
    assert.deepEqual(w.effects(), ["flights.cancel", "flights.reserve"]);
    assert.ok(w.clean());
  });
});
