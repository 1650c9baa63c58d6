// A scripted model for the OpenAI Agents SDK (its Model interface): each
// getResponse answers the next turn of the script, so a test decides which
// tool calls "the model" makes, in which order, with which call ids, with no
// network. It keeps every request it was sent (what the model "saw").

import { Agent, Runner, Usage, tool } from "@openai/agents";
import { z } from "zod";

export class ScriptedModel {
  /**
   * @param turns one entry per model answer: an array of
   *   {call: sdkToolName, args, callId} (tool calls, run by the SDK in that
   *   turn) and/or {text} (a final message).
   */
  constructor(turns) {
    this.turns = turns;
    this.requests = [];
    this.n = 0;
  }

  async getResponse(request) {
    this.requests.push(request);
    const turn = this.turns[this.n++];
    if (!turn) throw new Error(`scripted model: no turn ${this.n} in the script`);
    const output = turn.map((item, i) =>
      item.call
        ? {
            type: "function_call",
            id: `fc_${this.n}_${i}`,
            callId: item.callId,
            name: item.call,
            arguments: JSON.stringify(item.args),
            status: "completed",
          }
        : {
            type: "message",
            id: `msg_${this.n}_${i}`,
            role: "assistant",
            status: "completed",
            content: [{ type: "output_text", text: item.text }],
          },
    );
    return { usage: new Usage(), output, responseId: `resp_${this.n}` };
  }

  getStreamedResponse() {
    throw new Error("scripted model: streaming is not scripted");
  }

  /** The tool outputs the model was shown, by call id, over all requests. */
  toolOutputs() {
    const out = {};
    for (const r of this.requests) {
      if (!Array.isArray(r.input)) continue;
      for (const item of r.input) {
        if (item.type !== "function_call_result") continue;
        const o = item.output;
        out[item.callId] = typeof o === "string" ? o : (o?.text ?? JSON.stringify(o));
      }
    }
    return out;
  }
}

const TRAVELLER = z.string();
const DATE = z.string();

/**
 * The travel tools as an agent builder writes them with the SDK's tool():
 * their own execute is never run once wrapped by idemTools (idem calls the
 * providers), so it says so.
 */
export function travelTools() {
  const notHere = async () => {
    throw new Error("runs in idem, not in the agent");
  };
  return [
    tool({
      name: "reserve_flight",
      description: "Reserve a flight",
      parameters: z.object({ traveller: TRAVELLER, from: z.string(), to: z.string(), date: DATE, return_date: DATE, currency: z.string() }),
      execute: notHere,
    }),
    tool({
      name: "book_hotel",
      description: "Book a hotel room",
      parameters: z.object({ traveller: TRAVELLER, city: z.string(), check_in: DATE, check_out: DATE, currency: z.string() }),
      execute: notHere,
    }),
    tool({
      name: "rent_car",
      description: "Rent a car",
      parameters: z.object({ traveller: TRAVELLER, city: z.string(), from: DATE, until: DATE }),
      execute: notHere,
    }),
  ];
}

/** The card charge (payments.charge in idem: two-phase, waits for a person in the tests' tools file). */
export function chargeTool() {
  return tool({
    name: "charge_card",
    description: "Charge the traveller's card",
    parameters: z.object({ traveller: TRAVELLER, amount_cents: z.number().int(), currency: z.string(), description: z.string() }),
    execute: async () => {
      throw new Error("runs in idem, not in the agent");
    },
  });
}

export const CHARGE = { traveller: "Ana", amount_cents: 184000, currency: "EUR", description: "Tokyo trip" };

/** SDK tool name -> idem tool name. */
export const TRAVEL_TOOL_NAMES = { reserve_flight: "flights.reserve", book_hotel: "hotels.book", rent_car: "cars.rent" };

export const FLIGHT = { traveller: "Ana", from: "LIS", to: "NRT", date: "2026-12-01", return_date: "2026-12-08", currency: "EUR" };
export const HOTEL = { traveller: "Ana", city: "Tokyo", check_in: "2026-12-01", check_out: "2026-12-08", currency: "EUR" };
export const CAR = { traveller: "Ana", city: "Tokyo", from: "2026-12-01", until: "2026-12-08" };

/** Runs `model` as a travel agent with `tools`; no tracing, no network. */
export async function runAgent(model, tools, input = "Book Ana's trip to Tokyo") {
  const agent = new Agent({
    name: "travel",
    instructions: "Book the trip the user asks for, one tool call at a time.",
    model,
    tools,
  });
  const runner = new Runner({ tracingDisabled: true });
  return runner.run(agent, input, { maxTurns: 12 });
}
