#!/usr/bin/env bash
# Two `idem serve` processes on one PostgreSQL behave as one service (server
# state lives in the journal's store: storage/server_state.h).
#
#   two_servers_test.sh IDEM ROOT PGDIR
#
# IDEM is the idem binary, ROOT the source tree, PGDIR the directory of the
# shared test server (scripts/pg-test-server.sh start PGDIR; the URL is in
# PGDIR/url). On a database of its own, servers A and B (real processes on
# loopback ports, --insecure-no-auth) check that
#   - a POST /v1/sagas with an Idempotency-Key to A, retried to B, gets A's
#     stored response (Idempotent-Replayed, the same saga) and no second saga
#     is recorded;
#   - the same key with another payload on B is 422 idempotency-key-reused;
#   - a spec registered on A (PUT /v1/specs/NAME) is submitted by name on B;
#   - a cancel sent to B of a saga A drives (its first call held by a slow
#     provider until the cancel is in the store) is honoured by A: the call
#     finishes, then A rolls back.
# The travel tools point at a port nobody listens on: those sagas need not
# succeed. The servers keep their commit-token keys in the work folder.
set -euo pipefail

[[ $# -eq 3 ]] || {
  echo "usage: $0 IDEM ROOT PGDIR" >&2
  exit 2
}
IDEM=$1
ROOT=$2
PGDIR=$3
PSQL=$(command -v psql || true)
if [[ -z "$PSQL" ]]; then
  PSQL=$(ls -d /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -n 1 || true)
fi
[[ -n "$PSQL" && -x "$PSQL" ]] || {
  echo "two_servers_test: psql not found" >&2
  exit 1
}
[[ -f "$PGDIR/url" ]] || {
  echo "two_servers_test: no server URL in $PGDIR/url (is the pg_server_start fixture up?)" >&2
  exit 1
}
BASE_URL=$(cat "$PGDIR/url")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-two-servers.XXXXXX")
DB="two_servers_$$_${RANDOM}"
URL="${BASE_URL%/*}/$DB"
PIDS=()

psql_base() { "$PSQL" "$BASE_URL" -XAtq -v ON_ERROR_STOP=1 "$@"; }
q() { "$PSQL" "$URL" -XAtq -v ON_ERROR_STOP=1 -c "$1"; }
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [[ $rc -ne 0 ]]; then
    for f in "$WORK"/*.log; do
      [[ -f "$f" ]] || continue
      echo "---- last lines of $(basename "$f")" >&2
      tail -n 20 "$f" >&2
    done
  fi
  psql_base -c "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_http() {
  for _ in $(seq 1 200); do curl -fsS "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
  fail "no answer from $1"
}

psql_base -c "CREATE DATABASE \"$DB\"" >/dev/null
DEAD=$(free_port)
sed "s#http://127.0.0.1:8091#http://127.0.0.1:$DEAD#" \
  "$ROOT/examples/travel_booking/tools.http.json" >"$WORK/tools.json"

# A slow provider for the cancel check: POST /slow leaves a file when a call
# arrives and answers once the test leaves WORK/release (at most after 60 s:
# no fixed delay races a slow machine), POST /undo at once.
SLOW_PORT=$(free_port)
python3 - "$SLOW_PORT" "$WORK" <<'PY' >"$WORK/slow.log" 2>&1 &
import http.server, json, os, sys, time
port, work = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/slow":
            open(os.path.join(work, "slow.entered"), "a").write("x")
            deadline = time.time() + 60
            while not os.path.exists(os.path.join(work, "release")) and time.time() < deadline:
                time.sleep(0.05)
        body = json.dumps({"ok": True, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        open(os.path.join(work, "calls"), "a").write(self.path + "\n")
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
PY
PIDS+=($!)
python3 - "$WORK/tools.json" "$SLOW_PORT" <<'PY'
import json, sys
path, port = sys.argv[1], sys.argv[2]
doc = json.load(open(path))
base = "http://127.0.0.1:" + port
doc["tools"] += [
    {"name": "slow.do", "effect": "write", "honours_keys": True, "base_url": base,
     "commit": {"method": "POST", "path": "/slow"}, "timeout_ms": 90000},
    {"name": "slow.undo", "effect": "idempotent", "honours_keys": True, "base_url": base,
     "commit": {"method": "POST", "path": "/undo"}, "timeout_ms": 10000}]
json.dump(doc, open(path, "w"))
PY

serve() {  # serve NAME PORT
  "$IDEM" --store "$URL" --keys "$WORK/keys.json" serve --listen "127.0.0.1:$2" \
    --insecure-no-auth --tools "$WORK/tools.json" --workers 2 >"$WORK/$1.log" 2>&1 &
  PIDS+=($!)
  eval "PID_$1=$!"
}
PORT_A=$(free_port)
PORT_B=$(free_port)
serve a "$PORT_A"
wait_http "http://127.0.0.1:$PORT_A/readyz"  # A migrates the database first
serve b "$PORT_B"
wait_http "http://127.0.0.1:$PORT_B/readyz"
A="http://127.0.0.1:$PORT_A/v1"
B="http://127.0.0.1:$PORT_B/v1"
J="Content-Type: application/json"

# post URL KEY BODY: prints the status line's code, then headers and body to files.
post() {
  curl -sS -o "$WORK/body" -D "$WORK/headers" -w '%{http_code}' -X POST "$1/sagas" -H "$J" \
    -H "Idempotency-Key: $2" --data "$3"
}
json() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$WORK/body" "$1"; }

INLINE=$(python3 -c 'import json,sys; print(json.dumps({"spec": json.load(open(sys.argv[1])), "input": json.load(open(sys.argv[2]))}))' \
  "$ROOT/examples/travel_booking/trip.json" "$ROOT/examples/travel_booking/input.json")

# ---- 1. A keyed request to A, its retry to B: A's stored response.
code=$(post "$A" trip-1 "$INLINE")
[[ "$code" == 201 ]] || fail "A answered $code: $(cat "$WORK/body")"
SAGA=$(json saga_id)
cp "$WORK/body" "$WORK/first.json"
code=$(post "$B" trip-1 "$INLINE")
[[ "$code" == 201 ]] || fail "the retry on B answered $code, not A's 201: $(cat "$WORK/body")"
grep -qi '^Idempotent-Replayed: true' "$WORK/headers" || fail "B did not replay A's response"
cmp -s "$WORK/first.json" "$WORK/body" || fail "B's replay differs from A's response"
[[ "$(json saga_id)" == "$SAGA" ]] || fail "B answered another saga"
[[ "$(q 'SELECT count(*) FROM sagas')" == 1 ]] || fail "a second saga was recorded"
echo "ok: the retry on B got A's stored response (saga $SAGA)"

# ---- 2. The same key with another payload on B: 422.
OTHER=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["input"]["traveller"]="someone else"; print(json.dumps(d))' "$INLINE")
code=$(post "$B" trip-1 "$OTHER")
[[ "$code" == 422 ]] || fail "another payload on B answered $code: $(cat "$WORK/body")"
grep -q 'idempotency-key-reused' "$WORK/body" || fail "B's 422 is not idempotency-key-reused"
[[ "$(q 'SELECT count(*) FROM sagas')" == 1 ]] || fail "the 422 recorded a saga"
echo "ok: the same key with another payload on B is 422"

# ---- 3. A spec registered on A is submitted by name on B.
code=$(curl -sS -o "$WORK/body" -w '%{http_code}' -X PUT "$A/specs/trip" -H "$J" \
  --data @"$ROOT/examples/travel_booking/trip.json")
[[ "$code" == 201 ]] || fail "PUT /v1/specs/trip on A answered $code: $(cat "$WORK/body")"
BYNAME=$(python3 -c 'import json,sys; print(json.dumps({"spec": "trip", "input": json.load(open(sys.argv[1]))}))' \
  "$ROOT/examples/travel_booking/input.json")
code=$(post "$B" trip-by-name "$BYNAME")
[[ "$code" == 201 ]] || fail "submitting spec trip by name on B answered $code: $(cat "$WORK/body")"
[[ "$(json saga_id)" != "$SAGA" ]] || fail "the by-name submission reused the first saga"
[[ "$(q 'SELECT count(*) FROM sagas')" == 2 ]] || fail "the by-name saga was not recorded"
echo "ok: the spec registered on A was submitted by name on B"

# ---- 4. A cancel sent to B of a saga that A drives: A honours it.
# B stops, so that A takes the saga up; B comes back (on a port of its own:
# the old one may have been taken meanwhile) while A's first call is held by
# the slow provider, and the cancel goes to B; then the call is let go.
kill "$PID_b"
wait "$PID_b" 2>/dev/null || true
SLOW='{"spec": {"name": "slow", "steps": [
  {"id": "first", "tool": "slow.do", "compensate": {"tool": "slow.undo"}},
  {"id": "second", "tool": "slow.do", "compensate": {"tool": "slow.undo"}}]}, "input": {}}'
code=$(post "$A" slow-1 "$SLOW")
[[ "$code" == 201 ]] || fail "A answered $code to the slow saga: $(cat "$WORK/body")"
SLOW_SAGA=$(json saga_id)
for _ in $(seq 1 100); do [[ -f "$WORK/slow.entered" ]] && break; sleep 0.1; done
[[ -f "$WORK/slow.entered" ]] || fail "A never called the slow provider"
PORT_B=$(free_port)
B="http://127.0.0.1:$PORT_B/v1"
serve b "$PORT_B"
wait_http "http://127.0.0.1:$PORT_B/readyz"
# Body-less (cpp-httplib needs the Content-Length; the new HTTP front not).
code=$(curl -sS -o "$WORK/body" -w '%{http_code}' -X POST -H "Content-Length: 0" \
  "$B/sagas/$SLOW_SAGA/cancel")
[[ "$code" == 202 ]] || fail "the cancel on B answered $code, not 202: $(cat "$WORK/body")"
[[ "$(q "SELECT kind FROM saga_controls WHERE saga_id = '$SLOW_SAGA'")" == cancel ]] ||
  fail "the cancel is not recorded in the store"
! grep -qs '^/slow$' "$WORK/calls" ||
  fail "the slow call finished before it was let go"
touch "$WORK/release"
for _ in $(seq 1 300); do
  [[ "$(q "SELECT state FROM sagas WHERE saga_id = '$SLOW_SAGA'")" == compensated ]] && break
  sleep 0.1
done
[[ "$(q "SELECT state FROM sagas WHERE saga_id = '$SLOW_SAGA'")" == compensated ]] ||
  fail "the saga did not roll back: $(q "SELECT state, reason FROM sagas WHERE saga_id = '$SLOW_SAGA'")"
[[ "$(q "SELECT state FROM steps WHERE saga_id = '$SLOW_SAGA' ORDER BY idx" | tr '\n' ' ')" == "compensated planned " ]] ||
  fail "steps: $(q "SELECT step_id, state FROM steps WHERE saga_id = '$SLOW_SAGA' ORDER BY idx")"
[[ "$(grep -c '^/slow$' "$WORK/calls")" == 1 ]] || fail "the second step was called"
[[ "$(q "SELECT count(*) FROM saga_controls")" == 0 ]] || fail "the cancel was not settled"
echo "ok: the cancel sent to B was honoured by A (saga $SLOW_SAGA rolled back)"
echo "PASS"
