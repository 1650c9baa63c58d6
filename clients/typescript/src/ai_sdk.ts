// The Vercel AI SDK adapter (package `ai`, v6): idem's tools as AI SDK
// tools. One agent run is one open saga (begun under the run's key); each
// tool execution is a call in it, keyed by the SDK's toolCallId, with the
// model's step as the decision; a call that waits for a person is the SDK's
// own tool approval.
//
// How the SDK's approval maps onto idem's (ai 6: `needsApproval`,
// `tool-approval-request` / `tool-approval-response` parts):
//   - needsApproval(input, {toolCallId, messages}) makes the idem call: idem
//     alone knows whether it waits for a person (a two-phase tool with
//     approval, a policy rule). awaiting_approval -> true: generateText ends
//     the step with a tool-approval-request for the app to show.
//   - The person answers in the app; the app appends the
//     tool-approval-response and calls generateText again. The SDK asks
//     needsApproval again (true: the request is in the messages) and then
//     executes an approved call: execute records the approval in idem with
//     the person's client (`approver`, their credentials: idem refuses a
//     self-approval), and answers the committed outcome.
//   - A denied call is not executed: the SDK hands the model an
//     `execution-denied` tool result. The wrapped model (`run.model()`)
//     records that rejection in idem before the model reads it: idem fails
//     the call (nothing is done), and the run goes on; `run.rollback()`
//     undoes the calls already made, in reverse.
// A call the SDK executes without approval uses the answer needsApproval
// got (no second request). With streamText the decisions are not recorded
// (the middleware wraps generate only); denials and calls work the same. Run again after a crash with the same run key and
// the same tool-call ids: idem answers what it already did from its journal.

import { tool as aiTool, wrapLanguageModel, type FlexibleSchema, type Tool, type ToolSet } from "ai";

import {
  BoundedMap,
  answerText,
  callThroughIdem,
  canonicalJson,
  idemToolName,
  recordDecision,
  sha256Hex,
  type IdemCallOptions,
} from "./agent_calls.js";
import type { IdemClient, OpenSagaSession } from "./client.js";
import type { CallAnswer, CommitAnswer, ModelDecision, RollbackAnswer } from "./types.js";

/** The SDK's model type (LanguageModelV3), without depending on @ai-sdk/provider. */
export type AiModel = Parameters<typeof wrapLanguageModel>[0]["model"];

/** One tool the model may call: what the SDK shows it, and the idem tool it runs. */
export interface AiToolDef {
  description?: string;
  /** A zod schema or `jsonSchema(...)`: the model's arguments. */
  inputSchema: FlexibleSchema<any>;
  /** The idem tool (default: the SDK name, or `toolNames`'s mapping). */
  idemTool?: string;
}

export interface IdemAiRunOptions extends Omit<IdemCallOptions, "session"> {
  /** The agent run's key: one open saga per run (its intent key). Run again with the same key after a crash. */
  runId: string;
  /** The SDK tool name -> its definition. */
  tools: Record<string, AiToolDef>;
  /** The client of the person who decides approvals in the app (never the agent's). */
  approver?: IdemClient;
  /** Also journal the prompt text of each decision (default: only its SHA-256). */
  keepPrompt?: boolean;
  metadata?: Record<string, unknown>;
  idle_timeout?: string;
  on_idle?: "rollback" | "park";
}

/**
 * Begins (or, with the same run key, finds again) the run's open saga and
 * returns its AI SDK tools and model wrapper:
 *
 *   const run = await beginAiRun(idem, { runId, tools, approver: personClient });
 *   const result = await generateText({ model: run.model(model), tools: run.tools, messages, stopWhen });
 *   // result.content may hold tool-approval-request parts: show them to the person
 *   await run.commit();   // or run.rollback({reason})
 */
export async function beginAiRun(client: IdemClient, opts: IdemAiRunOptions): Promise<IdemAiRun> {
  if (!opts?.runId) throw new TypeError("idem: beginAiRun needs runId (one open saga per agent run)");
  const names = Object.entries(opts.tools).map(([name, def]) => def.idemTool ?? idemToolName(opts, name));
  const session = await client.begin({
    intent_key: opts.runId,
    tools: [...new Set(names)],
    ...(opts.metadata ? { metadata: opts.metadata } : {}),
    ...(opts.idle_timeout ? { idle_timeout: opts.idle_timeout } : {}),
    ...(opts.on_idle ? { on_idle: opts.on_idle } : {}),
  });
  return new IdemAiRun(session, opts);
}

type Part = { type?: string; toolCallId?: string; approvalId?: string; reason?: string; output?: { type?: string; reason?: string } };
type Message = { role?: string; content?: unknown };

function parts(messages: readonly Message[] | undefined, role: string): Part[] {
  const out: Part[] = [];
  for (const m of messages ?? []) if (m.role === role && Array.isArray(m.content)) out.push(...(m.content as Part[]));
  return out;
}

/** The approval request the SDK made for a tool call, and the person's response to it, from the messages. */
function approvalOf(messages: readonly Message[] | undefined, toolCallId: string) {
  const request = parts(messages, "assistant").find((p) => p.type === "tool-approval-request" && p.toolCallId === toolCallId);
  const response = request
    ? parts(messages, "tool").find((p) => p.type === "tool-approval-response" && p.approvalId === request.approvalId)
    : undefined;
  return { request, response };
}

