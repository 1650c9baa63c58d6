"""The retry policy: how often and how long a request that is safe to repeat
is sent again.

Safe to repeat: a GET, a POST with an Idempotency-Key (submit, begin), an
open-saga call (its call_id is its key), a control request (cancel, pause,
resume, commit, rollback: a repeat answers the state). Such a request is sent
again byte for byte, the same key and the same body, after no answer at all,
a 503 or 429 (waiting at least Retry-After), or a 409 that means "not now"
(vocabulary.BUSY_PROBLEMS). A POST that carries no key is never retried.
"""

from dataclasses import dataclass
from typing import Callable, Optional
import random


@dataclass(frozen=True)
class RetryEvent:
    """Reported before each retry (for logs and tests)."""

    method: str
    path: str
    #: The attempt that failed, from 1.
    attempt: int
    #: The Idempotency-Key or call_id the retry reuses, if any.
    key: Optional[str]
    error: Exception
    #: Seconds the client waits before the next attempt.
    delay: float


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts in all (the first included; 1 = never retry), the first
    backoff (doubled each retry, with jitter) and the longest wait between
    attempts, Retry-After included."""

    attempts: int = 6
    base_delay: float = 0.25
    max_delay: float = 4.0
    on_retry: Optional[Callable[[RetryEvent], None]] = None

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        if self.base_delay < 0 or self.max_delay < self.base_delay:
            raise ValueError("RetryPolicy: need 0 <= base_delay <= max_delay")

    def backoff(self, attempt: int, retry_after: Optional[float] = None) -> float:
        """The wait before retry number ``attempt`` (1 = the first retry):
        exponential with equal jitter (half fixed, half random), at least the
        server's Retry-After, at most max_delay."""
        exp = min(self.max_delay, self.base_delay * (2 ** (attempt - 1)))
        jittered = exp / 2 + random.random() * (exp / 2)
        floor = retry_after if retry_after is not None else 0.0
        return min(self.max_delay, max(jittered, floor))


#: Never retry.
NO_RETRY = RetryPolicy(attempts=1, base_delay=0.0, max_delay=0.0)
