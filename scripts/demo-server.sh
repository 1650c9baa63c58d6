#!/usr/bin/env bash
# The travel saga through `idem serve`, with curl, all over HTTPS: a
# throwaway CA and server certificate are made with openssl in the demo's
# temporary folder; the four providers run as a real HTTPS server on
# loopback (travel-providers --tls-cert/--tls-key), idem calls them as HTTP
# tools (examples/travel_booking/tools.http.json, with https:// and the CA as
# "ca_file") with Idempotency-Key headers, an agent submits the trip over the
# REST API of `idem serve --tls-cert/--tls-key` (and retries it), a person
# approves the payment over HTTPS, and the providers' ledger shows one effect
# per step. Part 4 books a trip with a slow provider (an airport transfer
# confirmed seconds later): the saga waits in awaiting_completion, then the
# server's status check finishes it.
# Usage: scripts/demo-server.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
IDEM="$BUILD/idem"
PROVIDERS="$BUILD/examples/travel_booking/travel-providers"
LEDGER="$BUILD/examples/travel_booking/travel-ledger"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-demo-server.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

bold() { printf '\n\033[1m%s\033[0m\n' "$*"; }
say() { printf '\n$ %s\n' "$*"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {
  for _ in $(seq 1 100); do curl -fsS --cacert "$CA" "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "no answer from $1" >&2
  return 1
}

PPORT=$(free_port)
SPORT=$(free_port)

bold "== A throwaway CA and a certificate for 127.0.0.1 and localhost (openssl) =="
TLS="$WORK/tls"
CA="$TLS/ca.pem"
mkdir -p "$TLS"
(
  cd "$TLS"
  umask 077
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj "/CN=idem demo CA" -keyout ca.key -out ca.pem \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
    -keyout server.key -out server.csr 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >server.ext
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
    -extfile server.ext -out server.pem 2>/dev/null
  chmod 644 ca.pem server.pem
)
echo "CA $CA; server.pem for localhost and 127.0.0.1 (key 0600)"
TLS_FLAGS=(--tls-cert "$TLS/server.pem" --tls-key "$TLS/server.key")
# The tools file, pointed at the HTTPS providers, trusting the demo CA.
python3 - "$ROOT/examples/travel_booking/tools.http.json" "$WORK/tools.json" "$PPORT" "$CA" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for t in doc["tools"]:
    t["base_url"] = t["base_url"].replace("http://127.0.0.1:8091", "https://127.0.0.1:" + sys.argv[3])
    t["ca_file"] = sys.argv[4]
json.dump(doc, open(sys.argv[2], "w"), indent=2)
PY

bold "== The providers, over HTTPS on 127.0.0.1:$PPORT =="
"$PROVIDERS" --listen "127.0.0.1:$PPORT" --ledger "$WORK/ledger.sqlite" "${TLS_FLAGS[@]}" \
  >"$WORK/providers.log" 2>&1 &
PIDS+=($!)
wait_http "https://127.0.0.1:$PPORT/healthz"
echo "travel-providers is up (flights and payments honour Idempotency-Key; hotels offer a status lookup; cars neither)"

bold "== idem serve on https://127.0.0.1:$SPORT =="
AGENT_TOKEN=$(openssl rand -hex 32)
APPROVER_TOKEN=$(openssl rand -hex 32)
sha() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
cat >"$WORK/auth.json" <<JSON
[{"name": "agent-1", "token_sha256": "$(sha "$AGENT_TOKEN")", "roles": ["agent"]},
 {"name": "maria", "token_sha256": "$(sha "$APPROVER_TOKEN")", "roles": ["approver"]}]
JSON
chmod 600 "$WORK/auth.json"
"$IDEM" --store "$WORK/journal.db" serve --listen "127.0.0.1:$SPORT" --auth "$WORK/auth.json" \
  --tools "$WORK/tools.json" --workers 4 "${TLS_FLAGS[@]}" >"$WORK/server.log" 2>&1 &
PIDS+=($!)
wait_http "https://127.0.0.1:$SPORT/healthz"
echo "tokens stored hashed in auth.json; agent-1 may submit, maria may approve"

API="https://127.0.0.1:$SPORT/v1"
AGENT=(--cacert "$CA" -H "Authorization: Bearer $AGENT_TOKEN" -H "Content-Type: application/json")
APPROVER=(--cacert "$CA" -H "Authorization: Bearer $APPROVER_TOKEN" -H "Content-Type: application/json")
# The POST /v1/sagas body for a spec of the travel example and its input.
body_of() {
  python3 -c 'import json,sys; print(json.dumps({"spec": json.load(open(sys.argv[1])), "input": json.load(open(sys.argv[2]))}))' \
    "$ROOT/examples/travel_booking/$1" "$ROOT/examples/travel_booking/input.json"
}
state_of() {  # SAGA
  curl -sS "$API/sagas/$1" "${AGENT[@]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])'
}
wait_state() {  # SAGA STATE PAUSE: up to 100 polls
  for _ in $(seq 1 100); do
    STATE=$(state_of "$1")
    [ "$STATE" = "$2" ] && return 0
    sleep "$3"
  done
}
show_saga() {  # SAGA: its state and steps
  curl -sS "$API/sagas/$1" "${AGENT[@]}" | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("state:", d["state"])
for s in d["steps"]:
    print("  %-16s %-12s %s" % (s["id"], s["state"], s.get("external_ref", "")))'
}
BODY=$(body_of trip.json)

bold "== 1. The agent submits the trip =="
say "curl -X POST $API/sagas -H 'Idempotency-Key: ana-tokyo' -d '{\"spec\": <trip.json>, \"input\": <input.json>}'"
curl -sS -X POST "$API/sagas" "${AGENT[@]}" -H "Idempotency-Key: ana-tokyo" -d "$BODY" -o "$WORK/submit.json" -w "HTTP %{http_code}\n"
SAGA=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["saga_id"])' "$WORK/submit.json")
echo "saga $SAGA"
say "the agent repeats itself (same key, same body)"
curl -sS -X POST "$API/sagas" "${AGENT[@]}" -H "Idempotency-Key: ana-tokyo" -d "$BODY" -o /dev/null -D - | grep -iE "^HTTP|idempotent-replayed" || true
say "the same key with another body"
curl -sS -X POST "$API/sagas" "${AGENT[@]}" -H "Idempotency-Key: ana-tokyo" -d "${BODY/Ana/Bob}" -w "\nHTTP %{http_code}\n"

