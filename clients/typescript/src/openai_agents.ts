// The OpenAI Agents SDK adapter (@openai/agents): function tools whose every
// invocation is an idem open-saga call keyed by the SDK's tool-call id.
//
// Where the id comes from: the SDK's runner calls a function tool as
// `invoke(runContext, input, {toolCall})` (agents-core runner/toolExecution:
// `toolDetails = { toolCall: toolRun.toolCall }`), and `tool()` hands the
// same details to `execute(args, runContext, details)`; toolCall is the
// model's function_call item: `callId` (the model's tool-call id, "call_..."),
// `id` (the item id), `name`, `arguments`. The model's own request (the
// prompt) never reaches a tool: DecisionRecorder wraps the Model to see it.
//
// The tool's own execute is not run: idem runs the registered idem tool (an
// HTTP tool or an in-process tool of the server) under the journal protocol,
// so the SDK tool contributes its name, description and parameter schema.

import { tool, type FunctionTool, type Model, type ModelRequest, type ModelResponse, type RunContext } from "@openai/agents";

import { IdemError } from "./errors.js";
import type { OpenSagaSession } from "./client.js";
import type { CallAnswer, ModelDecision } from "./types.js";

/** What the model decided for one tool call, as seen by DecisionRecorder. */
interface Seen {
  decision: ModelDecision;
}

/**
 * Records each model decision: wrap the agent's Model with `wrap()`, and
 * every function call the model emits is remembered with the model's name,
 * the response (message) id, the call id and the SHA-256 of the request the
 * model answered (system instructions and input, as canonical JSON). The
 * adapter sends it with the call, so idem journals what the model saw and
 * decided. `keepPrompt` also sends the prompt text itself.
 */
export class DecisionRecorder {
  readonly #seen = new Map<string, Seen>();
  readonly #keepPrompt: boolean;
  readonly #maxEntries: number;

  constructor(opts: { keepPrompt?: boolean; maxEntries?: number } = {}) {
    this.#keepPrompt = opts.keepPrompt ?? false;
    this.#maxEntries = opts.maxEntries ?? 10000;
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
      this.#seen.set(item.callId, { decision });
      if (this.#seen.size > this.#maxEntries) {
        const oldest = this.#seen.keys().next().value;
        if (oldest !== undefined) this.#seen.delete(oldest);
      }
    }
  }

  /** The decision recorded for a call id, if the model's answer passed through wrap(). */
  decisionFor(callId: string): ModelDecision | undefined {
    const seen = this.#seen.get(callId);
    return seen ? { ...seen.decision } : undefined;
  }
}

export interface IdemToolOptions {
  /** The open saga the calls belong to. */
  session: OpenSagaSession;
  /** The SDK tool's name → the idem tool's (default: the same name). */
  toolNames?: Record<string, string> | ((sdkName: string) => string);
  /** Where the model decisions come from (see DecisionRecorder); without it no decision is sent. */
  decisions?: DecisionRecorder;
  /** Prefer: wait=N for each call: seconds the server may hold the answer. */
  wait?: number;
  /** Tools whose repeated arguments mean a second effect (sent as repeat: true). */
  repeatable?: string[];
  /** Turns an answer into the text the model reads (default: answerText). */
  formatAnswer?: (answer: CallAnswer, tool: string) => string;
}

/**
 * The text the model reads for an answer: the result (as JSON, with a note
 * when idem answered a repeated call from its journal), "waiting for
 * approval" with what the person sees, or the failure.
 */
export function answerText(answer: CallAnswer, toolName: string): string {
  switch (answer.state) {
    case "succeeded": {
      if (!answer.deduplicated) return JSON.stringify(answer.result ?? null);
      return JSON.stringify({
        result: answer.result ?? null,
        note:
          `idem answered this from its journal: this call repeats ${answer.duplicate_of ?? "an earlier call"}` +
          ` (${answer.reason ?? "same call"}); nothing was done again`,
      });
    }
    case "failed":
    case "rejected": {
      const e = answer.error ?? { code: answer.state, message: "", retryable: false };
      return (
        `${toolName} failed (${e.code}): ${e.message}. ` +
        (e.retryable ? "It may be retried." : "Do not retry it with the same arguments.")
      );
    }
    case "awaiting_approval": {
      const a = answer.approval ?? {};
      const where = [a.approve_at?.ui, a.approve_at?.api, a.approve_at?.cli].filter(Boolean).join(", ");
      return (
        `${toolName} is waiting for a person's approval` +
        (a.summary ? `: ${a.summary}` : "") +
        (a.expires_at ? ` (until ${a.expires_at})` : "") +
        (where ? `. It is approved at ${where}` : "") +
        ". Nothing is done until then; ask again later with the same arguments to learn the outcome."
      );
    }
    default:
      return (
        `${toolName}: the outcome is not known yet (${answer.state}); idem settles it. ` +
        "Ask again later with the same arguments; do not assume it failed."
      );
  }
}