/** One agent run on one open saga: its tools, its model wrapper, and the end of the run. */
export class IdemAiRun {
  readonly session: OpenSagaSession;
  /** The AI SDK tools (pass as `tools` to generateText / streamText / an Agent). */
  readonly tools: ToolSet;
  readonly #opts: IdemAiRunOptions;
  readonly #decisions = new BoundedMap<ModelDecision>(10000);
  readonly #asked = new BoundedMap<CallAnswer>(1000);
  readonly #rejected = new BoundedMap<true>(1000);

  constructor(session: OpenSagaSession, opts: IdemAiRunOptions) {
    this.session = session;
    this.#opts = opts;
    const tools: ToolSet = {};
    for (const [name, def] of Object.entries(opts.tools)) tools[name] = this.#tool(name, def);
    this.tools = tools;
  }

  /**
   * The model, wrapped: each of its steps is recorded as the decision of the
   * tool calls it makes (model id, response id, call id, the prompt's
   * SHA-256), and a call the person denied in the SDK is rejected in idem
   * before the model reads the denial.
   */
  model(model: AiModel): AiModel {
    return wrapLanguageModel({
      model,
      middleware: {
        specificationVersion: "v3",
        transformParams: async ({ params }) => {
          await this.#recordDenials(params.prompt as Message[]);
          return params;
        },
        wrapGenerate: async ({ doGenerate, params, model: inner }) => {
          const result = await doGenerate();
          const prompt = canonicalJson(params.prompt);
          const sha = await sha256Hex(prompt);
          for (const part of result.content) {
            if (part.type !== "tool-call") continue;
            this.#decisions.set(part.toolCallId, {
              model: inner.modelId,
              message_id: result.response?.id ?? part.toolCallId,
              call_id: part.toolCallId,
              prompt_sha256: sha,
              ...(this.#opts.keepPrompt ? { prompt } : {}),
            });
          }
          return result;
        },
      },
    });
  }

  /** The open saga succeeds (every call's effect stays). */
  commit(opts: { wait?: number } = {}): Promise<CommitAnswer> {
    return this.session.commit({}, { wait: opts.wait ?? 10 });
  }

  /** Every completed call is undone in reverse order. */
  rollback(opts: { reason?: string; wait?: number } = {}): Promise<RollbackAnswer> {
    return this.session.rollback(opts.reason ? { reason: opts.reason } : {}, { wait: opts.wait ?? 10 });
  }

  #callOptions(def: AiToolDef): IdemCallOptions {
    const o = this.#opts;
    return {
      session: this.session,
      toolNames: def.idemTool ? () => def.idemTool! : o.toolNames,
      wait: o.wait,
      repeatable: o.repeatable,
    };
  }

  async #ask(name: string, def: AiToolDef, input: unknown, toolCallId: string, signal?: AbortSignal) {
    const out = await callThroughIdem(this.#callOptions(def), name, input, toolCallId, this.#decisions.get(toolCallId), signal);
    return out.refusal ?? out.answer;
  }

  #tool(name: string, def: AiToolDef): Tool {
    return aiTool<any, unknown>({
      description: def.description,
      inputSchema: def.inputSchema,
      needsApproval: async (input: unknown, { toolCallId, messages }: { toolCallId: string; messages: Message[] }) => {
        // Asked again once the person answered: the SDK's request stands.
        if (approvalOf(messages, toolCallId).request) return true;
        const answer = await this.#ask(name, def, input, toolCallId);
        if (typeof answer === "string") return false;
        this.#asked.set(toolCallId, answer);
        return answer.state === "awaiting_approval";
      },
      execute: async (
        input: unknown,
        { toolCallId, messages, abortSignal }: { toolCallId: string; messages: Message[]; abortSignal?: AbortSignal },
      ) => {
        const cached = this.#asked.get(toolCallId);
        this.#asked.delete(toolCallId);
        let answer = cached ?? (await this.#ask(name, def, input, toolCallId, abortSignal));
        if (typeof answer === "string") return answer;
        if (answer.state === "awaiting_approval") {
          // Executed while idem waits: the person approved it in the SDK.
          const { response } = approvalOf(messages, toolCallId);
          if (!this.#opts.approver) {
            throw new Error(`idem: call ${toolCallId} was approved in the SDK; pass approver (the person's client) to record it`);
          }
          answer = await recordDecision(this.session, this.#opts.approver, toolCallId, {
            approved: true,
            ...(response?.reason ? { note: response.reason } : {}),
          }, this.#opts.wait ?? 10);
        }
        const toolName = answer.tool ?? def.idemTool ?? name;
        return answer.state === "succeeded" && !answer.deduplicated ? (answer.result ?? null) : answerText(answer, toolName);
      },
    } as any) as Tool;
  }

  async #recordDenials(prompt: readonly Message[]): Promise<void> {
    for (const part of parts(prompt, "tool")) {
      if (part.type !== "tool-result" || part.output?.type !== "execution-denied" || !part.toolCallId) continue;
      if (this.#rejected.get(part.toolCallId)) continue;
      const now = await this.session.getCall(part.toolCallId).catch(() => undefined);
      if (now?.state !== "awaiting_approval") continue; // not ours, or decided already
      if (!this.#opts.approver) {
        throw new Error(`idem: call ${part.toolCallId} was denied in the SDK; pass approver (the person's client) to record it`);
      }
      await recordDecision(this.session, this.#opts.approver, part.toolCallId, {
        approved: false,
        reason: part.output.reason || "denied in the agent framework",
      }, this.#opts.wait ?? 10);
      this.#rejected.set(part.toolCallId, true);
    }
  }
}
