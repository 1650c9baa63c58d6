// The OpenAI Agents SDK adapter (@openai/agents): function tools whose every
// invocation is an idem open-saga call keyed by the SDK's tool-call id, and
// whose approvals are the SDK's own (needsApproval, interruptions, RunState).
//
// Where the id comes from: the SDK's runner calls a function tool as
// `invoke(runContext, input, {toolCall})` (agents-core runner/toolExecution:
// `toolDetails = { toolCall: toolRun.toolCall }`), and `tool()` hands the
// same details to `execute(args, runContext, details)`; toolCall is the
// model's function_call item: `callId` (the model's tool-call id, "call_..."),
// `id` (the item id), `name`, `arguments`. The model's own request (the
// prompt) never reaches a tool: DecisionRecorder wraps the Model to see it.
// `needsApproval(runContext, input, callId)` gets the same call id.
//
// Approvals: needsApproval makes the idem call (idem alone knows whether the
// call waits for a person: a two-phase tool with approval, a policy rule);
// when idem answers awaiting_approval, needsApproval is true and the run
// stops with the SDK's interruption (result.interruptions, a
// RunToolApprovalItem). The person decides on the RunState, here or in
// another process after `state.toString()` / `RunState.fromString`;
// `IdemApprovals.approve/reject` record the decision in idem as that person
// (their own client: idem refuses a self-approval) and on the RunState. A
// plain `state.approve(item)` works
// too: the resumed run invokes the tool, which finds the call still waiting
// and records the approval with `approver`. A rejection fails the call in
// idem (nothing is done); the saga stays open for the agent.
//
// The tool's own execute is not run: idem runs the registered idem tool (an
// HTTP tool or an in-process tool of the server) under the journal protocol,
// so the SDK tool contributes its name, description and parameter schema.

import {
  tool,
  type FunctionTool,
  type Model,
  type ModelRequest,
  type ModelResponse,
  type RunContext,
  type RunState,
  type RunToolApprovalItem,
} from "@openai/agents";

import {
  BoundedMap,
  answerText,
  callThroughIdem,
  canonicalJson,
  recordDecision,
  sha256Hex,
  type IdemCallOptions,
  type PersonDecision,
} from "./agent_calls.js";
import type { IdemClient } from "./client.js";
import type { CallAnswer, ModelDecision } from "./types.js";

export { answerText, canonicalJson, sha256Hex } from "./agent_calls.js";

/**
 * Records each model decision: wrap the agent's Model with `wrap()`, and
 * every function call the model emits is remembered with the model's name,
 * the response (message) id, the call id and the SHA-256 of the request the
 * model answered (system instructions and input, as canonical JSON). The
 * adapter sends it with the call, so idem journals what the model saw and
 * decided. `keepPrompt` also sends the prompt text itself.
 */
export class DecisionRecorder {
  readonly #seen: BoundedMap<ModelDecision>;
  readonly #keepPrompt: boolean;

  constructor(opts: { keepPrompt?: boolean; maxEntries?: number } = {}) {
    this.#keepPrompt = opts.keepPrompt ?? false;
    this.#seen = new BoundedMap(opts.maxEntries ?? 10000);
  }

  /** A Model that answers as `model` and records the decisions in its answers. */
  wrap(model: Model, name: string): Model {
    const recorder = this;
    const wrapped: Model = {
      async getResponse(request: ModelRequest): Promise<ModelResponse> {
        const response = await model.getResponse(request);
        await recorder.record(name, request, response);
        return response;
      },
      getStreamedResponse(request: ModelRequest) {
        // Streaming: the decisions are not recorded (the calls still go through idem).
        return model.getStreamedResponse(request);
      },
    };
    if (model.getRetryAdvice) wrapped.getRetryAdvice = model.getRetryAdvice.bind(model);
    return wrapped;
  }

