// The OpenAI Agents SDK adapter's wiring, with the real SDK runner, a
// scripted model and a scripted idem (a fetch that answers the open-saga
// contract of docs/server.md): the call id idem gets is the model's, the
// decision carries the model's response id and the prompt's SHA-256, and
// the model reads the result, the dedup note, "waiting for approval" or the
// failure. The same adapter against a real server: agents_open_saga.test.mjs.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";

import { IdemClient, IdemNetworkError } from "../dist/index.js";
import { DecisionRecorder, canonicalJson, idemTool, idemTools } from "../dist/openai_agents.js";
import { CAR, FLIGHT, HOTEL, ScriptedModel, TRAVEL_TOOL_NAMES, runAgent, travelTools } from "./fake_model.mjs";
import { z } from "zod";

/** idem's open-saga call endpoint as a fetch: dedup by call_id, then by tool + arguments. */
function contractFetch({ approvalTools = [], failingTools = [], down = false } = {}) {
  const calls = [];
  const byId = new Map();
  const byArgs = new Map();
  const f = async (url, init) => {
    if (down) throw new TypeError("fetch failed", { cause: new Error("connect ECONNREFUSED") });
    const body = JSON.parse(init.body);
    calls.push(body);
    const reply = (status, doc) => new Response(JSON.stringify(doc), { status, headers: { "Content-Type": "application/json" } });
    if (byId.has(body.call_id)) {
      return reply(200, { ...byId.get(body.call_id), deduplicated: true, duplicate_of: body.call_id, reason: "same call_id" });
    }
    const fp = `${body.tool} ${canonicalJson(body.args)}`;
    if (byArgs.has(fp) && !body.repeat) {
      const first = byArgs.get(fp);
      return reply(200, { ...first, call_id: body.call_id, deduplicated: true, duplicate_of: first.call_id, reason: "same tool and arguments" });
    }
    let answer;
    if (approvalTools.includes(body.tool)) {
      answer = { call_id: body.call_id, tool: body.tool, state: "awaiting_approval", approval: { summary: "charge EUR 1,840.00 to Ana", expires_at: "2026-12-01T15:00:00Z", approve_at: { api: "/v1/approvals/tok/approve" } } };
      return reply(202, answer);
    }
    if (failingTools.includes(body.tool)) {
      answer = { call_id: body.call_id, tool: body.tool, state: "failed", error: { code: "sold_out", message: "no rooms left", retryable: false } };
    } else {
      answer = { call_id: body.call_id, tool: body.tool, state: "succeeded", result: { ref: `R${calls.length}` }, deduplicated: false };
    }
    byId.set(body.call_id, answer);
    byArgs.set(fp, answer);
    return reply(200, answer);
  };
  return { f, calls };
}

const sha256 = (s) => createHash("sha256").update(s).digest("hex");

