#!/usr/bin/env bash
# Nothing wedges, from the command line (issue 11, defect 1), on the real
# travel-booking binary and its providers' ledger:
#
#   wedge_cli_test.sh TRAVEL_BOOKING TRAVEL_LEDGER SOURCE_DIR
#
# The trip is killed with SIGKILL after the car's provider applied the rental
# (IDEM_FAILPOINT='provider.after_apply=kill@3'); `recover` parks the car
# step (exit 4) and says so; a second `recover` finds nothing to move (exit
# 0). `resolve ... applied` without --result is refused with the missing
# path (exit 2) and writes nothing. Then:
#   A. the person passes the rental's id (--result), rejects the payment, and
#      the rollback returns the car, cancels the hotel and the flight;
#   B. the journal is left as an earlier build's resolve left it (the car's
#      result without rental_id, edited in the file): rejecting the payment
#      parks the car's return needs_attention (missing_value, exit 4) instead
#      of staying `compensating`; `recover` leaves it alone; the person
#      settles the car by hand (resolve --decision undone) and the rollback
#      cancels the hotel and the flight (exit 3, compensated).
# The ledger is counted after each case.
set -euo pipefail

[[ $# -eq 3 ]] || {
  echo "usage: $0 TRAVEL_BOOKING TRAVEL_LEDGER SOURCE_DIR" >&2
  exit 2
}
TB=$1
LEDGER=$2
SRC=$3
# The trip with its steps one after another: kill@3 counts the car third.
SPEC="$SRC/tests/specs/trip_sequential.json"
INPUT="@$SRC/examples/travel_booking/input.json"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-wedge-cli.XXXXXX")
trap 'rc=$?; if [[ $rc -ne 0 ]]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi' EXIT
unset IDEM_FAILPOINT IDEM_STORE IDEM_DB

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# run NAME EXPECTED_EXIT ARGS...: runs travel-booking, output in $WORK/NAME.{out,err}.
run() {
  local name=$1 want=$2
  shift 2
  local rc=0
  "$TB" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" || rc=$?
  if [[ $rc -ne $want ]]; then
    cat "$WORK/$name.out" "$WORK/$name.err" >&2
    fail "$name: exit $rc, want $want"
  fi
}
expect_in() {  # FILE TEXT
  grep -qF -- "$2" "$1" || {
    cat "$1" >&2
    fail "$(basename "$1") lacks: $2"
  }
}
# effects PROVIDER OPERATION DB: how many the ledger holds.
effects() {
  "$LEDGER" "$3.ledger.sqlite" --json |
    jq --arg p "$1" --arg o "$2" '[.effects[] | select(.provider == $p and .operation == $o)] | length'
}
expect_effects() {  # DB PROVIDER OPERATION N
  local n
  n=$(effects "$2" "$3" "$1")
  [[ $n -eq $4 ]] || fail "ledger: $2 $3 applied $n times, want $4"
}
journal_size() { "$TB" --db "$1" status "$2" --json | jq '.journal | length'; }

# Killed after the car was rented, recovered, refused: common to both cases.
park_the_car() {
  local db=$1 tag=$2
  local rc=0
  IDEM_FAILPOINT='provider.after_apply=kill@3' "$TB" --db "$db" run "$SPEC" --input "$INPUT" \
    >"$WORK/$tag-run.out" 2>"$WORK/$tag-run.err" || rc=$?
  [[ $rc -eq 137 ]] || fail "$tag: the run was not killed (exit $rc)"
  run "$tag-recover" 4 --db "$db" recover
  SAGA=$("$TB" --db "$db" list --json | jq -r '.[0].saga_id')
  expect_in "$WORK/$tag-recover.out" "parked $SAGA: needs_attention - step rent_car:"
  expect_in "$WORK/$tag-recover.out" "1 saga(s) resumed (1 of them parked: needs attention), 0 not moved"
  run "$tag-recover-again" 0 --db "$db" recover
  expect_in "$WORK/$tag-recover-again.out" "0 saga(s) resumed (0 of them parked"
  local before
  before=$(journal_size "$db" "$SAGA")
  run "$tag-resolve-bare" 2 --db "$db" resolve "$SAGA" rent_car --decision applied --as ops
  expect_in "$WORK/$tag-resolve-bare.err" \
    'resolve rent_car as applied: compensation of rent_car references ${steps.rent_car.result.rental_id}; pass --result with a JSON object that has rental_id'
  [[ $(journal_size "$db" "$SAGA") -eq $before ]] || fail "$tag: a refused resolve wrote"
  RENTAL=$("$LEDGER" "$db.ledger.sqlite" --json |
    jq -r '.effects[] | select(.provider == "cars" and .operation == "rent") | .result.rental_id')
  [[ -n $RENTAL ]] || fail "$tag: no rental in the ledger"
}
token_of() { "$TB" --db "$1" approvals --json | jq -r '.[0].token'; }

# ---- A: the person passes the values the compensation needs
DB="$WORK/a.db"
park_the_car "$DB" a
run a-resolve 7 --db "$DB" resolve "$SAGA" rent_car --decision applied --as ops \
  --result "{\"rental_id\": \"$RENTAL\"}"
run a-reject 3 --db "$DB" reject "$(token_of "$DB")" --as ops --reason "trip called off"
[[ $("$TB" --db "$DB" status "$SAGA" --json | jq -r .state) == compensated ]] || fail "A: not compensated"
expect_effects "$DB" flights reserve 1
expect_effects "$DB" flights cancel 1
expect_effects "$DB" hotels book 1
expect_effects "$DB" hotels cancel 1
expect_effects "$DB" cars rent 1
expect_effects "$DB" cars return 1
expect_effects "$DB" payments charge 0
echo "A: rolled back; flight, hotel and car undone by their tools"

# ---- B: a journal with the car's result lacking rental_id
DB="$WORK/b.db"
park_the_car "$DB" b
run b-resolve 7 --db "$DB" resolve "$SAGA" rent_car --decision applied --as ops \
  --result "{\"rental_id\": \"$RENTAL\"}"
# What an earlier build's `resolve` without --result wrote.
sqlite3 "$DB" "UPDATE steps SET result = '{}' WHERE saga_id = '$SAGA' AND step_id = 'rent_car'"
run b-reject 4 --db "$DB" reject "$(token_of "$DB")" --as ops --reason "trip called off"
"$TB" --db "$DB" status "$SAGA" --json >"$WORK/b-status.json"
[[ $(jq -r .state "$WORK/b-status.json") == needs_attention ]] || fail "B: not parked"
[[ $(jq -r .park_code "$WORK/b-status.json") == missing_value ]] || fail "B: no park_code"
[[ $(jq -r '.steps[2].state' "$WORK/b-status.json") == compensation_failed ]] ||
  fail "B: the car's return is not compensation_failed"
jq -r .reason "$WORK/b-status.json" | grep -qF \
  'compensation of step rent_car cannot run: missing_value: compensation of rent_car: steps[2].compensate.args.rental_id: "${steps.rent_car.result.rental_id}" has no value' ||
  fail "B: reason: $(jq -r .reason "$WORK/b-status.json")"
before=$(journal_size "$DB" "$SAGA")
for i in 1 2 3; do
  run "b-recover-$i" 0 --db "$DB" recover
  expect_in "$WORK/b-recover-$i.out" "0 saga(s) resumed (0 of them parked"
done
[[ $(journal_size "$DB" "$SAGA") -eq $before ]] || fail "B: recover drove the parked saga again"
expect_effects "$DB" hotels cancel 0
expect_effects "$DB" flights cancel 0
# The person returned the car by hand.
run b-undone 3 --db "$DB" resolve "$SAGA" rent_car --decision undone --as ops --note "returned at the desk"
[[ $("$TB" --db "$DB" status "$SAGA" --json | jq -r .state) == compensated ]] || fail "B: not compensated"
expect_effects "$DB" flights reserve 1
expect_effects "$DB" flights cancel 1
expect_effects "$DB" hotels book 1
expect_effects "$DB" hotels cancel 1
expect_effects "$DB" cars rent 1
expect_effects "$DB" cars return 0
expect_effects "$DB" payments charge 0
echo "B: parked with the missing path, settled by a person, rolled back"
echo "wedge_cli_test: ok"
