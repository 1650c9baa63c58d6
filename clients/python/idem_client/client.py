"""IdemClient: the idem REST API (/v1, server/openapi.json) over http.client.

One method per endpoint; errors are typed (errors.py); requests that are
safe to repeat are retried with the same key (retry.py). Nothing here logs,
and the bearer token only ever goes into the Authorization header.
"""

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple
from urllib.parse import quote, urlencode, urlsplit
import http.client
import json
import socket
import ssl
import time

from .errors import IdemError, error_from_response, network_error
from .retry import NO_RETRY, RetryEvent, RetryPolicy
from .types import CallAnswer, Submitted
from .vocabulary import BUSY_PROBLEMS, FINAL_SAGA_STATES

#: A request's retry class: None when it is never sent twice, else the key
#: that makes it safe ("" when it needs none, e.g. a GET).
RetryKey = Optional[str]


class Response:
    """An HTTP answer: status, headers (lower-case names) and decoded body."""

    def __init__(self, status: int, headers: Dict[str, str], body: Any) -> None:
        self.status = status
        self.headers = headers
        self.body = body


def _segment(value: str) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"idem: a path segment must be a non-empty string, got {value!r}")
    return quote(value, safe="")


def _prefer_wait(wait: Optional[int]) -> Dict[str, str]:
    if wait is None:
        return {}
    if not isinstance(wait, int) or isinstance(wait, bool) or wait < 0:
        raise TypeError(f"idem: wait must be a whole number of seconds >= 0, got {wait!r}")
    return {"Prefer": f"wait={wait}"}


