// The words of the idem API (server/openapi.json) that clients act on: saga,
// step and call states, park codes, resolve decisions, and the problem names
// the client treats specially. The types in types.ts are derived from these
// lists, and clients/python/tests/test_vocabulary.py checks each list
// against the enums of server/openapi.json, so a state or error code the
// server gains cannot be missed here.

/** Every state a saga can be in (openapi: SagaState). */
export const SAGA_STATES = [
  "pending",
  "running",
  "awaiting_approval",
  "awaiting_completion",
  "succeeded",
  "compensating",
  "compensated",
  "failed",
  "cancelled",
  "needs_attention",
  "paused",
  "open",
] as const;

/** States after which a saga does nothing more by itself. */
export const FINAL_SAGA_STATES = ["succeeded", "compensated", "failed", "cancelled"] as const;

/** Every state a step can be in (openapi: Step.state). */
export const STEP_STATES = [
  "planned",
  "previewed",
  "awaiting_approval",
  "submitted",
  "unknown",
  "processing",
  "succeeded",
  "failed",
  "compensating",
  "compensated",
  "compensation_failed",
  "needs_attention",
] as const;

/** Why a saga was parked (openapi: SagaSummary.park_code). */
export const SAGA_PARK_CODES = ["missing_value", "unknown_tool", "invalid_spec", "store_error", "guard_unanswered"] as const;

/** Why a step was parked (openapi: Step.park_code). */
export const STEP_PARK_CODES = ["missing_value", "unknown_tool", "invalid_spec", "store_error"] as const;

/** The states of an open-saga call's answer (openapi: CallAnswer.state). */
export const CALL_STATES = [
  "succeeded",
  "failed",
  "awaiting_approval",
  "processing",
  "unknown",
  "needs_attention",
  "compensating",
  "compensated",
  "compensation_failed",
] as const;

/** A person's decision on a parked step (openapi: Resolution.decision). */
export const RESOLVE_DECISIONS = ["applied", "not_applied", "retry", "undone", "retry_undo"] as const;

/**
 * 409s that mean "not now", not "no": the same key is still being answered
 * (a retry that overtook its first attempt), the saga is being driven, or
 * another call of the open saga is running (e.g. the one a restarted server
 * is settling). Retried like a 503 when the request is safe to repeat.
 */
export const BUSY_PROBLEMS = ["idempotency-key-in-flight", "saga-busy", "call-in-progress"] as const;

/** 409: the open saga was committed, rolled back or cancelled. */
export const SAGA_NOT_OPEN = "saga-not-open";

/**
 * 409: an open-saga call's call_id was recorded for another tool or other
 * arguments; nothing was called (a new intent needs a new call_id).
 */
export const CALL_ID_REUSED = "call-id-reused";

/** 409: an approval decided already (by this person, or the commit is settled). */
export const DECIDED_PROBLEMS = ["approval-not-pending", "already-decided"] as const;
