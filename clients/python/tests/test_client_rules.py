"""The client's rules against a scripted HTTP server on loopback (no idem):
typed errors from problem documents, retries that resend the same request
(same key, same body) on no answer, 503, 429 and the busy 409s, Retry-After,
no retry of a request that carries no key, and the token kept out of errors.
"""

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Tuple
import json
import threading
import time

import pytest

from idem_client import (
    IdemCallIdReusedError,
    IdemClient,
    IdemConflictError,
    IdemError,
    IdemForbiddenError,
    IdemNetworkError,
    IdemNotFoundError,
    IdemSagaNotOpenError,
    IdemServerError,
    IdemUnauthorizedError,
    IdemUnavailableError,
    IdemValidationError,
    NO_RETRY,
    RetryPolicy,
)

TOKEN = "secret-token-abc123"


class Scripted:
    """A loopback HTTP server answering each request with the next scripted
    answer: (status, body, headers) or "drop" (close without answering)."""

    def __init__(self, answers: List[Any]) -> None:
        self.answers = list(answers)
        self.seen: List[Dict[str, Any]] = []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                scripted.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                                      "body": body})
                answer = scripted.answers.pop(0) if scripted.answers else (500, {"type": "x", "title": "t"}, {})
                if answer == "drop":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                status, doc, headers = answer
                raw = json.dumps(doc).encode()
                self.send_response(status)
                ctype = "application/problem+json" if status >= 400 else "application/json"
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(raw)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_PUT = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def problem(status: int, name: str, detail: str = "details") -> Tuple[int, Dict[str, Any], Dict[str, str]]:
    return (status, {"type": f"urn:idem:problem:{name}", "title": name.replace("-", " "), "status": status,
                     "detail": detail}, {})


@pytest.fixture
def scripted():
    servers: List[Scripted] = []

    def make(answers: List[Any]) -> Scripted:
        s = Scripted(answers)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


@pytest.mark.parametrize("status,name,cls,kind", [
    (409, "intent-conflict", IdemConflictError, "conflict"),
    (409, "saga-not-open", IdemSagaNotOpenError, "saga_not_open"),
    (409, "call-id-reused", IdemCallIdReusedError, "call_id_reused"),
    (404, "not-found", IdemNotFoundError, "not_found"),
    (401, "unauthorized", IdemUnauthorizedError, "unauthorized"),
    (403, "tool-not-allowed", IdemForbiddenError, "forbidden"),
    (400, "malformed-json", IdemValidationError, "invalid"),
    (413, "payload-too-large", IdemValidationError, "invalid"),
    (422, "invalid-spec", IdemValidationError, "invalid"),
    (431, "request-header-fields-too-large", IdemValidationError, "invalid"),
    (503, "store-unavailable", IdemUnavailableError, "unavailable"),
    (429, "too-many-sign-ins", IdemUnavailableError, "unavailable"),
    (500, "internal", IdemServerError, "server"),
])
def test_each_status_is_a_typed_error(scripted, status, name, cls, kind):
    s = scripted([problem(status, name, "steps[0].tool: unknown tool")])
    client = IdemClient(s.url, token=TOKEN, retry=NO_RETRY)
    with pytest.raises(cls) as e:
        client.get_saga("sg_1")
    err = e.value
    assert err.kind == kind and err.status == status and err.problem_name == name
    assert err.detail == "steps[0].tool: unknown tool"
    assert err.method == "GET" and err.path == "/v1/sagas/sg_1"
    assert TOKEN not in str(err) and TOKEN not in repr(client)
    assert s.seen[0]["headers"]["Authorization"] == f"Bearer {TOKEN}"


def test_a_call_is_resent_with_the_same_call_id_and_body_after_503_busy_409_and_a_drop(scripted):
    ok = (200, {"state": "succeeded", "call_id": "call_1", "result": {"id": "R1"}, "deduplicated": False}, {})
    s = scripted([problem(503, "store-unavailable"), problem(409, "call-in-progress"), "drop",
                  problem(409, "saga-busy"), ok])
    events = []
    client = IdemClient(s.url, retry=RetryPolicy(attempts=6, base_delay=0.01, max_delay=0.02, on_retry=events.append))
    answer = client.call("sg_1", call_id="call_1", tool="flights.reserve", args={"to": "NRT"}, wait=5)
    assert answer.state == "succeeded" and answer.result == {"id": "R1"}
    assert len(s.seen) == 5
    assert len({x["body"] for x in s.seen}) == 1, "every attempt sent the same body"
    assert json.loads(s.seen[0]["body"]) == {"call_id": "call_1", "tool": "flights.reserve", "args": {"to": "NRT"}}
    assert all(x["headers"]["Prefer"] == "wait=5" for x in s.seen)
    assert [e.key for e in events] == ["call_1"] * 4
    assert [e.error.kind for e in events] == ["unavailable", "conflict", "network", "conflict"]