bold "== 2. The payment waits for a person =="
wait_state "$SAGA" awaiting_approval 0.1
echo "saga state: $STATE"
say "curl $API/approvals   # as maria"
curl -sS "$API/approvals" "${APPROVER[@]}" -o "$WORK/approvals.json"
python3 - "$WORK/approvals.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for a in (d["approvals"] if isinstance(d, dict) else d):
    print("  %s %s: %s" % (a["saga_id"], a["step"], a["preview"].get("summary", "")))
PY
TOKEN=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
items = d["approvals"] if isinstance(d, dict) else d
print(items[0]["token"])' "$WORK/approvals.json")
say "curl -X POST $API/approvals/\$TOKEN/approve -d '{\"note\": \"within budget\"}'   # as maria"
curl -sS -X POST "$API/approvals/$TOKEN/approve" "${APPROVER[@]}" -d '{"note": "within budget"}' \
  -o "$WORK/approved.json" -w "HTTP %{http_code}\n"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("saga state:", d["state"])' "$WORK/approved.json"

bold "== 3. What the providers did =="
say "curl $API/sagas/$SAGA"
show_saga "$SAGA"
say "travel-ledger ledger.sqlite --check"
"$LEDGER" "$WORK/ledger.sqlite" --check
bold "== 4. A provider that finishes later (trip_async.json: an airport transfer) =="
ABODY=$(body_of trip_async.json)
say "curl -X POST $API/sagas -H 'Idempotency-Key: ana-transfer' -d '{\"spec\": <trip_async.json>, ...}'"
ASAGA=$(curl -sS -X POST "$API/sagas" "${AGENT[@]}" -H "Idempotency-Key: ana-transfer" -d "$ABODY" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["saga_id"])')
sleep 1
echo "the transfer provider took the call (202, a job id, Retry-After); nothing is held while it works:"
show_saga "$ASAGA"
wait_state "$ASAGA" succeeded 0.2
echo "a few seconds later the server's status check sees it confirmed, and the payment runs:"
show_saga "$ASAGA"
say "travel-ledger ledger.sqlite --check"
"$LEDGER" "$WORK/ledger.sqlite" --check

say "curl --cacert ca.pem https://127.0.0.1:$SPORT/metrics | grep idem_sagas"
curl -sS --cacert "$CA" "https://127.0.0.1:$SPORT/metrics" | grep -E "^idem_sagas" | head -12 || true