function idemName(opts: IdemToolOptions, sdkName: string): string {
  const m = opts.toolNames;
  if (typeof m === "function") return m(sdkName);
  return m?.[sdkName] ?? sdkName;
}

/**
 * One invocation of an SDK tool as an idem call: keyed by the SDK's
 * tool-call id, with the model decision. Refusals the model can act on (bad
 * arguments, a tool not allowed) become text for the model; an outcome that
 * is not known (the server unreachable after the retries, 5xx), a saga that
 * is no longer open or bad credentials are thrown, so the run stops and can
 * be resumed with the same call id.
 */
async function callThroughIdem(
  opts: IdemToolOptions,
  sdkName: string,
  args: unknown,
  details: { toolCall?: { callId: string; id?: string }; signal?: AbortSignal } | undefined,
): Promise<string> {
  const callId = details?.toolCall?.callId;
  if (!callId) {
    throw new Error(`idem: tool ${sdkName} was invoked without the SDK's tool call (no call id to key it by)`);
  }
  const toolName = idemName(opts, sdkName);
  if (args === null || typeof args !== "object" || Array.isArray(args)) {
    return `${toolName}: the arguments must be a JSON object`;
  }
  // idem requires the model and the prompt's SHA-256 in a decision: without
  // a recorder that saw the model's answer there is none to send.
  const decision: ModelDecision | undefined = opts.decisions?.decisionFor(callId);
  try {
    const answer = await opts.session.call(
      {
        call_id: callId,
        tool: toolName,
        args: args as Record<string, unknown>,
        ...(opts.repeatable?.includes(toolName) ? { repeat: true } : {}),
        ...(decision ? { decision } : {}),
      },
      { wait: opts.wait, signal: details?.signal },
    );
    return (opts.formatAnswer ?? answerText)(answer, toolName);
  } catch (e) {
    const refused = ["invalid", "forbidden", "conflict", "call_id_reused"];
    if (e instanceof IdemError && refused.includes(e.kind)) {
      return `${toolName} was refused by idem (${e.problemName}): ${e.detail || e.title}`;
    }
    throw e;
  }
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
 * an idem call on `opts.session`; the tools keep their names, descriptions,
 * parameter schemas and approval policy. Tools that are not function tools
 * are returned as they are.
 */
export function idemTools<T extends { type: string }>(tools: T[], opts: IdemToolOptions): T[] {
  return tools.map((t) => {
    if (t.type !== "function") return t;
    const fn = t as unknown as FunctionTool<unknown, any, unknown>;
    const wrapped: FunctionTool<unknown, any, unknown> = {
      ...fn,
      errorFunction: null,
      invoke: async (_ctx: RunContext<unknown>, input: string, details?: any) =>
        callThroughIdem(opts, fn.name, parseArgs(input), details),
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
    ? { ...opts, toolNames: (n: string) => (n === def.name ? def.idemTool! : idemName(opts, n)) }
    : opts;
  return tool({
    name: def.name,
    description: def.description,
    parameters: def.parameters,
    strict: def.strict ?? true,
    errorFunction: null,
    execute: (args: unknown, _ctx?: RunContext<unknown>, details?: any) => callThroughIdem(own, def.name, args, details),
  } as any) as FunctionTool<unknown, any, string>;
}

/** Canonical JSON: object keys sorted, no spaces (the prompt's fingerprint input). */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== "object") return JSON.stringify(value ?? null);
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  const obj = value as Record<string, unknown>;
  const keys = Object.keys(obj)
    .filter((k) => obj[k] !== undefined)
    .sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(obj[k])}`).join(",")}}`;
}

/** Hex SHA-256 of a UTF-8 string (the platform's Web Crypto). */
export async function sha256Hex(text: string): Promise<string> {
  const digest = await globalThis.crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}