class IdemClient:
    """A client of one idem server.

    ``base_url`` is the server without /v1 ("http://127.0.0.1:8080"),
    ``token`` the caller's bearer token (None for a server run with
    --insecure-no-auth), ``timeout`` the deadline of one attempt in seconds
    (plus any ``wait``), ``retry`` a RetryPolicy (or None: never retry).
    """

    def __init__(
        self,
        base_url: str,
        token: Optional[str] = None,
        *,
        timeout: float = 30.0,
        retry: Optional[RetryPolicy] = RetryPolicy(),
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        parts = urlsplit(base_url or "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TypeError("idem: IdemClient needs base_url, an http:// or https:// URL")
        self.base_url = base_url.rstrip("/")
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._token = token
        self._timeout = timeout
        self._retry = retry or NO_RETRY
        self._ssl = ssl_context

    def __repr__(self) -> str:
        # Never the token.
        return f"IdemClient({self.base_url!r})"

    # ---- the one request function

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Optional[Mapping[str, Any]] = None,
        headers: Optional[Mapping[str, str]] = None,
        retry_key: RetryKey = None,
        wait: Optional[int] = None,
        on_retry: Optional[Callable[[RetryEvent], None]] = None,
    ) -> Response:
        """One request: the typed error for a non-2xx answer; retries with
        backoff (the same request again) on no answer, 503, 429 and the busy
        409s when ``retry_key`` is not None (the request is safe to repeat).
        Public for endpoints this client has no method for."""
        target = self._prefix + path
        if query:
            q = {k: v for k, v in query.items() if v is not None}
            if q:
                target += "?" + urlencode(q)
        head = {"Accept": "application/json", **_prefer_wait(wait), **(headers or {})}
        if self._token:
            head["Authorization"] = f"Bearer {self._token}"
        payload = None
        if body is not None:
            head["Content-Type"] = "application/json"
            payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        safe = retry_key is not None
        attempts = self._retry.attempts if safe else 1
        deadline = self._timeout + (wait or 0)
        attempt = 1
        while True:
            try:
                status, resp_headers, raw = self._send(method, target, head, payload, deadline)
                decoded = _decode(raw, resp_headers.get("content-type", ""))
                if 200 <= status < 300:
                    return Response(status, resp_headers, decoded)
                error: IdemError = error_from_response(
                    method, path, status, decoded, resp_headers.get("retry-after")
                )
            except (OSError, http.client.HTTPException, socket.timeout) as e:
                error = network_error(method, path, e)
            retryable = error.kind in ("network", "unavailable") or error.problem_name in BUSY_PROBLEMS
            if not retryable or not safe or attempt >= attempts:
                raise error
            delay = self._retry.backoff(attempt, error.retry_after)
            event = RetryEvent(method, path, attempt, retry_key or None, error, delay)
            if on_retry:
                on_retry(event)
            if self._retry.on_retry:
                self._retry.on_retry(event)
            time.sleep(delay)
            attempt += 1

    def _send(
        self, method: str, target: str, headers: Dict[str, str], payload: Optional[bytes], timeout: float
    ) -> Tuple[int, Dict[str, str], bytes]:
        # A connection per request: a restarted server is reached again at
        # once, and nothing stale is reused after a reset.
        if self._scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=self._ssl or ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        try:
            conn.request(method, target, body=payload, headers=headers)
            res = conn.getresponse()
            raw = res.read()
            return res.status, {k.lower(): v for k, v in res.getheaders()}, raw
        finally:
            conn.close()

    def _get(self, path: str, query: Optional[Mapping[str, Any]] = None) -> Any:
        return self.request("GET", path, query=query, retry_key="").body

    # ---- health

    def health(self) -> Dict[str, Any]:
        """GET /healthz."""
        return self._get("/healthz")

    # ---- spec sagas

    def submit(self, req: Dict[str, Any], *, intent_key: str, wait: Optional[int] = None) -> Submitted:
        """POST /v1/sagas under the intent key (the Idempotency-Key): the same
        key and body again answer the same saga, so a lost answer is retried
        with the same key; the same key with other content is an IdemError
        (409 or 422). ``req`` is {spec, version?, input?, decision?}."""
        if not intent_key:
            raise TypeError("idem: submit needs intent_key (the Idempotency-Key)")
        res = self.request(
            "POST", "/v1/sagas", body=req, headers={"Idempotency-Key": intent_key},
            retry_key=intent_key, wait=wait,
        )
        return Submitted(
            saga=res.body,
            created=res.status == 201,
            replayed=res.headers.get("idempotent-replayed") == "true",
            preference_applied=res.headers.get("preference-applied"),
        )

    def get_saga(self, saga_id: str) -> Dict[str, Any]:
        """GET /v1/sagas/{id}: the saga, its steps, effects (and an open saga's calls)."""
        return self._get(f"/v1/sagas/{_segment(saga_id)}")

    def list_sagas(self, *, status: Optional[str] = None, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """GET /v1/sagas: the caller's sagas, newest first."""
        return self._get("/v1/sagas", {"status": status, "limit": limit})["sagas"]

    def wait_for_saga(
        self,
        saga_id: str,
        *,
        until: Optional[Callable[[Dict[str, Any]], bool]] = None,
        interval: float = 0.1,
        timeout: float = 30.0,
    ) -> Dict[str, Any]:
        """Polls GET /v1/sagas/{id} until ``until`` holds (default: a final state)."""
        until = until or (lambda s: s.get("state") in FINAL_SAGA_STATES)
        deadline = time.monotonic() + timeout
        while True:
            saga = self.get_saga(saga_id)
            if until(saga):
                return saga
            if time.monotonic() >= deadline:
                raise TimeoutError(f"idem: saga {saga_id} is still {saga.get('state')} after {timeout} s")
            time.sleep(interval)

    def cancel(self, saga_id: str, reason: Optional[str] = None) -> Dict[str, Any]:
        """POST /v1/sagas/{id}/cancel: a durable request; the saga rolls back."""
        return self._control(saga_id, "cancel", reason)

    def pause(self, saga_id: str, reason: Optional[str] = None) -> Dict[str, Any]:
        """POST /v1/sagas/{id}/pause (operator): the saga stops between steps."""
        return self._control(saga_id, "pause", reason)

    def resume(self, saga_id: str, reason: Optional[str] = None) -> Dict[str, Any]:
        """POST /v1/sagas/{id}/resume (operator): a paused saga goes on."""
        return self._control(saga_id, "resume", reason)

    def resolve(
        self,
        saga_id: str,
        *,
        step: str,
        decision: str,
        result: Optional[Dict[str, Any]] = None,
        note: Optional[str] = None,
    ) -> Dict[str, Any]:
        """POST /v1/sagas/{id}/resolve (operator): a person's decision on a
        parked step. Never retried."""
        body: Dict[str, Any] = {"step": step, "decision": decision}
        if result is not None:
            body["result"] = result
        if note is not None:
            body["note"] = note
        return self.request("POST", f"/v1/sagas/{_segment(saga_id)}/resolve", body=body).body

    def _control(self, saga_id: str, verb: str, reason: Optional[str]) -> Dict[str, Any]:
        # A durable request: sending it again records nothing new (control.recorded false).
        body = {"reason": reason} if reason is not None else {}
        return self.request("POST", f"/v1/sagas/{_segment(saga_id)}/{verb}", body=body, retry_key="").body

    # ---- approvals

    def approvals(self) -> List[Dict[str, Any]]:
        """GET /v1/approvals (approver, or a policy's role): commits waiting
        for a person, each with its token."""
        return self._get("/v1/approvals")["approvals"]

    def approve(self, token: str, note: Optional[str] = None) -> Dict[str, Any]:
        """POST /v1/approvals/{token}/approve. Never retried (a repeat is 409
        approval-not-pending or already-decided)."""
        body = {"note": note} if note is not None else {}
        return self.request("POST", f"/v1/approvals/{_segment(token)}/approve", body=body).body

    def reject(self, token: str, reason: str) -> Dict[str, Any]:
        """POST /v1/approvals/{token}/reject: the saga rolls back. Never retried."""
        return self.request("POST", f"/v1/approvals/{_segment(token)}/reject", body={"reason": reason}).body

    def approval_for(self, saga_id: str, step: str) -> Optional[Dict[str, Any]]:
        """The approval waiting for a step (an open saga's call: its step_id),
        with its token, or None (decided already, or not this caller's to
        see). For a person's client: agents never get the token."""
        for a in self.approvals():
            if a.get("saga_id") == saga_id and a.get("step") == step:
                return a
        return None

    # ---- specs

    def put_spec(self, name: str, spec: Dict[str, Any], *, shared: Optional[bool] = None) -> Dict[str, Any]:
        """PUT /v1/specs/{name}: a new version, or the existing one with the same content."""
        query = {"shared": None if shared is None else ("true" if shared else "false")}
        return self.request("PUT", f"/v1/specs/{_segment(name)}", body=spec, query=query, retry_key=name).body

    def get_spec(self, name: str, *, version: Optional[int] = None) -> Dict[str, Any]:
        """GET /v1/specs/{name}[?version=N]."""
        return self._get(f"/v1/specs/{_segment(name)}", {"version": version})

    def list_specs(self) -> List[Dict[str, Any]]:
        """GET /v1/specs."""
        return self._get("/v1/specs")["specs"]

    # ---- open sagas

    def begin(
        self,
        intent_key: str,
        tools: List[str],
        *,
        metadata: Optional[Dict[str, Any]] = None,
        idle_timeout: Optional[str] = None,
        on_idle: Optional[str] = None,
        decision: Optional[Dict[str, Any]] = None,
        idempotency_key: Optional[str] = None,
    ) -> "OpenSagaSession":
        """POST /v1/open-sagas: begin an intent whose calls the model picks one
        at a time. The intent key makes it safe to repeat (the same key and
        body answer the same saga): it is retried, and sent as the
        Idempotency-Key unless another one is given."""
        if not intent_key:
            raise TypeError("idem: begin needs intent_key")
        body: Dict[str, Any] = {"intent_key": intent_key, "tools": list(tools)}
        for k, v in (("metadata", metadata), ("idle_timeout", idle_timeout), ("on_idle", on_idle),
                     ("decision", decision)):
            if v is not None:
                body[k] = v
        key = idempotency_key or intent_key
        res = self.request(
            "POST", "/v1/open-sagas", body=body, headers={"Idempotency-Key": key}, retry_key=key
        )
        return OpenSagaSession(self, res.body)

    def open_saga(self, saga_id: str) -> "OpenSagaSession":
        """A session for an open saga begun earlier (by id)."""
        return OpenSagaSession(self, {"saga_id": saga_id, "state": "open", "intent_key": "", "tools": []})

    def call(
        self,
        saga_id: str,
        *,
        call_id: str,
        tool: str,
        args: Dict[str, Any],
        repeat: bool = False,
        decision: Optional[Dict[str, Any]] = None,
        wait: Optional[int] = None,
    ) -> CallAnswer:
        """POST /v1/sagas/{id}/calls: one tool call. The call_id (the model's
        tool-call id) makes it safe to repeat: a retry after a lost answer
        gets the recorded answer and calls nothing. 200 and 202 answers are
        returned (see CallAnswer.state); errors are raised."""
        if not call_id:
            raise TypeError("idem: a call needs call_id (the model's tool-call id)")
        if not isinstance(args, dict):
            raise TypeError(f"idem: a call's args must be a JSON object (dict), got {type(args).__name__}")
        body: Dict[str, Any] = {"call_id": call_id, "tool": tool, "args": args}
        if repeat:
            body["repeat"] = True
        if decision is not None:
            body["decision"] = decision
        res = self.request("POST", f"/v1/sagas/{_segment(saga_id)}/calls", body=body, retry_key=call_id, wait=wait)
        return CallAnswer.from_json(res.body)

    def get_call(self, saga_id: str, call_id: str, *, wait: Optional[int] = None) -> CallAnswer:
        """GET /v1/sagas/{id}/calls/{call_id}: the call's answer as it stands; calls nothing."""
        res = self.request(
            "GET", f"/v1/sagas/{_segment(saga_id)}/calls/{_segment(call_id)}", retry_key="", wait=wait
        )
        return CallAnswer.from_json(res.body)

    def commit(
        self, saga_id: str, *, decision: Optional[Dict[str, Any]] = None, wait: Optional[int] = None
    ) -> Dict[str, Any]:
        """POST /v1/sagas/{id}/commit: the open saga succeeds. Retried after a
        lost answer; a retry that finds the saga no longer open answers its
        state when that is the commit's outcome."""
        body = {"decision": decision} if decision is not None else {}
        return self._settle(saga_id, "commit", body, ("succeeded",), wait)

    def rollback(self, saga_id: str, *, reason: Optional[str] = None, wait: Optional[int] = None) -> Dict[str, Any]:
        """POST /v1/sagas/{id}/rollback: every completed call compensated in
        reverse order ("compensated", or "compensating" when not done within
        the wait). Retried like commit."""
        body = {"reason": reason} if reason is not None else {}
        return self._settle(saga_id, "rollback", body, ("compensating", "compensated"), wait)

    def _settle(
        self, saga_id: str, verb: str, body: Dict[str, Any], outcomes: Tuple[str, ...], wait: Optional[int]
    ) -> Dict[str, Any]:
        retried: List[RetryEvent] = []
        try:
            return self.request(
                "POST", f"/v1/sagas/{_segment(saga_id)}/{verb}", body=body, retry_key="", wait=wait,
                on_retry=retried.append,
            ).body
        except IdemError as e:
            # The first attempt may have done it before its answer was lost.
            if retried and e.kind == "saga_not_open":
                saga = self.get_saga(saga_id)
                if saga.get("state") in outcomes:
                    return {"state": saga["state"], "saga_id": saga["saga_id"]}
            raise


class OpenSagaSession:
    """An open saga: call tools one at a time, then commit or roll back."""

    def __init__(self, client: IdemClient, info: Dict[str, Any]) -> None:
        self.client = client
        self.saga_id: str = info["saga_id"]
        #: The begin answer (state, intent key, tools, links).
        self.info = info

    def call(self, call_id: str, tool: str, args: Dict[str, Any], **kw: Any) -> CallAnswer:
        return self.client.call(self.saga_id, call_id=call_id, tool=tool, args=args, **kw)

    def get_call(self, call_id: str, *, wait: Optional[int] = None) -> CallAnswer:
        return self.client.get_call(self.saga_id, call_id, wait=wait)

    def get(self) -> Dict[str, Any]:
        return self.client.get_saga(self.saga_id)

    def commit(self, **kw: Any) -> Dict[str, Any]:
        return self.client.commit(self.saga_id, **kw)

    def rollback(self, **kw: Any) -> Dict[str, Any]:
        return self.client.rollback(self.saga_id, **kw)

    def cancel(self, reason: Optional[str] = None) -> Dict[str, Any]:
        return self.client.cancel(self.saga_id, reason)


def _decode(raw: bytes, content_type: str) -> Any:
    if not raw:
        return None
    text = raw.decode("utf-8", errors="replace")
    if "json" in content_type.lower():
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text
