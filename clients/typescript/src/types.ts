// The shapes of the idem REST API (server/openapi.json) as TypeScript types.
// Fields the server may add later are allowed (index signatures where the
// document says "object"); the client never drops what it receives.

import {
  CALL_STATES,
  RESOLVE_DECISIONS,
  SAGA_PARK_CODES,
  SAGA_STATES,
  STEP_PARK_CODES,
  STEP_STATES,
} from "./vocabulary.js";

export type SagaState = (typeof SAGA_STATES)[number];
export type StepState = (typeof STEP_STATES)[number];
export type ParkCode = (typeof SAGA_PARK_CODES)[number];
export type StepParkCode = (typeof STEP_PARK_CODES)[number];
export type CallState = (typeof CALL_STATES)[number];

export interface SagaSummary {
  saga_id: string;
  intent_key: string;
  spec: string;
  spec_version?: number | null;
  spec_sha256?: string;
  state: SagaState;
  reason: string;
  park_code?: ParkCode;
  created_at: string;
  updated_at: string;
  [extra: string]: unknown;
}

export interface Step {
  index: number;
  id: string;
  tool: string;
  state: StepState;
  attempts: number;
  key: string;
  args: unknown;
  result: unknown;
  external_ref: string;
  error: string;
  park_code?: StepParkCode;
  compensation_attempts: number;
  compensation_result: unknown;
  preview?: unknown;
  approval?: unknown;
  approval_expires_at?: string;
  [extra: string]: unknown;
}

export interface Effect {
  step: string;
  kind: "action" | "compensation";
  tool: string;
  key: string;
  external_ref: string;
  result?: unknown;
  at: string;
}

export interface Saga extends SagaSummary {
  input: Record<string, unknown>;
  steps: Step[];
  effects: Effect[];
  /** Open sagas: the calls in order, with state, result and decision. */
  calls?: CallAnswer[];
}

export interface ControlledSaga extends Saga {
  control: { recorded: boolean; pending: boolean; note: string };
}

/**
 * What the model decided, recorded in the journal beside the call (or, for
 * a spec saga, the submission): enough for a replay to reconstruct what the
 * model saw and chose without asking it again.
 */
export interface ModelDecision {
  model?: string;
  message_id?: string;
  call_id?: string;
  /** Hex SHA-256 of the prompt the model answered. */
  prompt_sha256?: string;
  prompt?: string;
  reasoning?: string;
  [extra: string]: unknown;
}

export interface SubmitRequest {
  /** An inline spec (schema/saga.schema.json), or a registered "name" / "name@version". */
  spec: Record<string, unknown> | string;
  version?: number;
  input?: Record<string, unknown>;
  decision?: ModelDecision;
}

export interface SagaList {
  sagas: SagaSummary[];
}

export interface Approval {
  saga_id: string;
  requested_by: string;
  spec: string;
  step: string;
  tool: string;
  args: unknown;
  preview: Record<string, unknown>;
  expires_at: string;
  token: string;
  [extra: string]: unknown;
}

export interface SpecVersion {
  name: string;
  version: number;
  fingerprint: string;
  created_at: string;
  created_by: string;
  owner?: string;
  shared?: boolean;
  spec?: Record<string, unknown>;
}

export type ResolveDecision = (typeof RESOLVE_DECISIONS)[number];

export interface Resolution {
  step: string;
  decision: ResolveDecision;
  result?: Record<string, unknown>;
  note?: string;
}

// ---- Open sagas (docs/server.md, "Open sagas")

export interface BeginRequest {
  /** The intent's key: the same key and body again answer the same saga. */
  intent_key: string;
  /** The tools the saga may call (names in the server's tool registry). */
  tools: string[];
  metadata?: Record<string, unknown>;
  /** E.g. "15m": how long the saga may go without a call. */
  idle_timeout?: string;
  on_idle?: "rollback" | "park";
  decision?: ModelDecision;
}

export interface OpenSaga {
  saga_id: string;
  state: SagaState;
  intent_key: string;
  tools: string[];
  links?: Record<string, string>;
  [extra: string]: unknown;
}

export interface CallRequest {
  /** The model's tool-call id (1..200 characters): the call's idempotency. */
  call_id: string;
  tool: string;
  args: Record<string, unknown>;
  /** The caller really means a second effect with the same arguments. */
  repeat?: boolean;
  decision?: ModelDecision;
}

export interface CallBase {
  call_id?: string;
  step_id?: string;
  tool?: string;
  decision?: ModelDecision;
  [extra: string]: unknown;
}

export interface CallSucceeded extends CallBase {
  state: "succeeded";
  result: unknown;
  deduplicated: boolean;
  /** When deduplicated: the call whose recorded answer this is. */
  duplicate_of?: string;
  reason?: string;
}

export interface CallFailed extends CallBase {
  state: "failed";
  error: { code: string; message: string; retryable: boolean };
}

export interface ApprovalRequest {
  summary?: string;
  changes?: unknown;
  arguments?: unknown;
  expires_at?: string;
  token_ref?: string;
  /** The full commit token, only for callers allowed to approve. */
  token?: string;
  approve_at?: { cli?: string; api?: string; ui?: string };
  [extra: string]: unknown;
}

export interface CallAwaitingApproval extends CallBase {
  state: "awaiting_approval";
  approval: ApprovalRequest;
}

/** The outcome is not known yet: ask again with the same call_id. */
export interface CallPending extends CallBase {
  state: "processing" | "unknown";
}

/**
 * The call needs a person (`needs_attention`), or the saga rolled back and
 * this call is being undone or was undone (`compensating`, `compensated`,
 * `compensation_failed`), e.g. after a rejection.
 */
export interface CallUndone extends CallBase {
  state: "needs_attention" | "compensating" | "compensated" | "compensation_failed";
  error?: { code: string; message: string; retryable: boolean };
}

/** The answer to an open-saga call, discriminated by `state`. */
export type CallAnswer = CallSucceeded | CallFailed | CallAwaitingApproval | CallPending | CallUndone;

type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
/** Compile-time check: CallAnswer has a shape for every state of CALL_STATES, and no other. */
export const CALL_ANSWER_COVERS_CALL_STATES: Same<CallAnswer["state"], CallState> = true;

export interface CommitAnswer {
  state: SagaState;
  [extra: string]: unknown;
}

export interface RollbackAnswer {
  state: SagaState;
  [extra: string]: unknown;
}
