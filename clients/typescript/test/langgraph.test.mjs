// The LangGraph.js adapter (@idem/client/langgraph) against a real `idem
// serve` (the agent agent-1, the person maria) and the travel providers,
// with a scripted fake chat model from @langchain/core's testing utilities
// and PostgresSaver on a throwaway PostgreSQL as the checkpointer: a charge
// that waits for a person stops the graph with interrupt(), and the resume
// value becomes idem's decision (approved: committed; rejected: the call
// fails, nothing charged); the graph process is SIGKILLed mid-call and resumed
// from its checkpoint in a new process: one effect per intended call.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { chmodSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { after, afterEach, before, describe, test } from "node:test";

import { Command } from "@langchain/langgraph";

import { IdemClient } from "../dist/index.js";
import { CHARGE, FLIGHT, HOTEL, travelGraph } from "./langgraph_agent.mjs";
import { SOURCE_DIR, adapterWorld, child, cleanup, tempDir } from "./helpers.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const USER = { messages: [{ role: "user", content: "Book Ana's trip to Tokyo" }] };
const PG = path.join(SOURCE_DIR, "scripts/pg-test-server.sh");

/** The call as idem has it, once the saga of `intentKey` has it (polled). */
async function callSeen(agent, intentKey, callId, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const saga = (await agent.listSagas()).sagas.find((s) => s.intent_key === intentKey);
    if (saga) {
      const call = await agent.getCall(saga.saga_id, callId).catch(() => undefined);
      if (call) return call;
    }
    if (Date.now() > deadline) throw new Error(`no call ${callId} in ${intentKey} within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe("the LangGraph.js adapter against a real idem serve, checkpointed in PostgreSQL", () => {
  let pgDir, pgUrl, w, open;

  before(() => {
    pgDir = tempDir("langgraph-pg");
    chmodSync(pgDir, 0o755); // as root the server runs as the postgres user, who must reach its folder
    execFileSync("bash", [PG, "start", path.join(pgDir, "pg")], { stdio: "ignore" });
    pgUrl = readFileSync(path.join(pgDir, "pg", "url"), "utf8").trim();
  });
  after(() => {
    if (pgDir) {
      execFileSync("bash", [PG, "stop", path.join(pgDir, "pg")], { stdio: "ignore" });
      cleanup(pgDir);
    }
  });
  afterEach(async () => {
    await open?.checkpointer.end();
    open = undefined;
    await w?.close();
    w = undefined;
  });

  const script = [
    [{ call: "reserve_flight", args: FLIGHT, id: "call_f1" }],
    [{ call: "charge_card", args: CHARGE, id: "call_p1" }],
    "Done.",
  ];

  test("a charge waiting for a person is interrupt(); resumed approved, maria's approval commits it", async () => {
    w = await adapterWorld("lg-approve", { IdemClient });
    open = await travelGraph({ pgUrl, script, idem: w.agent, approver: w.person });
    const config = { configurable: { thread_id: "lg-approve-1" } };
    const first = await open.graph.invoke(USER, config);
    const [intr] = first.__interrupt__ ?? [];
    assert.ok(intr, `no interrupt: ${JSON.stringify(first)}`);
    assert.equal(intr.value.idem.call_id, "call_p1");
    assert.equal(intr.value.idem.tool, "payments.charge");
    assert.match(intr.value.idem.approval.summary, /./);
    assert.deepEqual(w.effects(), ["flights.reserve"], "nothing charged before the person decides");
    const state = await open.graph.getState(config);
    assert.deepEqual(state.next, ["tools"]);

    const done = await open.graph.invoke(new Command({ resume: { approved: true, note: "within budget" } }), config);
    assert.equal(done.messages.at(-1).content, "Done.");
    const charge = done.messages.find((m) => m.getType() === "tool" && m.tool_call_id === "call_p1");
    assert.ok(JSON.parse(charge.content).charge_id, charge.content);
    const flight = done.messages.find((m) => m.getType() === "tool" && m.tool_call_id === "call_f1");
    assert.ok(JSON.parse(flight.content).reservation_id, "the flight's answer from before the interrupt stays");
    const session = await open.tools.session("lg-approve-1");
    const saga = await session.get();
    assert.equal(saga.intent_key, "langgraph:lg-approve-1");
    assert.equal(saga.calls.find((c) => c.call_id === "call_f1").decision.model, "fake-travel");
    const charged = saga.steps.find((s) => s.id === intr.value.idem.step_id);
    assert.deepEqual([charged.approval.by, charged.approval.decision, charged.approval.note], ["maria", "approved", "within budget"]);
    assert.equal((await session.commit({}, { wait: 10 })).state, "succeeded");
    assert.deepEqual(w.effects(), ["flights.reserve", "payments.charge"]);
    assert.ok(w.clean());
  });

  test("resumed rejected: idem records maria's rejection, nothing is charged; the rollback undoes the flight", async () => {
    w = await adapterWorld("lg-reject", { IdemClient });
    open = await travelGraph({ pgUrl, script, idem: w.agent, approver: w.person });
    const config = { configurable: { thread_id: "lg-reject-1" } };
    const first = await open.graph.invoke(USER, config);
    assert.equal(first.__interrupt__?.[0]?.value.idem.call_id, "call_p1");
    const done = await open.graph.invoke(new Command({ resume: { approved: false, reason: "too expensive" } }), config);
    const charge = done.messages.find((m) => m.getType() === "tool" && m.tool_call_id === "call_p1");
    assert.equal(charge.status, "error");
    assert.match(charge.content, /rejected by maria: too expensive/);
    assert.deepEqual(w.effects(), ["flights.reserve"], "nothing charged");
    const session = await open.tools.session("lg-reject-1");
    await session.rollback({ reason: "the charge was refused" }, { wait: 10 });
    assert.equal((await w.agent.waitForSaga(session.sagaId)).state, "compensated");
    assert.deepEqual(w.effects(), ["flights.cancel", "flights.reserve"]);
    assert.ok(w.clean());
  });

  test("the graph process is SIGKILLed mid-call and resumed from its checkpoint: one effect per call", async () => {
    // The first flight reservation takes 1.5 s at the provider: the kill lands while idem waits for it.
    w = await adapterWorld("lg-kill", { IdemClient, faults: ["flights.reserve=delay(1500)@1"] });
    const env = {
      IDEM_URL: w.server.baseUrl,
      IDEM_AGENT_TOKEN: w.auth.tokens.agent,
      PG_URL: pgUrl,
      THREAD: "lg-kill-1",
      SCRIPT: JSON.stringify([
        [{ call: "reserve_flight", args: FLIGHT, id: "call_f1" }],
        [{ call: "book_hotel", args: HOTEL, id: "call_h1" }],
        "Flight and hotel booked.",
      ]),
    };
    const first = child(path.join(here, "children/langgraph_child.mjs"), env);
    await first.line((l) => l.started);
    // Killed once idem has the call (the provider holds it 1.5 s): mid-call.
    const inFlight = await callSeen(w.agent, "langgraph:lg-kill-1", "call_f1");
    assert.ok(["processing", "unknown"].includes(inFlight.state), `killed mid-call, not ${inFlight.state}`);
    const killed = await first.kill();
    assert.equal(killed.signal, "SIGKILL");

    const second = child(path.join(here, "children/langgraph_child.mjs"), { ...env, RESUME: "1" });
    const done = await second.line((l) => "done" in l);
    assert.equal((await second.exited).code, 0, second.stderr());
    assert.equal(done.done, "Flight and hotel booked.");
    const flight = done.tools.find((t) => t.id === "call_f1");
    // The re-run node asked again with the same id: answered from the journal.
    assert.match(flight.content, /repeats call_f1 \(same call_id\)/);
    assert.ok(JSON.parse(flight.content).result.reservation_id, flight.content);
    assert.deepEqual(w.effects(), ["flights.reserve", "hotels.book"]);
    assert.ok(w.clean());
  });
});
