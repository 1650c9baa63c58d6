// The LangGraph.js adapter (@langchain/langgraph): a ToolNode whose every
// tool call is an idem call, keyed by (thread, tool-call id): one open saga
// per thread (intent key "langgraph:<thread_id>" by default), the model's
// tool-call id as the call id.
//
// A call that waits for a person becomes LangGraph's own interrupt(): the
// graph stops (the checkpointer keeps it) with an interrupt whose value says
// what waits ({idem: {saga_id, call_id, step_id, tool, approval}}); the app
// resumes it with `new Command({resume: {approved, note?, reason?}})`, and
// that resume value becomes idem's decision, taken with the deciding
// person's client (`approver`, or `configurable.idemApprover` of the resuming
// invoke: their credentials, never the agent's; idem refuses a
// self-approval). A rejection fails the call (nothing is done; the ToolMessage
// says so) and the thread's saga stays open for the agent to go on.
//
// On resume LangGraph runs the node again from its start: the calls it made
// before are answered from idem's journal (same call id), nothing is called
// twice; interrupt() then returns the resume value. The node runs a
// message's tool calls one after another (an open saga takes one call at a
// time, and interrupt() matches resume values by order), where ToolNode runs
// them at once. A graph process killed anywhere resumes from its last
// checkpoint the same way.

import { interrupt, type LangGraphRunnableConfig } from "@langchain/langgraph";
import { ToolNode } from "@langchain/langgraph/prebuilt";
import { ToolMessage, isAIMessage, type AIMessage, type BaseMessage } from "@langchain/core/messages";
import type { ToolCall } from "@langchain/core/messages/tool";

import {
  answerText,
  callThroughIdem,
  canonicalJson,
  idemToolName,
  recordDecision,
  sha256Hex,
  type IdemCallOptions,
  type PersonDecision,
} from "./agent_calls.js";
import type { IdemClient, OpenSagaSession } from "./client.js";
import type { ModelDecision } from "./types.js";

type ToolLike = ConstructorParameters<typeof ToolNode>[0][number];

export interface IdemToolNodeOptions extends Omit<IdemCallOptions, "session"> {
  /** The agent's client (its principal makes the calls). */
  client: IdemClient;
  /** The client of the person who decides approvals; `configurable.idemApprover` of the resuming invoke wins. */
  approver?: IdemClient;
  /** The open saga's intent key for a thread (default "langgraph:<thread_id>"). */
  intentKey?: (threadId: string) => string;
  name?: string;
}

/** What the graph's interrupt carries for a call that waits for a person. */
export interface IdemInterrupt {
  idem: {
    saga_id: string;
    call_id: string;
    step_id?: string;
    tool: string;
    approval: Record<string, unknown>;
    /** How to answer: Command({resume: {approved: true, note}}) or {approved: false, reason}. */
    resume_with: string;
  };
}

/** A resume value as a decision: {approved, note?, reason?}, true/false, or "approve"/"reject". */
export function decisionFromResume(value: unknown): PersonDecision {
  if (value === true || value === "approve" || value === "approved") return { approved: true };
  if (value === false || value === "reject" || value === "rejected") return { approved: false };
  if (value && typeof value === "object" && typeof (value as { approved?: unknown }).approved === "boolean") {
    const v = value as { approved: boolean; note?: unknown; reason?: unknown };
    return {
      approved: v.approved,
      ...(typeof v.note === "string" ? { note: v.note } : {}),
      ...(typeof v.reason === "string" ? { reason: v.reason } : {}),
    };
  }
  throw new Error(
    `idem: resume a waiting call with {approved: true|false, note?, reason?}, true/false or "approve"/"reject"; got ${JSON.stringify(value)}`,
  );
}

/**
 * A ToolNode (same input and output: the last AIMessage's tool calls in,
 * `{messages: ToolMessage[]}` out) whose tools run in idem. The tools given
 * lend their names and schemas (as for ToolNode); `toolNames` maps them to
 * idem tools.
 */
export class IdemToolNode extends ToolNode {
  readonly #opts: IdemToolNodeOptions;
  readonly #sessions = new Map<string, Promise<OpenSagaSession>>();

  constructor(tools: ToolLike[], opts: IdemToolNodeOptions) {
    super(tools, { name: opts.name ?? "tools", handleToolErrors: false });
    this.#opts = opts;
  }

