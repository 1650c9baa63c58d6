// A crash test's graph process on LangGraph.js: runs (or, with RESUME=1,
// resumes from its PostgreSQL checkpoint) the travel graph on THREAD; prints
// {"started": true} once invoked and {"done": <last message>} at the end.

import { IdemClient } from "../../dist/index.js";
import { travelGraph } from "../langgraph_agent.mjs";

const env = process.env;
const idem = new IdemClient({ baseUrl: env.IDEM_URL, token: env.IDEM_AGENT_TOKEN, retry: { attempts: 40, baseDelayMs: 50, maxDelayMs: 400 } });
const { graph, checkpointer } = await travelGraph({ pgUrl: env.PG_URL, script: JSON.parse(env.SCRIPT), idem });
const config = { configurable: { thread_id: env.THREAD } };
console.log(JSON.stringify({ started: true }));
const out = await graph.invoke(env.RESUME ? null : { messages: [{ role: "user", content: "Book Ana's trip to Tokyo" }] }, config);
const last = out.messages.at(-1);
const tools = out.messages.filter((m) => m.getType() === "tool").map((m) => ({ id: m.tool_call_id, content: m.content }));
console.log(JSON.stringify({ done: last.content, tools }));
await checkpointer.end();
