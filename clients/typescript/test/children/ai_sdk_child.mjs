// A crash test's agent process on the Vercel AI SDK: begins (or finds again)
// the run's open saga and runs the scripted agent; with STOP_AT_TURN=N it
// prints {"between": N} when the model is asked for turn N and waits there
// for the SIGKILL. Prints {"done": ..., "outputs": ...} when the run ends.

import { IdemClient } from "../../dist/index.js";
import { beginAiRun } from "../../dist/ai_sdk.js";
import { TOOLS, scriptedModel, step, toolOutputs } from "../ai_sdk_agent.mjs";

const env = process.env;
const idem = new IdemClient({ baseUrl: env.IDEM_URL, token: env.IDEM_AGENT_TOKEN, retry: { attempts: 40, baseDelayMs: 50, maxDelayMs: 400 } });
const run = await beginAiRun(idem, { runId: env.RUN_ID, tools: TOOLS });
const stopAt = env.STOP_AT_TURN ? Number(env.STOP_AT_TURN) : -1;
const model = scriptedModel(JSON.parse(env.SCRIPT), {
  onTurn: async (n) => {
    if (n !== stopAt) return;
    console.log(JSON.stringify({ between: n }));
    setInterval(() => {}, 1000); // keeps the process alive until killed
    await new Promise(() => {});
  },
});
const result = await step(run, model, [{ role: "user", content: "Book Ana's trip to Tokyo" }]);
console.log(JSON.stringify({ done: result.text, outputs: toolOutputs(result), saga: run.session.sagaId }));
