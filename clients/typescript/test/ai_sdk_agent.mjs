// A travel agent on the Vercel AI SDK for the tests: the travel tools as
// idem tool definitions (zod schemas), a mock language model from `ai/test`
// whose answers are scripted by turn (the number of assistant messages in
// its prompt, so a run started again answers the same way), and one agent
// step loop (generateText with the run's tools and wrapped model).

import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV3 } from "ai/test";
import { z } from "zod";

export const FLIGHT = { traveller: "Ana", from: "LIS", to: "NRT", date: "2026-12-01", return_date: "2026-12-08", currency: "EUR" };
export const HOTEL = { traveller: "Ana", city: "Tokyo", check_in: "2026-12-01", check_out: "2026-12-08", currency: "EUR" };
export const CAR = { traveller: "Ana", city: "Tokyo", from: "2026-12-01", until: "2026-12-08" };
export const CHARGE = { traveller: "Ana", amount_cents: 184000, currency: "EUR", description: "Tokyo trip" };

/** The SDK tools' definitions: name, schema and the idem tool each runs. */
export const TOOLS = {
  reserve_flight: {
    description: "Reserve a flight",
    inputSchema: z.object({ traveller: z.string(), from: z.string(), to: z.string(), date: z.string(), return_date: z.string(), currency: z.string() }),
    idemTool: "flights.reserve",
  },
  book_hotel: {
    description: "Book a hotel room",
    inputSchema: z.object({ traveller: z.string(), city: z.string(), check_in: z.string(), check_out: z.string(), currency: z.string() }),
    idemTool: "hotels.book",
  },
  rent_car: {
    description: "Rent a car",
    inputSchema: z.object({ traveller: z.string(), city: z.string(), from: z.string(), until: z.string() }),
    idemTool: "cars.rent",
  },
  charge_card: {
    description: "Charge the traveller's card",
    inputSchema: z.object({ traveller: z.string(), amount_cents: z.number().int(), currency: z.string(), description: z.string() }),
    idemTool: "payments.charge",
  },
};

const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined }, outputTokens: { total: 1, text: 1, reasoning: undefined } };

/**
 * `ai/test`'s MockLanguageModelV3, answering turn N (N = assistant messages
 * in the prompt) with script[N]: [{call, args, id}, ...] tool calls, or a
 * text. `onTurn(n)` runs first (a crash test stops there).
 */
export function scriptedModel(script, { onTurn } = {}) {
  return new MockLanguageModelV3({
    modelId: "mock-travel",
    doGenerate: async (options) => {
      const n = options.prompt.filter((m) => m.role === "assistant").length;
      if (onTurn) await onTurn(n);
      const turn = script[n];
      if (turn === undefined) throw new Error(`scripted model: no turn ${n}`);
      const content =
        typeof turn === "string"
          ? [{ type: "text", text: turn }]
          : turn.map((c) => ({ type: "tool-call", toolCallId: c.id, toolName: c.call, input: JSON.stringify(c.args) }));
      return {
        content,
        finishReason: { unified: typeof turn === "string" ? "stop" : "tool-calls", raw: undefined },
        usage,
        warnings: [],
        response: { id: `resp_${n}`, modelId: "mock-travel", timestamp: new Date(0) },
      };
    },
  });
}

/** One generateText loop of the run (up to 10 steps), from `messages`. */
export function step(run, model, messages) {
  return generateText({ model: run.model(model), tools: run.tools, messages, stopWhen: stepCountIs(10) });
}

/**
 * The tool outputs the run produced, by tool-call id: its steps' results,
 * and the approved calls the SDK executed before its first step (those are
 * only in the response messages).
 */
export function toolOutputs(result) {
  const out = {};
  for (const m of result.response.messages) {
    if (m.role !== "tool") continue;
    for (const p of m.content) if (p.type === "tool-result") out[p.toolCallId] = p.output?.value ?? p.output;
  }
  for (const s of result.steps) for (const r of s.toolResults) out[r.toolCallId] = r.output;
  return out;
}

/** The approval requests a result ends with. */
export function approvalRequests(result) {
  return result.content.filter((p) => p.type === "tool-approval-request");
}
