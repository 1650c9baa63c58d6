#!/usr/bin/env bash
# The travel example's asynchronous trip over HTTPS, through `idem serve`,
# with the server killed while the saga waits for its slow provider.
#
#   async_trip_test.sh IDEM PROVIDERS LEDGER ROOT
#
# IDEM is the idem binary, PROVIDERS travel-providers, LEDGER travel-ledger,
# ROOT the source tree. Real processes on loopback ports:
#   - travel-providers over HTTPS (a CA and certificate made by
#     tests/tls_certs.sh), the slow transfer provider confirming a job 4 s
#     after it took it;
#   - `idem serve` with the shipped tools file pointed at https:// and the CA.
# The trip_async saga is submitted over the REST API. Once it waits
# (awaiting_completion, the transfer `processing` with the provider's job
# id) the server is killed with SIGKILL, and a second server on the same
# journal finishes it: the transfer confirmed by a status check, then the
# payment. The ledger must then hold exactly one effect per step, no
# duplicate, and one transfer call: nothing was sent twice.
set -euo pipefail

[[ $# -eq 4 ]] || {
  echo "usage: $0 IDEM PROVIDERS LEDGER ROOT" >&2
  exit 2
}
IDEM=$1
PROVIDERS=$2
LEDGER=$3
ROOT=$4
WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-async-trip.XXXXXX")
PIDS=()
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
      tail -n 30 "$f" >&2
    done
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT INT TERM

fail() {
  echo "async_trip_test: FAIL: $*" >&2
  exit 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {
  for _ in $(seq 1 150); do
    curl -fsS --cacert "$WORK/tls/ca.pem" "$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  fail "no answer from $1"
}
# The saga's JSON view (GET /v1/sagas/ID) as one line per field asked for.
saga_field() {
  curl -sS --cacert "$WORK/tls/ca.pem" "$API/sagas/$SAGA" | python3 -c '
import json, sys
d = json.load(sys.stdin)
steps = {s["id"]: s for s in d["steps"]}
for q in sys.argv[1:]:
    if q == "state":
        print(d["state"])
    else:
        step, field = q.split(".")
        print(steps[step].get(field, ""))' "$@"
}
wait_state() {  # STATE SECONDS
  local state=""
  for _ in $(seq 1 $(($2 * 10))); do
    state=$(saga_field state)
    [[ "$state" == "$1" ]] && return 0
    sleep 0.1
  done
  fail "saga $SAGA is $state after $2 s, expected $1"
}

bash "$ROOT/tests/tls_certs.sh" "$WORK/tls"
PPORT=$(free_port)
SPORT=$(free_port)
TLS_FLAGS=(--tls-cert "$WORK/tls/server.pem" --tls-key "$WORK/tls/server.key")
python3 - "$ROOT/examples/travel_booking/tools.http.json" "$WORK/tools.json" "$PPORT" \
  "$WORK/tls/ca.pem" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for t in doc["tools"]:
    t["base_url"] = t["base_url"].replace("http://127.0.0.1:8091", "https://127.0.0.1:" + sys.argv[3])
    t["ca_file"] = sys.argv[4]
json.dump(doc, open(sys.argv[2], "w"), indent=2)
PY

"$PROVIDERS" --listen "127.0.0.1:$PPORT" --ledger "$WORK/ledger.sqlite" --confirm-delay-ms 4000 \
  "${TLS_FLAGS[@]}" >"$WORK/providers.log" 2>&1 &
PIDS+=($!)
wait_http "https://127.0.0.1:$PPORT/healthz"

serve() {  # LOG: a server on the journal, on SPORT
  "$IDEM" --store "$WORK/journal.db" serve --listen "127.0.0.1:$SPORT" --insecure-no-auth \
    --tools "$WORK/tools.json" --workers 4 "${TLS_FLAGS[@]}" >"$WORK/$1" 2>&1 &
  SERVER=$!
  PIDS+=("$SERVER")
  wait_http "https://127.0.0.1:$SPORT/healthz"
}
serve server1.log
API="https://127.0.0.1:$SPORT/v1"

BODY=$(python3 -c 'import json,sys; print(json.dumps({"spec": json.load(open(sys.argv[1])), "input": json.load(open(sys.argv[2]))}))' \
  "$ROOT/examples/travel_booking/trip_async.json" "$ROOT/examples/travel_booking/input.json")
SAGA=$(curl -sS --cacert "$WORK/tls/ca.pem" -X POST "$API/sagas" -H "Content-Type: application/json" \
  -H "Idempotency-Key: async-trip-1" -d "$BODY" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["saga_id"])')
[[ -n "$SAGA" ]] || fail "no saga id from POST /v1/sagas"

# The saga waits for the transfer; the other branches are done.
wait_state awaiting_completion 20
mapfile -t seen < <(saga_field book_transfer.state book_transfer.external_ref reserve_flight.state \
  charge_payment.state)
[[ "${seen[0]}" == "processing" ]] || fail "book_transfer is ${seen[0]}, expected processing"
[[ "${seen[1]}" == JOB-* ]] || fail "book_transfer's reference is '${seen[1]}', expected the job id"
[[ "${seen[2]}" == "succeeded" ]] || fail "reserve_flight is ${seen[2]}"
[[ "${seen[3]}" == "planned" ]] || fail "charge_payment is ${seen[3]} while the transfer waits"

# SIGKILL while it waits; a new server on the same journal finishes it.
kill -KILL "$SERVER"
wait "$SERVER" 2>/dev/null || true
serve server2.log
wait_state succeeded 30
mapfile -t seen < <(saga_field book_transfer.state book_transfer.external_ref charge_payment.state)
[[ "${seen[0]}" == "succeeded" ]] || fail "book_transfer is ${seen[0]}"
[[ "${seen[1]}" == TR-* ]] || fail "book_transfer's reference is '${seen[1]}', expected the transfer id"
[[ "${seen[2]}" == "succeeded" ]] || fail "charge_payment is ${seen[2]}"

# The providers' side: one effect per step, no duplicate, one transfer call.
"$LEDGER" "$WORK/ledger.sqlite" --json >"$WORK/ledger.json"
python3 - "$WORK/ledger.json" <<'PY' || fail "the ledger does not show exactly one effect per step"
import json, sys
d = json.load(open(sys.argv[1]))
effects = {}
for e in d["effects"]:
    effects[(e["provider"], e["operation"])] = effects.get((e["provider"], e["operation"]), 0) + 1
want = {("flights", "reserve"): 1, ("hotels", "book"): 1, ("cars", "rent"): 1,
        ("transfers", "book"): 1, ("payments", "charge"): 1}
calls = [c for c in d["calls"] if c["provider"] == "transfers" and c["operation"] == "book"]
lookups = [c["outcome"] for c in d["calls"] if c["provider"] == "transfers" and c["operation"] == "lookup"]
ok = effects == want and not d["duplicates"] and len(calls) == 1 and lookups.count("confirmed") == 1
print("effects", effects, "duplicates", d["duplicates"], "transfer calls", len(calls), "lookups", lookups)
sys.exit(0 if ok else 1)
PY
echo "async_trip_test: ok (saga $SAGA succeeded across a SIGKILL of serve while it waited)"
