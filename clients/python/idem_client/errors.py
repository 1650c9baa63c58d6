"""Typed errors of the idem client, built from the server's problem documents.

Every error answer of the API is RFC 9457 application/problem+json
``{type, title, status, detail}`` with ``type`` "urn:idem:problem:<name>". The
classes mirror the TypeScript client's (clients/typescript/src/errors.ts): one
per kind of answer an agent handles differently, with ``kind`` for a match.
"""

from email.utils import parsedate_to_datetime
from typing import Any, Dict, Optional
import time

from .vocabulary import CALL_ID_REUSED, PROBLEM_PREFIX, SAGA_NOT_OPEN

#: The kinds, as in the TypeScript client.
KINDS = (
    "conflict",  # 409: intent key in use with other content, approval not pending, ...
    "saga_not_open",  # 409 saga-not-open: the open saga no longer takes calls
    "call_id_reused",  # 409 call-id-reused: the call_id was given to another call; nothing was called
    "not_found",  # 404 (also another caller's saga)
    "unauthorized",  # 401
    "forbidden",  # 403: role, tool-not-allowed, self-approval, commit token refused
    "invalid",  # 400, 413, 414, 415, 422, 431: the detail names the place
    "unavailable",  # 503, 429: retried where that is safe
    "server",  # another 5xx
    "network",  # no HTTP answer: the outcome of a POST is unknown
    "other",
)


class IdemError(Exception):
    """An error answer of the idem API, or no answer at all.

    ``type``, ``status``, ``title`` and ``detail`` are the problem document's
    (a network error has type "urn:idem:problem:network" and status 0);
    ``problem_name`` is the part after the prefix (``saga-not-open``);
    ``retry_after`` the server's Retry-After in seconds, when sent. The bearer
    token is never part of an error.
    """

    def __init__(
        self,
        kind: str,
        type: str,
        status: int,
        title: str,
        detail: str = "",
        problem: Optional[Dict[str, Any]] = None,
        method: str = "",
        path: str = "",
        retry_after: Optional[float] = None,
    ) -> None:
        where = f"{method} {path}"
        code = f"{status} " if status else ""
        super().__init__(f"{where}: {code}{title}" + (f": {detail}" if detail else ""))
        self.kind = kind
        self.type = type
        self.status = status
        self.title = title
        self.detail = detail
        self.problem = problem
        self.method = method
        self.path = path
        self.retry_after = retry_after

    @property
    def problem_name(self) -> str:
        """The problem's short name: "saga-not-open" for urn:idem:problem:saga-not-open."""
        if self.type.startswith(PROBLEM_PREFIX):
            return self.type[len(PROBLEM_PREFIX):]
        return self.type


class IdemConflictError(IdemError):
    """409: the request conflicts with what the journal holds."""


class IdemSagaNotOpenError(IdemConflictError):
    """409 saga-not-open: the open saga was committed, rolled back or cancelled."""


class IdemCallIdReusedError(IdemConflictError):
    """409 call-id-reused: this call_id was recorded for another call (another
    tool, or arguments with another fingerprint), and nothing was called. A
    call id names one intent: a new call needs a new call_id (with
    ``repeat=True`` to make the same call a second time on purpose)."""

    def _member(self, name: str) -> str:
        value = (self.problem or {}).get(name)
        return value if isinstance(value, str) else ""

    @property
    def call_id(self) -> str:
        """The reused call id."""
        return self._member("call_id")

    @property
    def recorded_tool(self) -> str:
        """The tool the id was first given to."""
        return self._member("recorded_tool")

    @property
    def recorded_args_fingerprint(self) -> str:
        """The fingerprint ("sha256:...") of the arguments the id was first given with."""
        return self._member("recorded_args_fingerprint")

    @property
    def tool(self) -> str:
        """The refused call's tool."""
        return self._member("tool")

    @property
    def args_fingerprint(self) -> str:
        """The fingerprint of the refused call's arguments."""
        return self._member("args_fingerprint")


class IdemNotFoundError(IdemError):
    """404: no such resource, or another caller's."""


class IdemUnauthorizedError(IdemError):
    """401: no bearer token, or an unknown one."""


class IdemForbiddenError(IdemError):
    """403: the caller lacks the role, the tool is not allowed, a self-approval, ..."""


class IdemValidationError(IdemError):
    """400, 413, 414, 415, 422, 431: the request is wrong; the detail names the place."""


class IdemUnavailableError(IdemError):
    """503 (or 429): the server did not take the request now; try again later."""


class IdemServerError(IdemError):
    """Another 5xx."""


class IdemNetworkError(IdemError):
    """No HTTP answer (refused, reset, timed out).

    For a POST the outcome is unknown: send it again with the same
    Idempotency-Key or call_id, never a new one.
    """


_CLASSES = {
    "conflict": IdemConflictError,
    "saga_not_open": IdemSagaNotOpenError,
    "call_id_reused": IdemCallIdReusedError,
    "not_found": IdemNotFoundError,
    "unauthorized": IdemUnauthorizedError,
    "forbidden": IdemForbiddenError,
    "invalid": IdemValidationError,
    "unavailable": IdemUnavailableError,
    "server": IdemServerError,
    "network": IdemNetworkError,
    "other": IdemError,
}


def kind_of(status: int, type: str) -> str:
    """The kind of an HTTP error answer."""
    if status == 409:
        if type == PROBLEM_PREFIX + SAGA_NOT_OPEN:
            return "saga_not_open"
        if type == PROBLEM_PREFIX + CALL_ID_REUSED:
            return "call_id_reused"
        return "conflict"
    if status == 404:
        return "not_found"
    if status == 401:
        return "unauthorized"
    if status == 403:
        return "forbidden"
    if status in (503, 429):
        return "unavailable"
    if status in (400, 413, 414, 415, 422, 431):
        return "invalid"
    if status >= 500:
        return "server"
    return "other"


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds of a Retry-After header (delta-seconds or an HTTP date), if any."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        at = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if at is None:
        return None
    return max(0.0, at.timestamp() - time.time())


def error_from_response(
    method: str, path: str, status: int, body: Any, retry_after: Optional[str]
) -> IdemError:
    """The typed error for an HTTP error answer: its problem document when it sent one."""
    problem = None
    if isinstance(body, dict) and isinstance(body.get("type"), str) and isinstance(body.get("title"), str):
        problem = dict(body)
        problem.setdefault("status", status)
    type_ = problem["type"] if problem else f"{PROBLEM_PREFIX}http-{status}"
    kind = kind_of(status, type_)
    if problem and isinstance(problem.get("detail"), str):
        detail = problem["detail"]
    elif isinstance(body, str):
        detail = body[:500]
    else:
        detail = ""
    return _CLASSES[kind](
        kind=kind,
        type=type_,
        status=status,
        title=problem["title"] if problem else f"HTTP {status}",
        detail=detail,
        problem=problem,
        method=method,
        path=path,
        retry_after=parse_retry_after(retry_after),
    )


def network_error(method: str, path: str, cause: BaseException) -> IdemNetworkError:
    """The typed error for a request that got no HTTP answer."""
    err = IdemNetworkError(
        kind="network",
        type=f"{PROBLEM_PREFIX}network",
        status=0,
        title="no answer from the server",
        detail=f"{type(cause).__name__}: {cause}",
        method=method,
        path=path,
    )
    err.__cause__ = cause
    return err
