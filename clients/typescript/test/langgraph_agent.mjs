// A travel agent graph on LangGraph.js for the tests: an agent node with a
// scripted chat model (@langchain/core's FakeStreamingChatModel, answering
// turn N = the AI messages in its input, so a resumed graph answers the same
// way), the IdemToolNode, and PostgresSaver as the checkpointer (a real
// PostgreSQL started by the test: the graph survives its process).

import { AIMessage } from "@langchain/core/messages";
import { tool } from "@langchain/core/tools";
import { FakeStreamingChatModel } from "@langchain/core/utils/testing";
import { END, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { PostgresSaver } from "@langchain/langgraph-checkpoint-postgres";
import { toolsCondition } from "@langchain/langgraph/prebuilt";
import { z } from "zod";

import { IdemToolNode } from "../dist/langgraph.js";

export const FLIGHT = { traveller: "Ana", from: "LIS", to: "NRT", date: "2026-12-01", return_date: "2026-12-08", currency: "EUR" };
export const HOTEL = { traveller: "Ana", city: "Tokyo", check_in: "2026-12-01", check_out: "2026-12-08", currency: "EUR" };
export const CHARGE = { traveller: "Ana", amount_cents: 184000, currency: "EUR", description: "Tokyo trip" };

const notHere = async () => {
  throw new Error("runs in idem, not in the graph");
};

/** The tools as an agent builder writes them for ToolNode: names and schemas (idem runs them). */
export const TOOLS = [
  tool(notHere, {
    name: "reserve_flight",
    description: "Reserve a flight",
    schema: z.object({ traveller: z.string(), from: z.string(), to: z.string(), date: z.string(), return_date: z.string(), currency: z.string() }),
  }),
  tool(notHere, {
    name: "book_hotel",
    description: "Book a hotel room",
    schema: z.object({ traveller: z.string(), city: z.string(), check_in: z.string(), check_out: z.string(), currency: z.string() }),
  }),
  tool(notHere, {
    name: "charge_card",
    description: "Charge the traveller's card",
    schema: z.object({ traveller: z.string(), amount_cents: z.number().int(), currency: z.string(), description: z.string() }),
  }),
];
export const TOOL_NAMES = { reserve_flight: "flights.reserve", book_hotel: "hotels.book", charge_card: "payments.charge" };

/** The testing utilities' fake chat model, scripted by turn instead of always its first response. */
class ScriptedChatModel extends FakeStreamingChatModel {
  constructor(script) {
    super({ responses: [] });
    this.script = script;
  }
  bindTools() {
    return this;
  }
  async _generate(messages) {
    const n = messages.filter((m) => m.getType() === "ai").length;
    const turn = this.script[n];
    if (turn === undefined) throw new Error(`scripted model: no turn ${n}`);
    const message =
      typeof turn === "string"
        ? new AIMessage({ content: turn, id: `ai_${n}`, response_metadata: { model_name: "fake-travel" } })
        : new AIMessage({
            content: "",
            id: `ai_${n}`,
            response_metadata: { model_name: "fake-travel" },
            tool_calls: turn.map((c) => ({ name: c.call, args: c.args, id: c.id, type: "tool_call" })),
          });
    return { generations: [{ text: typeof turn === "string" ? turn : "", message }] };
  }
}

/** The compiled graph: agent -> tools (idem) -> agent ..., checkpointed in PostgreSQL at `pgUrl`. */
export async function travelGraph({ pgUrl, script, idem, approver }) {
  const checkpointer = PostgresSaver.fromConnString(pgUrl);
  await checkpointer.setup();
  const model = new ScriptedChatModel(script).bindTools(TOOLS);
  const tools = new IdemToolNode(TOOLS, { client: idem, approver, toolNames: TOOL_NAMES, wait: 10 });
  const graph = new StateGraph(MessagesAnnotation)
    .addNode("agent", async (state) => ({ messages: [await model.invoke(state.messages)] }))
    .addNode("tools", tools)
    .addEdge(START, "agent")
    .addConditionalEdges("agent", toolsCondition, ["tools", END])
    .addEdge("tools", "agent")
    .compile({ checkpointer });
  return { graph, tools, checkpointer };
}
