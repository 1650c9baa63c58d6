// A crash test's agent process on the OpenAI Agents SDK. MODE=first: runs
// the scripted agent until the SDK's interruption (the charge waits for a
// person), writes `result.state.toString()` to STATE_FILE, prints
// {"interrupted": [...call ids]} and waits for the SIGKILL. MODE=resume:
// restores the RunState from STATE_FILE, has the person (maria's client)
// approve or reject the interruption (DECISION=approve|reject) through
// IdemApprovals, runs on, and prints {"done": finalOutput, "outputs": ...}.

import { readFileSync, writeFileSync } from "node:fs";
import { Agent, RunState, Runner } from "@openai/agents";

import { IdemClient } from "../../dist/index.js";
import { DecisionRecorder, IdemApprovals, idemTools } from "../../dist/openai_agents.js";
import { ScriptedModel, TRAVEL_TOOL_NAMES, travelTools, chargeTool } from "../fake_model.mjs";

const env = process.env;
const retry = { attempts: 40, baseDelayMs: 50, maxDelayMs: 400 };
const idem = new IdemClient({ baseUrl: env.IDEM_URL, token: env.IDEM_AGENT_TOKEN, retry });
const person = new IdemClient({ baseUrl: env.IDEM_URL, token: env.IDEM_APPROVER_TOKEN, retry });
const session = await idem.begin({ intent_key: env.RUN_ID, tools: ["flights.reserve", "hotels.book", "cars.rent", "payments.charge"] });
const decisions = new DecisionRecorder();
const model = new ScriptedModel(JSON.parse(env.SCRIPT));
const tools = idemTools([...travelTools(), chargeTool()], {
  session,
  decisions,
  approver: person,
  toolNames: { ...TRAVEL_TOOL_NAMES, charge_card: "payments.charge" },
  wait: 10,
});
const agent = new Agent({ name: "travel", instructions: "Book the trip.", model: decisions.wrap(model, "scripted-agents"), tools });
const runner = new Runner({ tracingDisabled: true });

if (env.MODE === "first") {
  const result = await runner.run(agent, "Book Ana's trip to Tokyo", { maxTurns: 12 });
  writeFileSync(env.STATE_FILE, result.state.toString());
  console.log(JSON.stringify({ interrupted: result.interruptions.map((i) => i.rawItem.callId), saga: session.sagaId }));
  setInterval(() => {}, 1000); // until killed
} else {
  const state = await RunState.fromString(agent, readFileSync(env.STATE_FILE, "utf8"));
  const approvals = new IdemApprovals({ session, approver: person });
  for (const item of state.getInterruptions()) {
    if (env.DECISION === "reject") await approvals.reject(state, item, { reason: "too expensive" });
    else await approvals.approve(state, item, { note: "within budget" });
  }
  const result = await runner.run(agent, state, { maxTurns: 12 });
  console.log(JSON.stringify({ done: result.finalOutput, outputs: model.toolOutputs(), saga: session.sagaId }));
}