  /** The open saga of a thread (begun once; the same key answers the same saga after a restart). */
  session(threadId: string): Promise<OpenSagaSession> {
    let s = this.#sessions.get(threadId);
    if (!s) {
      const names = [...new Set(this.tools.map((t) => idemToolName(this.#opts, t.name)))];
      const key = this.#opts.intentKey ? this.#opts.intentKey(threadId) : `langgraph:${threadId}`;
      s = this.#opts.client.begin({ intent_key: key, tools: names });
      s.catch(() => this.#sessions.delete(threadId));
      this.#sessions.set(threadId, s);
    }
    return s;
  }

  protected override async run(input: unknown, config: LangGraphRunnableConfig): Promise<any> {
    const messages: BaseMessage[] | undefined = Array.isArray(input)
      ? (input as BaseMessage[])
      : (input as { messages?: BaseMessage[] } | undefined)?.messages;
    if (!Array.isArray(messages)) return super.run(input, config);
    const answered = new Set(
      messages.filter((m) => m.getType() === "tool").map((m) => (m as ToolMessage).tool_call_id),
    );
    const ai = [...messages].reverse().find((m) => isAIMessage(m)) as AIMessage | undefined;
    if (!ai) throw new Error("idem: IdemToolNode needs an AIMessage with tool calls in its input");
    const outputs: ToolMessage[] = [];
    for (const call of ai.tool_calls ?? []) {
      if (call.id && answered.has(call.id)) continue;
      outputs.push((await this.runTool(call, config, input)) as ToolMessage);
    }
    return Array.isArray(input) ? outputs : { messages: outputs };
  }

  protected override async runTool(call: ToolCall, config: LangGraphRunnableConfig, state: unknown): Promise<ToolMessage> {
    const threadId = config.configurable?.thread_id;
    if (typeof threadId !== "string" || !threadId) {
      throw new Error("idem: IdemToolNode needs configurable.thread_id (a checkpointer's thread) to key its calls");
    }
    if (!call.id) throw new Error(`idem: tool call ${call.name} has no id to key it by`);
    const known = this.tools.find((t) => t.name === call.name);
    if (!known) return new ToolMessage({ status: "error", content: `Tool "${call.name}" not found.`, name: call.name, tool_call_id: call.id });
    const session = await this.session(threadId);
    const options: IdemCallOptions = { ...this.#opts, session };
    const out = await callThroughIdem(options, call.name, call.args, call.id, await decisionOf(state, call.id), config.signal);
    if (out.refusal !== undefined) {
      return new ToolMessage({ status: "error", content: out.refusal, name: call.name, tool_call_id: call.id });
    }
    let answer = out.answer;
    if (answer.state === "awaiting_approval") {
      const payload: IdemInterrupt = {
        idem: {
          saga_id: session.sagaId,
          call_id: call.id,
          step_id: answer.step_id,
          tool: answer.tool ?? idemToolName(this.#opts, call.name),
          approval: answer.approval as Record<string, unknown>,
          resume_with: "Command({resume: {approved: true, note}}) or Command({resume: {approved: false, reason}})",
        },
      };
      // Throws the first time (the graph stops); returns the resume value on the re-run.
      const decision = decisionFromResume(interrupt(payload));
      const person = (config.configurable?.idemApprover as IdemClient | undefined) ?? this.#opts.approver;
      if (!person) throw new Error("idem: a call waits for a person: pass approver, or configurable.idemApprover when resuming");
      answer = await recordDecision(session, person, call.id, decision, this.#opts.wait ?? 10);
    }
    const toolName = answer.tool ?? idemToolName(this.#opts, call.name);
    const content = answer.state === "succeeded" && !answer.deduplicated ? JSON.stringify(answer.result ?? null) : answerText(answer, toolName);
    return new ToolMessage({
      status: answer.state === "succeeded" ? "success" : "error",
      content,
      name: call.name,
      tool_call_id: call.id,
    });
  }
}

/**
 * The decision of the model step that made a tool call: the AIMessage that
 * holds it (its model name and id) and the SHA-256 of the messages before it.
 */
async function decisionOf(state: unknown, callId: string): Promise<ModelDecision | undefined> {
  const messages = Array.isArray(state) ? state : (state as { messages?: unknown[] } | undefined)?.messages;
  if (!Array.isArray(messages)) return undefined;
  const at = messages.findIndex((m) => isAIMessage(m as BaseMessage) && (m as AIMessage).tool_calls?.some((c) => c.id === callId));
  if (at < 0) return undefined;
  const ai = messages[at] as AIMessage;
  const prompt = messages.slice(0, at).map((m) => {
    const b = m as BaseMessage;
    return { type: b.getType(), content: b.content, tool_calls: (b as AIMessage).tool_calls ?? null };
  });
  const meta = (ai.response_metadata ?? {}) as Record<string, unknown>;
  const model = typeof meta.model_name === "string" ? meta.model_name : typeof meta.model === "string" ? meta.model : "unknown";
  return {
    model,
    ...(ai.id ? { message_id: ai.id } : {}),
    call_id: callId,
    prompt_sha256: await sha256Hex(canonicalJson(prompt)),
  };
}
