"""Answers of the idem API as dataclasses where a caller branches on them.

Sagas, steps, approvals and specs stay the JSON objects the server sends
(dicts): the server may add fields, and the client drops nothing. A call's
answer and a submission are dataclasses, keeping the whole document in
``raw``.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional


@dataclass(frozen=True)
class Submitted:
    """The answer to ``submit``: the saga, and how it was answered."""

    saga: Dict[str, Any]
    #: 201: this request recorded the saga (also a replay of that answer).
    created: bool
    #: The answer was replayed from the Idempotency-Key record.
    replayed: bool
    #: The server's Preference-Applied header ("wait=N" when it waited).
    preference_applied: Optional[str]


@dataclass(frozen=True)
class CallAnswer:
    """The answer to an open-saga call (openapi: CallAnswer), by ``state``:

    - ``succeeded``: ``result``; ``deduplicated`` when idem answered it from
      its journal (``duplicate_of``, ``reason``: "same call_id" or "same tool
      and arguments"), nothing being called again;
    - ``failed``: ``error`` {code, message, retryable}; the saga stays open;
    - ``awaiting_approval``: ``approval`` {summary, changes, arguments,
      expires_at, token_ref, approve_at}; a person decides, then the same
      call answers the outcome;
    - ``processing`` / ``unknown``: ask again with the same call_id.
    """

    state: str
    call_id: Optional[str] = None
    step_id: Optional[str] = None
    tool: Optional[str] = None
    result: Any = None
    deduplicated: bool = False
    duplicate_of: Optional[str] = None
    reason: Optional[str] = None
    error: Optional[Dict[str, Any]] = None
    approval: Optional[Dict[str, Any]] = None
    decision: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "CallAnswer":
        if not isinstance(doc, dict) or not isinstance(doc.get("state"), str):
            raise ValueError(f"idem: a call answer must be an object with a state, got {doc!r:.200}")
        return cls(
            state=doc["state"],
            call_id=doc.get("call_id"),
            step_id=doc.get("step_id"),
            tool=doc.get("tool"),
            result=doc.get("result"),
            deduplicated=bool(doc.get("deduplicated", False)),
            duplicate_of=doc.get("duplicate_of"),
            reason=doc.get("reason"),
            error=doc.get("error"),
            approval=doc.get("approval"),
            decision=doc.get("decision"),
            raw=doc,
        )

    @property
    def settled(self) -> bool:
        """True when the call has its outcome (succeeded or failed for good)."""
        return self.state in ("succeeded", "failed")