  /** Records the function calls of one model answer. */
  async record(name: string, request: ModelRequest, response: ModelResponse): Promise<void> {
    const prompt = canonicalJson({ system: request.systemInstructions ?? null, input: request.input });
    const promptSha256 = await sha256Hex(prompt);
    for (const item of response.output) {
      if (item.type !== "function_call") continue;
      const decision: ModelDecision = {
        model: name,
        message_id: response.responseId ?? item.id,
        call_id: item.callId,
        prompt_sha256: promptSha256,
      };
      if (this.#keepPrompt) decision.prompt = prompt;
      this.#seen.set(item.callId, decision);
    }
  }

  /** The decision recorded for a call id, if the model's answer passed through wrap(). */
  decisionFor(callId: string): ModelDecision | undefined {
    const seen = this.#seen.get(callId);
    return seen ? { ...seen } : undefined;
  }
}

export interface IdemToolOptions extends IdemCallOptions {
  /** Where the model decisions come from (see DecisionRecorder); without it no decision is sent. */
  decisions?: DecisionRecorder;
  /**
   * How a call that waits for a person reaches the run: `"interrupt"` (the
   * default) through the SDK's needsApproval, so the run stops with an
   * interruption; `"text"`: the model reads that it waits (and the tool has
   * no needsApproval of its own).
   */
  approvals?: "interrupt" | "text";
  /**
   * The client of the person who approves in the SDK (their credentials,
   * never the agent's): a resumed run that finds an approved call still
   * waiting in idem records the approval with it.
   */
  approver?: IdemClient;
  /** Turns an answer into the text the model reads (default: answerText). */
  formatAnswer?: (answer: CallAnswer, tool: string) => string;
}

/** Answers idem gave to needsApproval, for the invoke that follows (no second request). */
const ASKED = new WeakMap<IdemToolOptions, BoundedMap<CallAnswer>>();

function asked(opts: IdemToolOptions): BoundedMap<CallAnswer> {
  let m = ASKED.get(opts);
  if (!m) ASKED.set(opts, (m = new BoundedMap<CallAnswer>(1000)));
  return m;
}

async function askIdem(
  opts: IdemToolOptions,
  sdkName: string,
  args: unknown,
  callId: string | undefined,
  signal?: AbortSignal,
): Promise<string | CallAnswer> {
  const decision = callId ? opts.decisions?.decisionFor(callId) : undefined;
  const out = await callThroughIdem(opts, sdkName, args, callId, decision, signal);
  return out.refusal ?? out.answer;
}

/** needsApproval: idem decides (the call is made here; invoke uses its answer). */
function needsApprovalFor(opts: IdemToolOptions, sdkName: string) {
  return async (_ctx: RunContext<unknown>, input: unknown, callId?: string): Promise<boolean> => {
    const answer = await askIdem(opts, sdkName, input, callId);
    if (typeof answer === "string") return false;
    if (callId) asked(opts).set(callId, answer);
    return answer.state === "awaiting_approval";
  };
}

/** One invocation: the answer needsApproval got, or the call; an approved call still waiting is approved as `approver`. */
async function invokeThroughIdem(
  opts: IdemToolOptions,
  sdkName: string,
  args: unknown,
  details: { toolCall?: { callId: string }; signal?: AbortSignal } | undefined,
): Promise<string> {
  const callId = details?.toolCall?.callId;
  const cached = callId ? asked(opts).get(callId) : undefined;
  if (callId) asked(opts).delete(callId);
  let answer = cached ?? (await askIdem(opts, sdkName, args, callId, details?.signal));
  if (typeof answer === "string") return answer;
  // The SDK runs a tool whose needsApproval said true only once it was approved.
  if (answer.state === "awaiting_approval" && opts.approvals !== "text" && opts.approver && callId) {
    answer = await recordDecision(opts.session, opts.approver, callId, { approved: true }, opts.wait ?? 10);
  }
  return (opts.formatAnswer ?? answerText)(answer, answer.tool ?? sdkName);
}

function parseArgs(input: string): unknown {
  if (input.trim() === "") return {};
  try {
    return JSON.parse(input);
  } catch {
    return undefined;
  }
}

/**
 * Wraps SDK function tools (made with `tool()`) so that each invocation is
 * an idem call on `opts.session`, and a call that waits for a person is the
 * SDK's interruption (unless `approvals: "text"`); the tools keep their
 * names, descriptions and parameter schemas. Tools that are not function
 * tools are returned as they are.
 */
export function idemTools<T extends { type: string }>(tools: T[], opts: IdemToolOptions): T[] {
  return tools.map((t) => {
    if (t.type !== "function") return t;
    const fn = t as unknown as FunctionTool<unknown, any, unknown>;
    const wrapped: FunctionTool<unknown, any, unknown> = {
      ...fn,
      errorFunction: null,
      ...(opts.approvals === "text" ? {} : { needsApproval: needsApprovalFor(opts, fn.name) as any }),
      invoke: async (_ctx: RunContext<unknown>, input: string, details?: any) =>
        invokeThroughIdem(opts, fn.name, parseArgs(input), details),
    };
    return wrapped as unknown as T;
  });
}

/**
 * A function tool for the model that is an idem call: `tool()` with
 * name, description and parameters (a zod object or a JSON schema), and no
 * execute of its own. `idemTool` names the idem tool when it differs.
 */
export function idemTool(
  def: { name: string; description: string; parameters: any; strict?: boolean; idemTool?: string },
  opts: IdemToolOptions,
): FunctionTool<unknown, any, string> {
  const own: IdemToolOptions = def.idemTool
    ? {
        ...opts,
        toolNames: (n: string) =>
          n === def.name ? def.idemTool! : typeof opts.toolNames === "function" ? opts.toolNames(n) : (opts.toolNames?.[n] ?? n),
      }
    : opts;
  return tool({
    name: def.name,
    description: def.description,
    parameters: def.parameters,
    strict: def.strict ?? true,
    errorFunction: null,
    ...(opts.approvals === "text" ? {} : { needsApproval: needsApprovalFor(own, def.name) }),
    execute: (args: unknown, _ctx?: RunContext<unknown>, details?: any) => invokeThroughIdem(own, def.name, args, details),
  } as any) as FunctionTool<unknown, any, string>;
}

/**
 * A person's decisions on the SDK's interruptions, recorded in idem as that
 * person and on the RunState: `approve` lets idem commit the call when the
 * run resumes; `reject` fails the call in idem (nothing is done; the open
 * saga stays open) and tells the model it was not approved.
 */
export class IdemApprovals {
  readonly #opts: Pick<IdemToolOptions, "session" | "wait"> & { approver: IdemClient };

