// What every framework adapter shares (OpenAI Agents SDK, Vercel AI SDK,
// LangGraph.js): one tool invocation as an idem open-saga call keyed by the
// framework's tool-call id, the text a model reads for an answer, and the
// bridge that turns a person's decision in the framework (an approval, a
// rejection) into idem's recorded decision, taken with that person's own
// credentials: idem refuses a self-approval, so the agent's principal never
// approves its own calls. In an open saga a rejection fails that call
// (nothing is done) and leaves the saga open: the agent reads the refusal
// and goes on, commits what it did, or rolls it all back.

import type { IdemClient, OpenSagaSession } from "./client.js";
import { IdemError } from "./errors.js";
import type { CallAnswer, ModelDecision } from "./types.js";
import { DECIDED_PROBLEMS } from "./vocabulary.js";

/** Options every adapter takes for its calls. */
export interface IdemCallOptions {
  /** The open saga the calls belong to. */
  session: OpenSagaSession;
  /** The framework's tool name → the idem tool's (default: the same name). */
  toolNames?: Record<string, string> | ((frameworkName: string) => string);
  /**
   * Seconds to wait for the outcome of a call idem answered `processing` or
   * `unknown` (GET .../calls/{id} with Prefer: wait=N). The call itself is
   * sent without a wait: the server would hold a call that waits for a
   * person for the whole wait, and the framework should show it at once.
   */
  wait?: number;
  /** Idem tools whose repeated arguments mean a second effect (sent with repeat: true). */
  repeatable?: string[];
}

/** The idem tool name for a framework tool name. */
export function idemToolName(opts: Pick<IdemCallOptions, "toolNames">, frameworkName: string): string {
  const m = opts.toolNames;
  if (typeof m === "function") return m(frameworkName);
  return m?.[frameworkName] ?? frameworkName;
}

/** What one invocation came to: the call's answer, or a refusal the model can act on. */
export type CallOutcome = { answer: CallAnswer; refusal?: undefined } | { answer?: undefined; refusal: string };

/**
 * One tool invocation as an idem call keyed by the framework's tool-call id,
 * with the model decision when there is one. Refusals the model can act on
 * (bad arguments, a tool not allowed, a conflict) come back as `refusal`
 * text; an outcome that is not known (no answer after the retries, 5xx), a
 * saga no longer open or bad credentials are thrown, so the run stops and
 * can be resumed with the same call id.
 */
export async function callThroughIdem(
  opts: IdemCallOptions,
  frameworkName: string,
  args: unknown,
  callId: string | undefined,
  decision?: ModelDecision,
  signal?: AbortSignal,
): Promise<CallOutcome> {
  if (!callId) {
    throw new Error(`idem: tool ${frameworkName} was invoked without a tool-call id to key it by`);
  }
  const tool = idemToolName(opts, frameworkName);
  if (args === null || typeof args !== "object" || Array.isArray(args)) {
    return { refusal: `${tool}: the arguments must be a JSON object` };
  }
  try {
    let answer = await opts.session.call(
      {
        call_id: callId,
        tool,
        args: args as Record<string, unknown>,
        ...(opts.repeatable?.includes(tool) ? { repeat: true } : {}),
        ...(decision ? { decision } : {}),
      },
      { signal },
    );
    if ((answer.state === "processing" || answer.state === "unknown") && opts.wait) {
      answer = await opts.session.getCall(callId, { wait: opts.wait, signal });
    }
    return { answer };
  } catch (e) {
    const refused = ["invalid", "forbidden", "conflict", "call_id_reused"];
    if (e instanceof IdemError && refused.includes(e.kind)) {
      return { refusal: `${tool} was refused by idem (${e.problemName}): ${e.detail || e.title}` };
    }
    throw e;
  }
}

/**
 * The text the model reads for an answer: the result (as JSON, with a note
 * when idem answered a repeated call from its journal), "waiting for
 * approval" with what the person sees, the failure, or an undo.
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
    case "failed": {
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
    case "needs_attention":
    case "compensating":
    case "compensated":
    case "compensation_failed":
      return (
        `${toolName}: ${answer.state.replace("_", " ")}` +
        (answer.error?.message ? ` (${answer.error.message})` : "") +
        ". The run was rolled back or waits for a person; do not call it again."
      );
    default:
      return (
        `${toolName}: the outcome is not known yet (${answer.state}); idem settles it. ` +
        "Ask again later with the same arguments; do not assume it failed."
      );
  }
}

/** A person's decision on a call that waits for approval. */
export interface PersonDecision {
  approved: boolean;
  /** Journaled with an approval. */
  note?: string;
  /** Journaled with a rejection (idem requires one; a default is sent). */
  reason?: string;
}

/**
 * Records a person's decision on a call that waits for approval, as that
 * person: finds the approval of the call's step among those the person may
 * decide (GET /v1/approvals with the person's client) and approves or
 * rejects it. An approval lets idem commit the call; a rejection fails it
 * (nothing is done; the open saga stays open: the agent goes on, commits or
 * rolls back). A call no longer waiting (decided already, by this bridge
 * or in idem's UI) is left as it is. Returns the call's answer afterwards
 * (waiting up to `wait` seconds for the commit).
 */
export async function recordDecision(
  session: OpenSagaSession,
  person: IdemClient,
  callId: string,
  decision: PersonDecision,
  wait = 10,
): Promise<CallAnswer> {
  const now = await session.getCall(callId);
  if (now.state !== "awaiting_approval") return now;
  const step = now.step_id;
  const pending = step ? await person.approvalFor(session.sagaId, step) : undefined;
  if (!pending) {
    // Decided in the meantime (another person, idem's UI), or this person
    // may not see it: the call's state says which.
    const again = await session.getCall(callId);
    if (again.state === "awaiting_approval") {
      throw new Error(
        `idem: call ${callId} (${session.sagaId}/${step}) waits for approval, but the deciding person's ` +
          "client does not list it: does that principal hold the role the approval asks for?",
      );
    }
    return again;
  }
  try {
    if (decision.approved) await person.approve(pending.token, decision.note ? { note: decision.note } : {});
    else await person.reject(pending.token, { reason: decision.reason || "rejected in the agent framework" });
  } catch (e) {
    if (!(e instanceof IdemError && (DECIDED_PROBLEMS as readonly string[]).includes(e.problemName))) throw e;
  }
  return session.getCall(callId, { wait });
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

/** A bounded map from call id to what was seen for it (oldest dropped first). */
export class BoundedMap<V> {
  readonly #map = new Map<string, V>();
  constructor(readonly maxEntries = 10000) {}
  set(key: string, value: V): void {
    this.#map.delete(key);
    this.#map.set(key, value);
    if (this.#map.size > this.maxEntries) {
      const oldest = this.#map.keys().next().value;
      if (oldest !== undefined) this.#map.delete(oldest);
    }
  }
  get(key: string): V | undefined {
    return this.#map.get(key);
  }
  delete(key: string): void {
    this.#map.delete(key);
  }
}