def test_submit_is_resent_with_the_same_idempotency_key(scripted):
    s = scripted([problem(409, "idempotency-key-in-flight"), (201, {"saga_id": "sg_1", "state": "pending"},
                                                               {"Preference-Applied": "wait=3"})])
    client = IdemClient(s.url, retry=RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02))
    out = client.submit({"spec": "trip"}, intent_key="ana-1", wait=3)
    assert out.created and out.saga["saga_id"] == "sg_1" and out.preference_applied == "wait=3"
    assert [x["headers"]["Idempotency-Key"] for x in s.seen] == ["ana-1", "ana-1"]


def test_retry_after_is_waited_for(scripted):
    s = scripted([(503, {"type": "urn:idem:problem:not-ready", "title": "Not ready"}, {"Retry-After": "1"}),
                  (200, {"status": "ok"}, {})])
    client = IdemClient(s.url, retry=RetryPolicy(attempts=2, base_delay=0.01, max_delay=2))
    start = time.monotonic()
    assert client.health() == {"status": "ok"}
    assert time.monotonic() - start >= 0.95


@pytest.mark.parametrize("send", [
    lambda c: c.approve("idem1.tok", note="ok"),
    lambda c: c.reject("idem1.tok", reason="no"),
    lambda c: c.resolve("sg_1", step="s1", decision="applied"),
])
def test_requests_without_a_key_are_never_retried(scripted, send):
    s = scripted([problem(503, "store-unavailable"), (200, {}, {})])
    client = IdemClient(s.url, retry=RetryPolicy(attempts=5, base_delay=0.01, max_delay=0.02))
    with pytest.raises(IdemUnavailableError):
        send(client)
    assert len(s.seen) == 1


def test_a_conflict_that_means_no_is_not_retried(scripted):
    s = scripted([problem(409, "call-pending"), (200, {"state": "succeeded"}, {})])
    client = IdemClient(s.url, retry=RetryPolicy(attempts=5, base_delay=0.01, max_delay=0.02))
    with pytest.raises(IdemConflictError) as e:
        client.call("sg_1", call_id="c1", tool="t", args={})
    assert e.value.problem_name == "call-pending"
    assert len(s.seen) == 1


def test_no_server_is_a_network_error_after_the_attempts(scripted):
    s = scripted([])
    url = s.url
    s.close()
    events = []
    client = IdemClient(url, retry=RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02, on_retry=events.append))
    with pytest.raises(IdemNetworkError) as e:
        client.begin("trip-1", ["flights.reserve"])
    assert e.value.status == 0 and e.value.kind == "network"
    assert [ev.key for ev in events] == ["trip-1", "trip-1"]


def test_a_commit_retried_after_its_answer_was_lost_answers_the_outcome(scripted):
    s = scripted(["drop", problem(409, "saga-not-open"), (200, {"saga_id": "sg_1", "state": "succeeded"}, {})])
    client = IdemClient(s.url, retry=RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02))
    assert client.commit("sg_1") == {"state": "succeeded", "saga_id": "sg_1"}
    assert [x["method"] + " " + x["path"] for x in s.seen] == [
        "POST /v1/sagas/sg_1/commit", "POST /v1/sagas/sg_1/commit", "GET /v1/sagas/sg_1"]


def test_bad_input_is_refused_before_sending(scripted):
    s = scripted([])
    client = IdemClient(s.url)
    with pytest.raises(TypeError, match="intent_key"):
        client.submit({"spec": "trip"}, intent_key="")
    with pytest.raises(TypeError, match="call_id"):
        client.call("sg_1", call_id="", tool="t", args={})
    with pytest.raises(TypeError, match="JSON object"):
        client.call("sg_1", call_id="c1", tool="t", args=[1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wait"):
        client.get_call("sg_1", "c1", wait=-1)
    with pytest.raises(TypeError, match="path segment"):
        client.get_saga("")
    with pytest.raises(TypeError, match="base_url"):
        IdemClient("ftp://x")
    assert s.seen == []
    assert isinstance(IdemError("other", "t", 0, "x"), Exception)


def test_a_reused_call_id_is_a_typed_error_naming_both_calls_and_is_not_resent(scripted):
    body = {"type": "urn:idem:problem:call-id-reused", "title": "Call id reused for another call",
            "status": 409, "detail": "call_id \"c1\" was recorded ...", "code": "call-id-reused",
            "call_id": "c1", "recorded_tool": "flights.book", "recorded_args_fingerprint": "sha256:aa",
            "tool": "flights.book", "args_fingerprint": "sha256:bb"}
    s = scripted([(409, body, {"Content-Type": "application/problem+json"})])
    client = IdemClient(s.url, token=TOKEN, retry=RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.005))
    with pytest.raises(IdemCallIdReusedError) as e:
        client.call("sg_1", call_id="c1", tool="flights.book", args={"to": "rome"})
    err = e.value
    assert isinstance(err, IdemConflictError) and err.kind == "call_id_reused"
    assert (err.call_id, err.recorded_tool, err.recorded_args_fingerprint, err.tool, err.args_fingerprint) == (
        "c1", "flights.book", "sha256:aa", "flights.book", "sha256:bb")
    assert len(s.seen) == 1, "a refusal is not resent"
