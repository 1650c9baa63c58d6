"""Model decisions: what the model saw and chose, journaled beside a call.

idem records a decision {model, message_id?, call_id?, prompt_sha256,
prompt?, reasoning?} in the same transaction as what it led to (the call,
the saga, the commit), so a replay can reconstruct what the model saw without
asking it again. The prompt's fingerprint is the SHA-256 of its canonical
JSON (sorted keys, no spaces), as the TypeScript adapters compute it.
"""

from typing import Any, Dict, Optional
import hashlib
import json


def canonical_json(value: Any) -> str:
    """Canonical JSON: object keys sorted, no spaces, UTF-8 kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def model_decision(
    model: str,
    prompt: Any,
    *,
    message_id: Optional[str] = None,
    call_id: Optional[str] = None,
    keep_prompt: bool = False,
    reasoning: Optional[str] = None,
) -> Dict[str, Any]:
    """The decision for one tool call of a model answer: ``prompt`` is what
    the model was sent (messages, system text: any JSON value); with
    ``keep_prompt`` its text is recorded too, else only its SHA-256."""
    text = canonical_json(prompt)
    out: Dict[str, Any] = {"model": model, "prompt_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}
    if message_id is not None:
        out["message_id"] = message_id
    if call_id is not None:
        out["call_id"] = call_id
    if keep_prompt:
        out["prompt"] = text
    if reasoning is not None:
        out["reasoning"] = reasoning
    return out
