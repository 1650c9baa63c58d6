#!/usr/bin/env bash
# The travel saga through `idem serve`, with curl: the four providers run as
# a real HTTP server on loopback (travel-providers), idem calls them as HTTP
# tools (examples/travel_booking/tools.http.json) with Idempotency-Key
# headers, an agent submits the trip over the REST API (and retries it), a
# person approves the payment over HTTP, and the providers' ledger shows one
# effect per step.
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
  for _ in $(seq 1 100); do curl -fsS "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "no answer from $1" >&2
  return 1
}

PPORT=$(free_port)
SPORT=$(free_port)
sed "s#http://127.0.0.1:8091#http://127.0.0.1:$PPORT#" \
  "$ROOT/examples/travel_booking/tools.http.json" >"$WORK/tools.json"

bold "== The providers, over HTTP on 127.0.0.1:$PPORT =="
"$PROVIDERS" --listen "127.0.0.1:$PPORT" --ledger "$WORK/ledger.sqlite" >"$WORK/providers.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$PPORT/healthz"
echo "travel-providers is up (flights and payments honour Idempotency-Key; hotels offer a status lookup; cars neither)"

bold "== idem serve on 127.0.0.1:$SPORT =="
AGENT_TOKEN=$(openssl rand -hex 32)
APPROVER_TOKEN=$(openssl rand -hex 32)
sha() { printf %s "$1" | sha256sum | cut -d' ' -f1; }
cat >"$WORK/auth.json" <<JSON
[{"name": "agent-1", "token_sha256": "$(sha "$AGENT_TOKEN")", "roles": ["agent"]},
 {"name": "maria", "token_sha256": "$(sha "$APPROVER_TOKEN")", "roles": ["approver"]}]
JSON
chmod 600 "$WORK/auth.json"
"$IDEM" --store "$WORK/journal.db" serve --listen "127.0.0.1:$SPORT" --auth "$WORK/auth.json" \
  --tools "$WORK/tools.json" --workers 4 >"$WORK/server.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$SPORT/healthz"
echo "tokens stored hashed in auth.json; agent-1 may submit, maria may approve"

API="http://127.0.0.1:$SPORT/v1"
AGENT=(-H "Authorization: Bearer $AGENT_TOKEN" -H "Content-Type: application/json")
APPROVER=(-H "Authorization: Bearer $APPROVER_TOKEN" -H "Content-Type: application/json")
BODY=$(python3 -c 'import json,sys; print(json.dumps({"spec": json.load(open(sys.argv[1])), "input": json.load(open(sys.argv[2]))}))' \
  "$ROOT/examples/travel_booking/trip.json" "$ROOT/examples/travel_booking/input.json")

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
for _ in $(seq 1 100); do
  STATE=$(curl -sS "$API/sagas/$SAGA" "${AGENT[@]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  [ "$STATE" = "awaiting_approval" ] && break
  sleep 0.1
done
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
curl -sS "$API/sagas/$SAGA" "${AGENT[@]}" | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("state:", d["state"])
for s in d["steps"]:
    print("  %-16s %-12s %s" % (s["id"], s["state"], s.get("external_ref", "")))'
say "travel-ledger ledger.sqlite --check"
"$LEDGER" "$WORK/ledger.sqlite" --check
say "curl http://127.0.0.1:$SPORT/metrics | grep idem_sagas"
curl -sS "http://127.0.0.1:$SPORT/metrics" | grep -E "^idem_sagas" | head -12 || true