  constructor(opts: Pick<IdemToolOptions, "session" | "wait"> & { approver: IdemClient }) {
    this.#opts = opts;
  }

  /** Approves `item` in idem (as the approver) and on `state`; resume the run with `state` afterwards. */
  async approve(state: RunState<any, any>, item: RunToolApprovalItem, opts: { note?: string } = {}): Promise<CallAnswer> {
    const answer = await this.#decide(item, { approved: true, note: opts.note });
    state.approve(item);
    return answer;
  }

  /** Rejects `item` in idem (the call fails, nothing is done) and on `state`. */
  async reject(state: RunState<any, any>, item: RunToolApprovalItem, opts: { reason: string }): Promise<CallAnswer> {
    const answer = await this.#decide(item, { approved: false, reason: opts.reason });
    state.reject(item, { message: `A person rejected this call: ${opts.reason}. Nothing was done.` });
    return answer;
  }

  #decide(item: RunToolApprovalItem, decision: PersonDecision): Promise<CallAnswer> {
    const callId = (item.rawItem as { callId?: string }).callId;
    if (!callId) throw new Error("idem: this interruption is not a function tool call (no call id)");
    return recordDecision(this.#opts.session, this.#opts.approver, callId, decision, this.#opts.wait ?? 10);
  }
}
