"""The words of the idem API (server/openapi.json) that clients act on.

Saga, step and call states, park codes, resolve decisions, and the problem
names the client treats specially. A test (tests/test_vocabulary.py) checks
each list against the enums of server/openapi.json, so a state or error code
the server gains cannot be missed here.
"""

from typing import FrozenSet, Tuple

#: Every state a saga can be in (openapi: SagaState).
SAGA_STATES: Tuple[str, ...] = (
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
)

#: States after which a saga does nothing more by itself.
FINAL_SAGA_STATES: FrozenSet[str] = frozenset({"succeeded", "compensated", "failed", "cancelled"})

#: Every state a step can be in (openapi: Step.state).
STEP_STATES: Tuple[str, ...] = (
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
)

#: Why a saga was parked (openapi: SagaSummary.park_code).
SAGA_PARK_CODES: Tuple[str, ...] = (
    "missing_value",
    "unknown_tool",
    "invalid_spec",
    "store_error",
    "guard_unanswered",
)

#: Why a step was parked (openapi: Step.park_code).
STEP_PARK_CODES: Tuple[str, ...] = ("missing_value", "unknown_tool", "invalid_spec", "store_error")

#: The states of an open-saga call's answer (openapi: CallAnswer.state).
CALL_STATES: Tuple[str, ...] = (
    "succeeded",
    "failed",
    "awaiting_approval",
    "processing",
    "unknown",
    "needs_attention",
    "compensating",
    "compensated",
    "compensation_failed",
)

#: A person's decision on a parked step (openapi: Resolution.decision).
RESOLVE_DECISIONS: Tuple[str, ...] = ("applied", "not_applied", "retry", "undone", "retry_undo")

#: Problem types are "urn:idem:problem:<name>".
PROBLEM_PREFIX = "urn:idem:problem:"

#: 409s that mean "not now", not "no": the same key still being answered,
#: the saga being driven, another call of the open saga running. Retried
#: like a 503 when the request is safe to repeat.
BUSY_PROBLEMS: FrozenSet[str] = frozenset(
    {"idempotency-key-in-flight", "saga-busy", "call-in-progress"}
)

#: 409: the open saga was committed, rolled back or cancelled.
SAGA_NOT_OPEN = "saga-not-open"

#: 409: an open-saga call's call_id was recorded for another tool or other
#: arguments; nothing was called (a new intent needs a new call_id).
CALL_ID_REUSED = "call-id-reused"

#: 409: an approval already decided (by this person, or the commit is settled).
DECIDED_PROBLEMS: FrozenSet[str] = frozenset({"approval-not-pending", "already-decided"})