test("each SDK tool invocation is an idem call keyed by the model's call id, with the model decision", async () => {
  const { f, calls } = contractFetch();
  const session = new IdemClient({ baseUrl: "http://idem.test", fetch: f }).openSaga("sg_1");
  const model = new ScriptedModel([
    [{ call: "reserve_flight", args: FLIGHT, callId: "call_f1" }],
    [{ call: "book_hotel", args: HOTEL, callId: "call_h1" }],
    // The model lost track: the same call id again (the SDK itself drops a
    // call id it already answered in this run: it never reaches the tool),
    // then the same booking under a new id (idem answers from its journal).
    [{ call: "book_hotel", args: HOTEL, callId: "call_h1" }],
    [{ call: "book_hotel", args: HOTEL, callId: "call_h2" }],
    [{ call: "rent_car", args: CAR, callId: "call_c1" }],
    [{ text: "Booked." }],
  ]);
  const decisions = new DecisionRecorder();
  const tools = idemTools(travelTools(), { session, toolNames: TRAVEL_TOOL_NAMES, decisions });
  const result = await runAgent(decisions.wrap(model, "scripted-1"), tools);
  assert.equal(result.finalOutput, "Booked.");

  assert.deepEqual(
    calls.map((c) => [c.call_id, c.tool]),
    [
      ["call_f1", "flights.reserve"],
      ["call_h1", "hotels.book"],
      ["call_h2", "hotels.book"],
      ["call_c1", "cars.rent"],
    ],
  );
  assert.deepEqual(calls[0].args, FLIGHT);
  const requestOf = [0, 1, 3, 4]; // the model request each call answered (turn 3 was dropped)
  for (const [i, c] of calls.entries()) {
    const req = model.requests[requestOf[i]];
    assert.equal(c.decision.model, "scripted-1");
    assert.equal(c.decision.call_id, c.call_id);
    assert.equal(c.decision.message_id, `resp_${requestOf[i] + 1}`);
    assert.equal(c.decision.prompt_sha256, sha256(canonicalJson({ system: req.systemInstructions ?? null, input: req.input })));
    assert.match(c.decision.prompt_sha256, /^[0-9a-f]{64}$/);
    assert.equal(c.decision.prompt, undefined, "the prompt text is sent only with keepPrompt");
  }
  const seen = model.toolOutputs();
  assert.deepEqual(JSON.parse(seen.call_f1), { ref: "R1" });
  assert.match(seen.call_h2, /repeats call_h1 \(same tool and arguments\); nothing was done again/);
  assert.deepEqual(JSON.parse(seen.call_h2).result, { ref: "R2" });

  // The agent restarts (a new run) and the model replays its first call id:
  // now it reaches idem, which answers the recorded result and calls nothing.
  const replay = new ScriptedModel([[{ call: "reserve_flight", args: FLIGHT, callId: "call_f1" }], [{ text: "Done." }]]);
  await runAgent(decisions.wrap(replay, "scripted-1"), tools);
  assert.deepEqual(calls.at(-1).call_id, "call_f1");
  const replayed = JSON.parse(replay.toolOutputs().call_f1);
  assert.deepEqual(replayed.result, { ref: "R1" });
  assert.match(replayed.note, /repeats call_f1 \(same call_id\); nothing was done again/);
});

test("with approvals: 'text', the model reads 'waiting for approval' with the summary, and a failure as a failure", async () => {
  const { f, calls } = contractFetch({ approvalTools: ["payments.charge"], failingTools: ["hotels.book"] });
  const session = new IdemClient({ baseUrl: "http://idem.test", fetch: f }).openSaga("sg_2");
  const charge = idemTool(
    {
      name: "charge_card",
      description: "Charge the card",
      parameters: z.object({ traveller: z.string(), amount_cents: z.number().int() }),
      idemTool: "payments.charge",
    },
    { session, approvals: "text" },
  );
  const model = new ScriptedModel([
    [{ call: "charge_card", args: { traveller: "Ana", amount_cents: 184000 }, callId: "call_p1" }],
    [{ call: "book_hotel", args: HOTEL, callId: "call_h1" }],
    [{ text: "Waiting for Maria." }],
  ]);
  const tools = [charge, ...idemTools(travelTools(), { session, toolNames: TRAVEL_TOOL_NAMES })];
  await runAgent(model, tools);
  const seen = model.toolOutputs();
  assert.match(seen.call_p1, /payments\.charge is waiting for a person's approval: charge EUR 1,840\.00 to Ana/);
  assert.match(seen.call_p1, /\/v1\/approvals\/tok\/approve/);
  assert.match(seen.call_h1, /hotels\.book failed \(sold_out\): no rooms left\. Do not retry/);
  // No DecisionRecorder: no decision (idem requires the model and the prompt's SHA-256).
  assert.deepEqual(calls.map((c) => [c.call_id, "decision" in c]), [["call_p1", false], ["call_h1", false]]);
});

test("an idem that does not answer stops the run instead of telling the model the call failed", async () => {
  const { f } = contractFetch({ down: true });
  const client = new IdemClient({ baseUrl: "http://idem.test", fetch: f, retry: { attempts: 2, baseDelayMs: 1, maxDelayMs: 2 } });
  const model = new ScriptedModel([[{ call: "reserve_flight", args: FLIGHT, callId: "call_f1" }], [{ text: "never" }]]);
  const tools = idemTools(travelTools(), { session: client.openSaga("sg_3"), toolNames: TRAVEL_TOOL_NAMES });
  await assert.rejects(runAgent(model, tools), (e) => {
    // The SDK wraps it in a ToolCallError (.error): the client's network error.
    for (let x = e; x; x = x.error ?? x.cause) if (x instanceof IdemNetworkError) return true;
    assert.fail(`not a network error: ${e}`);
  });
  assert.equal(model.requests.length, 1, "the model was not asked again");
});
