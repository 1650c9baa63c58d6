#!/usr/bin/env bash
# The travel demo on the embedded store (SQLite), in three scenarios:
#   1. the happy path: flight, hotel and car booked at once (parallel steps:
#      their calls overlap, the journal shows the three `submitted` before any
#      outcome); the payment, after all three, is previewed and waits for a
#      person; `approve` from a second command commits it;
#   2. failures rolled back: the hotel refuses (the flight and the car, booked
#      beside it, are undone); the card is declined at commit (car, hotel and
#      flight undone in reverse order of completion);
#   3. the process killed with SIGKILL mid-saga and `recover` finishing it,
#      with the providers' ledger showing one effect per step.
# Usage: scripts/demo.sh [BUILD_DIR]
set -uo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN="$ROOT/$BUILD/examples/travel_booking"
[ -d "$BIN" ] || BIN="$BUILD/examples/travel_booking"
TB="$BIN/travel-booking"
LEDGER="$BIN/travel-ledger"
SPEC="$ROOT/examples/travel_booking/trip.json"
INPUT="@$ROOT/examples/travel_booking/input.json"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-demo.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

bold() { printf '\n\033[1m%s\033[0m\n' "$*"; }
say() { printf '\n$ %s\n' "$*"; }
# The commit token of the first pending approval.
token() {
  "$TB" --db "$1" approvals --json |
    sed -n 's/^ *"token": "\(.*\)",\{0,1\}$/\1/p' | head -n 1
}

bold "== 1. Happy path: flight, hotel and car at once; the payment waits for a person =="
DB="$WORK/happy.db"
say "travel-booking --db happy.db run trip.json --input @input.json --intent-key ana-tokyo"
"$TB" --db "$DB" run "$SPEC" --input "$INPUT" --intent-key ana-tokyo
echo "(exit $?: 7 = waiting for approval; this process is gone, the saga waits in the journal)"
say "travel-booking --db happy.db status \$SAGA   # flight, hotel, car submitted together, then their outcomes"
"$TB" --db "$DB" list --json | sed -n 's/^ *"saga_id": "\(.*\)",\{0,1\}$/\1/p' | head -n 1 |
  xargs -r "$TB" --db "$DB" status
say "travel-booking --db happy.db approvals"
"$TB" --db "$DB" approvals
TOKEN=$(token "$DB")
say "travel-booking --db happy.db approve \$TOKEN --as maria --note 'within the travel budget'"
"$TB" --db "$DB" approve "$TOKEN" --as maria --note "within the travel budget"
echo "(exit $?)"
say "travel-booking --db happy.db run trip.json --input @input.json --intent-key ana-tokyo   # the agent repeats itself"
"$TB" --db "$DB" run "$SPEC" --input "$INPUT" --intent-key ana-tokyo
echo "(exit $?: the same saga, nothing called twice)"
say "travel-booking --db happy.db approve \$TOKEN --as maria   # the approval is replayed"
"$TB" --db "$DB" approve "$TOKEN" --as maria
echo "(exit $?: the recorded outcome, no second charge)"
"$LEDGER" "$DB.ledger.sqlite"

bold "== 2a. The hotel refuses: the flight and the car, booked beside it, are undone =="
DB="$WORK/rollback.db"
say "travel-booking --fault hotels.book=reject run trip.json ..."
"$TB" --db "$DB" --fault hotels.book=reject run "$SPEC" --input "$INPUT" --intent-key ana-hotel-full
echo "(exit $?: 3 = rolled back)"

bold "== 2b. The card is declined at commit: car, hotel and flight undone in reverse order of completion =="
say "travel-booking run trip.json ...   # waits for approval"
"$TB" --db "$DB" run "$SPEC" --input "$INPUT" --intent-key ana-card-declined >/dev/null
echo "(exit $?)"
TOKEN=$(token "$DB")
say "travel-booking --fault payments.charge=reject approve \$TOKEN --as maria"
"$TB" --db "$DB" --fault payments.charge=reject approve "$TOKEN" --as maria
echo "(exit $?: 3 = rolled back)"
"$LEDGER" "$DB.ledger.sqlite"

bold "== 3. SIGKILL mid-saga, then recover =="
DB="$WORK/crash.db"
echo "Flight, hotel and car are booked at once; the second provider to commit its"
echo "booking does, and the process is killed before the answer reaches the"
echo "journal, the third call perhaps still in flight (IDEM_FAILPOINT=provider.after_apply=kill@2)."
say "IDEM_FAILPOINT='provider.after_apply=kill@2' travel-booking --db crash.db run trip.json ..."
IDEM_FAILPOINT='provider.after_apply=kill@2' "$TB" --db "$DB" run "$SPEC" --input "$INPUT" \
  --intent-key ana-crash
rc=$?
echo "(exit $rc: $( [ $rc -eq 137 ] && echo 'killed by SIGKILL' || echo 'unexpected' ))"
say "travel-booking --db crash.db list"
"$TB" --db "$DB" list
echo "Each branch is settled without a second booking: the flight by its key, the"
echo "hotel (which does not deduplicate keys) through its status endpoint; a car"
echo "whose answer was lost waits for a person (cars neither dedupe nor answer lookups):"
say "travel-booking --db crash.db recover"
"$TB" --db "$DB" recover
echo "(exit $?: 0, or 4 = a person must look at the car)"
TOKEN=$(token "$DB")
if [ -n "$TOKEN" ]; then
  say "travel-booking --db crash.db approve \$TOKEN --as maria"
  "$TB" --db "$DB" approve "$TOKEN" --as maria
  echo "(exit $?)"
fi
say "travel-ledger crash.db.ledger.sqlite --check"
"$LEDGER" "$DB.ledger.sqlite" --check
rc=$?
if [ $rc -eq 0 ]; then echo "one effect per step: no duplicates"; else echo "DUPLICATES FOUND"; exit 1; fi
