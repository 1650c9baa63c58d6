#!/usr/bin/env bash
# Multi-worker end-to-end tests on a real PostgreSQL journal
# (RELIABILITY.md section 2, rows 7, 27 and 36).
#
#   multi_worker_test.sh CASE TRAVEL_BOOKING TRAVEL_LEDGER PGDIR
#
# CASE is one of
#   kill     1,000 three-step sagas, 3 workers; one worker is SIGKILLed once
#            about a third of the sagas are done; the other two finish them.
#   stop     row 7: a worker is SIGSTOPped in the middle of a step (a call of
#            the return flight is in flight; MW_STOP_STEP picks another step);
#            a second worker takes the sagas over once the leases expire,
#            resends the in-flight call under the same key and finishes them;
#            then the first is SIGCONTed: its late call is deduplicated by the
#            provider and it must not write anything (fenced on the lease
#            epoch). (With a provider that does not deduplicate keys, the
#            engine parks such a step instead: tests/engine_test.cc,
#            TakenOverStepOfAToolWithoutKeysIsParkedNotResent.)
#   restart  row 27: 300 sagas, 2 workers; PostgreSQL is restarted with
#            `pg_ctl restart -m immediate` once about a third are done; the
#            workers reconnect and finish. The recovery time is printed.
# TRAVEL_BOOKING and TRAVEL_LEDGER are the example's binaries; PGDIR is the
# directory of the shared test server (scripts/pg-test-server.sh start PGDIR;
# the URL is in PGDIR/url).
#
# Every case creates a database of its own on the server, a work directory
# (mktemp -d) with its own keys file and provider ledger, and removes both on
# exit; every process it started is killed on exit, also on failure.
# What is checked, in every case, at the end:
#   - every saga submitted is there, and every one is `succeeded` (counts by
#     state are printed; any other state fails);
#   - `travel-ledger --check` passes: no effect applied twice;
#   - the ledger holds exactly one action effect per step of every saga (its
#     idempotency key is the step's key) and nothing else; the journal's
#     effects table agrees;
#   - workers stopped with SIGTERM exit 0.
# A line `SUMMARY ...` gives the figures.
#
# Environment: MW_SAGAS overrides the number of sagas of `kill` (1000) and
# `restart` (300), at most 1000 (`list` answers 1000 sagas at most);
# MW_KEEP=1 keeps the work directory (and the database).
set -euo pipefail

usage() {
  echo "usage: $0 kill|stop|restart TRAVEL_BOOKING TRAVEL_LEDGER PGDIR" >&2
  exit 2
}
[[ $# -eq 4 ]] || usage
CASE=$1
TB=$2
TL=$3
PGDIR=$4
case "$CASE" in kill | stop | restart) ;; *) usage ;; esac

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SPEC=$HERE/specs/three_steps.json
PG_SERVER=$HERE/../scripts/pg-test-server.sh

T_START=$(date +%s%N)
log() { printf '[%7.2fs %s] %s\n' "$(elapsed_s "$T_START")" "$(date -u +%H:%M:%S.%3N)" "$*"; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
elapsed_s() { awk -v a="$1" -v b="$(date +%s%N)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }'; }

for tool in jq awk; do
  command -v "$tool" >/dev/null || {
    echo "multi_worker_test: $tool is required" >&2
    exit 1
  }
done
PSQL=$(command -v psql || true)
if [[ -z "$PSQL" ]]; then
  PSQL=$(ls -d /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -n 1 || true)
fi
[[ -n "$PSQL" && -x "$PSQL" ]] || {
  echo "multi_worker_test: psql not found" >&2
  exit 1
}
[[ -x "$TB" && -x "$TL" ]] || {
  echo "multi_worker_test: $TB or $TL is not an executable" >&2
  exit 1
}
[[ -f "$PGDIR/url" ]] || {
  echo "multi_worker_test: no server URL in $PGDIR/url (is the pg_server_start fixture up?)" >&2
  exit 1
}
BASE_URL=$(cat "$PGDIR/url")

# ---- per-case resources, and their cleanup ----------------------------------------

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-mw-$CASE.XXXXXX")
DB="mw_${CASE}_$$_${RANDOM}"
URL="${BASE_URL%/*}/$DB"
KEYS=$WORK/keys.json
LEDGER=$WORK/ledger.sqlite
PIDS=()    # every worker started
FAILED=0

psql_base() { "$PSQL" "$BASE_URL" -XAtq -v ON_ERROR_STOP=1 "$@"; }
# q SQL: one query on this case's database, unaligned output.
q() { "$PSQL" "$URL" -XAtq -v ON_ERROR_STOP=1 -c "$1"; }

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local pid
  for pid in "${PIDS[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -CONT "$pid" 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [[ $rc -ne 0 || $FAILED -ne 0 ]]; then
    local f
    for f in "$WORK"/w*.log; do
      [[ -f "$f" ]] || continue
      echo "---- last lines of $(basename "$f")" >&2
      tail -n 15 "$f" >&2
    done
  fi
  if [[ "${MW_KEEP:-0}" == 1 ]]; then
    echo "kept: work dir $WORK, database $URL" >&2
  else
    psql_base -c "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  FAILED=1
  echo "FAIL ($CASE): $*" >&2
  exit 1
}

psql_base -c "CREATE DATABASE \"$DB\"" >/dev/null
log "case $CASE: database $DB, work dir $WORK"

# tb ARGS...: the travel-booking CLI on this case's journal, keys and ledger.
tb() { "$TB" --store "$URL" --keys "$KEYS" --ledger "$LEDGER" "$@"; }

# submit_sagas N: records N sagas (intent keys mw-1..mw-N), 4 submitters at once.
submit_sagas() {
  local n=$1 t0
  [[ $n -ge 1 && $n -le 1000 ]] || fail "the number of sagas must be 1..1000, got $n"
  t0=$(date +%s%N)
  export TB URL KEYS LEDGER SPEC
  # shellcheck disable=SC2016
  seq 1 "$n" | xargs -P 4 -I{} bash -c '
    "$TB" --store "$URL" --keys "$KEYS" --ledger "$LEDGER" submit "$SPEC" \
      --intent-key "mw-$1" --input "{\"traveller\": \"T$1\", \"from\": \"LIS\", \"to\": \"NRT\",
        \"city\": \"Tokyo\", \"date\": \"2026-12-01\", \"return_date\": \"2026-12-08\",
        \"amount_cents\": $((10000 + $1)), \"currency\": \"EUR\"}"' _ {} \
    >"$WORK/submit.log" 2>"$WORK/submit.err" || {
    tail -n 20 "$WORK/submit.err" >&2
    fail "submitting $n sagas failed"
  }
  local created
  created=$(grep -c ' new$' "$WORK/submit.log" || true)
  [[ "$created" -eq "$n" ]] || fail "submitted $n sagas, $created were new"
  log "submitted $n sagas in $(elapsed_s "$t0") s (4 at once)"
}

# start_worker NAME LATENCY_MS WORKER_ARGS...: starts a worker in the
# background, its output in $WORK/NAME.log; sets WPID.
start_worker() {
  local name=$1 latency=$2
  shift 2
  # A simple command, not the tb function: `$!` must be the worker itself (a
  # function would run in a subshell, and signals would hit that subshell).
  "$TB" --store "$URL" --keys "$KEYS" --ledger "$LEDGER" --latency-ms "$latency" \
    worker --owner "$name" "$@" >"$WORK/$name.log" 2>&1 &
  WPID=$!
  PIDS+=("$WPID")
  local i
  for ((i = 0; i < 50; i++)); do
    [[ "$(readlink "/proc/$WPID/exe" 2>/dev/null)" == "$(readlink -f "$TB")" ]] && break
    sleep 0.01
  done
  [[ "$(readlink "/proc/$WPID/exe" 2>/dev/null)" == "$(readlink -f "$TB")" ]] ||
    fail "pid $WPID is not the worker (exe $(readlink "/proc/$WPID/exe" 2>/dev/null))"
  log "started worker $name (pid $WPID): $*"
}

# proc_state PID: the kernel's state letter (R, S, T, Z, ...), empty if gone.
proc_state() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  echo "${stat%% *}"
}

# stop_worker PID NAME: SIGTERM, then waits up to 30 s for the exit; fails
# unless the worker exits 0.
stop_worker() {
  local pid=$1 name=$2 i st rc=0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 300; i++)); do
    st=$(proc_state "$pid")
    [[ -z "$st" || "$st" == Z ]] && break
    sleep 0.1
  done
  st=$(proc_state "$pid")
  if [[ -n "$st" && "$st" != Z ]]; then
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    fail "worker $name did not exit within 30 s of SIGTERM"
  fi
  wait "$pid" || rc=$?
  [[ $rc -eq 0 ]] || fail "worker $name exited $rc after SIGTERM (expected 0): $(tail -n 3 "$WORK/$name.log")"
  log "worker $name exited 0 after SIGTERM"
}

# ledger_writable: true unless a process holds the ledger's write lock (no
# SQLite shell: assumed free).
ledger_writable() {
  if command -v sqlite3 >/dev/null; then
    sqlite3 "$LEDGER" ".timeout 0" "BEGIN IMMEDIATE;" "ROLLBACK;" >/dev/null 2>&1
  elif command -v python3 >/dev/null; then
    python3 - "$LEDGER" <<'PY' >/dev/null 2>&1
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
c.execute("BEGIN IMMEDIATE")
c.execute("ROLLBACK")
PY
  else
    return 0
  fi
}

# state_counts: {"succeeded": N, ...} from `list --json`; "" if the CLI failed.
state_counts() {
  tb list --json 2>>"$WORK/list.err" | jq -c 'group_by(.state) | map({(.[0].state): length}) | add // {}' \
    2>/dev/null || true
}

# finished_count COUNTS: sagas in a state no worker drives any more.
finished_count() {
  jq -r '[to_entries[] | select(.key | IN("pending","running","compensating") | not) | .value]
         | add // 0' <<<"$1"
}

# wait_finished TARGET DEADLINE_S: polls until TARGET sagas are finished, or
# the deadline; sets COUNTS and DONE. Store errors while polling (e.g. during a
# server restart) are skipped.
wait_finished() {
  local target=$1 deadline=$(($(date +%s) + $2)) c last_print=0 note=""
  DONE=0
  COUNTS='{}'
  while :; do
    c=$(state_counts)
    if [[ -n "$c" ]]; then
      COUNTS=$c
      DONE=$(finished_count "$c")
      note=""
    else
      note=" (as of the last good poll: \`list --json\` fails now)"
    fi
    [[ $DONE -ge $target ]] && return 0
    if [[ $(date +%s) -ge $deadline ]]; then
      COUNTS="$COUNTS$note"
      return 1
    fi
    if [[ $(($(date +%s) - last_print)) -ge 5 ]]; then
      log "progress: $COUNTS$note"
      last_print=$(date +%s)
    fi
    sleep 0.1
  done
}

# check_outcome N: the final checks (see the header); sets DUPLICATES, LOSSES
# and EFFECTS for the summary.
check_outcome() {
  local n=$1 counts total succeeded
  counts=$(state_counts)
  [[ -n "$counts" ]] || fail "list --json failed"
  total=$(jq '[.[]] | add // 0' <<<"$counts")
  succeeded=$(jq '.succeeded // 0' <<<"$counts")
  log "sagas by state: $counts"
  local in_db
  in_db=$(q "SELECT count(*) FROM sagas")
  [[ "$in_db" -eq "$n" ]] || fail "the journal holds $in_db sagas, $n were submitted"
  [[ "$total" -eq "$n" ]] || fail "list shows $total sagas, $n were submitted"

  # The ledger: duplicates and one effect per step.
  local tl_rc=0
  "$TL" "$LEDGER" --check >"$WORK/ledger-check.log" 2>&1 || tl_rc=$?
  "$TL" "$LEDGER" --json >"$WORK/ledger.json" 2>/dev/null || fail "travel-ledger --json failed"
  DUPLICATES=$(jq '[.duplicates[] | .count - 1] | add // 0' "$WORK/ledger.json")
  EFFECTS=$(jq '.effects | length' "$WORK/ledger.json")
  local actions others
  actions=$(jq '[.effects[] | select(.operation | IN("reserve","book","charge"))] | length' \
    "$WORK/ledger.json")
  others=$((EFFECTS - actions))
  jq -r '.effects[] | select(.operation | IN("reserve","book","charge")) | .idempotency_key' \
    "$WORK/ledger.json" | sort -u >"$WORK/ledger-keys"
  q "SELECT step_key FROM steps" | sort -u >"$WORK/step-keys"
  local steps missing extra
  steps=$(wc -l <"$WORK/step-keys")
  missing=$(comm -23 "$WORK/step-keys" "$WORK/ledger-keys" | wc -l)
  extra=$(comm -13 "$WORK/step-keys" "$WORK/ledger-keys" | wc -l)
  LOSSES=$((n - succeeded + missing))
  local journal_effects
  journal_effects=$(q "SELECT count(*) FROM effects WHERE kind = 'action'")
  log "ledger: $EFFECTS effects ($actions actions, $others other), duplicates $DUPLICATES," \
    "steps $steps, steps without an effect $missing, effects of no step $extra;" \
    "journal effects (action) $journal_effects"

  [[ $tl_rc -eq 0 ]] || {
    grep -v '^  ' "$WORK/ledger-check.log" | tail -n 20 >&2
    fail "travel-ledger --check exited $tl_rc: an effect was applied more than once"
  }
  [[ "$succeeded" -eq "$n" ]] || fail "$succeeded of $n sagas succeeded: $counts"
  [[ "$steps" -eq $((3 * n)) ]] || fail "the journal has $steps steps, expected $((3 * n))"
  [[ $missing -eq 0 && $extra -eq 0 ]] ||
    fail "$missing steps have no ledger effect, $extra ledger effects belong to no step"
  [[ "$actions" -eq $((3 * n)) && $others -eq 0 ]] ||
    fail "the ledger has $actions action effects and $others others, expected $((3 * n)) and 0"
  if [[ "$journal_effects" -ne $((3 * n)) ]]; then
    # Which steps have no effect row, and what their sagas' journals say.
    local bare="FROM steps s LEFT JOIN effects e ON e.saga_id = s.saga_id
       AND e.step_id = s.step_id AND e.kind = 'action' WHERE e.saga_id IS NULL"
    q "SELECT s.saga_id, s.step_id, s.state, s.attempt, s.updated_ms $bare" >&2 || true
    q "SELECT j.saga_id, j.seq, j.step_id, j.event, j.data, j.at_ms FROM journal j
       WHERE j.saga_id IN (SELECT s.saga_id $bare) ORDER BY j.seq" >&2 || true
    local sg
    for sg in $(q "SELECT DISTINCT s.saga_id $bare" || true); do
      grep -h "$sg" "$WORK"/w*.log >&2 || true
    done
    fail "the journal records $journal_effects action effects, expected $((3 * n))"
  fi
}

# ---- the cases ---------------------------------------------------------------------

case_kill() {
  local n=${MW_SAGAS:-1000}
  submit_sagas "$n"
  local t0 w
  t0=$(date +%s%N)
  local -a pids=()
  for w in w1 w2 w3; do
    start_worker "$w" 2 --concurrency 8 --lease-ms 2000
    pids+=("$WPID")
  done
  wait_finished $((n / 3)) 180 || fail "only $DONE of $n sagas finished in 3 minutes: $COUNTS"
  kill -KILL "${pids[0]}"
  wait "${pids[0]}" 2>/dev/null || true
  local killed_at_ms at_s held
  killed_at_ms=$(now_ms)
  at_s=$(elapsed_s "$t0")
  # Informative only (the lease columns are the store's business).
  held=$(q "SELECT count(*) FROM sagas WHERE lease_owner = 'w1'
            AND state IN ('pending', 'running', 'compensating')" 2>/dev/null || echo "?")
  log "SIGKILLed worker w1 at ${at_s} s, with $DONE of $n sagas finished" \
    "(w1 had driven $(grep -c ' drove ' "$WORK/w1.log" || true) and held $held leases)"
  wait_finished "$n" 180 || fail "only $DONE of $n sagas finished within 3 minutes: $COUNTS"
  local run_s
  run_s=$(elapsed_s "$t0")
  log "all $n sagas finished ${run_s} s after the workers started ($(awk -v n="$n" -v s="$run_s" \
    'BEGIN { printf "%.0f", n / s }') sagas/s)"
  # The sagas w1 held when it died: taken over after their leases expired.
  local left
  left=$(cat "$WORK"/w2.log "$WORK"/w3.log | grep -c ' left ' || true)
  log "w2 drove $(grep -c ' drove ' "$WORK/w2.log" || true), w3 drove" \
    "$(grep -c ' drove ' "$WORK/w3.log" || true); sagas left by w2/w3: $left"
  local last_ms
  last_ms=$(q "SELECT max(updated_ms) FROM sagas")
  log "the last saga finished $((last_ms - killed_at_ms)) ms after the SIGKILL"
  local reclaimed
  reclaimed=$(q "SELECT count(*) FROM sagas WHERE lease_epoch > 1" 2>/dev/null || echo "?")
  log "sagas claimed more than once (lease epoch > 1): $reclaimed"
  stop_worker "${pids[1]}" w2
  stop_worker "${pids[2]}" w3
  check_outcome "$n"
  echo "SUMMARY case=kill sagas=$n succeeded=$n workers=3 workers_killed=1 duplicates=$DUPLICATES" \
    "losses=$LOSSES effects=$EFFECTS run_s=$run_s total_s=$(elapsed_s "$T_START")"
}

case_stop() {
  local n=20 lease_ms=1500
  submit_sagas "$n"
  start_worker w1 300 --concurrency "${MW_STOP_CONCURRENCY:-4}" --lease-ms "$lease_ms"
  local p1=$WPID
  # Stop w1 while a call of step MW_STOP_STEP (default reserve_return) is in
  # flight: the step
  # is journaled `submitted` before the call and the provider sleeps 300 ms
  # before it applies anything, so poll faster than that.
  local stop_step=${MW_STOP_STEP:-reserve_return}
  case "$stop_step" in reserve_flight | reserve_return | charge_payment) ;;
    *) fail "MW_STOP_STEP must be reserve_flight, reserve_return or charge_payment" ;;
  esac
  # The pause must fall in the provider's latency only: a worker stopped
  # inside a transaction (its PostgreSQL session, or the ledger's SQLite
  # write lock, which stands in for the provider's own database) would block
  # the other worker for as long as it stays stopped. Such stops are undone
  # (SIGCONT) and tried again.
  local deadline=$(($(date +%s) + 60)) inflight="" tries=0 busy saga key landed
  while :; do
    [[ $(date +%s) -lt $deadline ]] || fail "could not stop w1 in a $stop_step call in 60 s"
    inflight=$(q "SELECT saga_id || ' ' || step_key FROM steps
                  WHERE step_id = '$stop_step' AND state = 'submitted' LIMIT 1") || true
    if [[ -z "$inflight" ]]; then
      sleep 0.02
      continue
    fi
    kill -STOP "$p1"
    tries=$((tries + 1))
    sleep 0.05
    [[ $(proc_state "$p1") == T ]] || fail "w1 is not stopped (state $(proc_state "$p1"))"
    read -r saga key <<<"$inflight"
    busy=$(q "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
              AND pid <> pg_backend_pid() AND state <> 'idle'")
    landed=$("$TL" "$LEDGER" --json | jq --arg k "$key" \
      '[.effects[] | select(.idempotency_key == $k)] | length')
    if [[ "$busy" -eq 0 && "$landed" -eq 0 ]] && ledger_writable; then
      break
    fi
    log "stop $tries: w1 was inside a transaction (PostgreSQL sessions busy: $busy) or the" \
      "ledger, or its call had landed ($landed); continuing it and trying again"
    kill -CONT "$p1"
    sleep 0.$((RANDOM % 5 + 1))
  done
  local stopped_ms
  stopped_ms=$(now_ms)
  local held
  held=$(q "SELECT count(*) FROM sagas WHERE state = 'running'")
  local drove_before
  drove_before=$(grep -c ' drove ' "$WORK/w1.log" || true)
  log "SIGSTOPped w1 (try $tries) with $held sagas running, $drove_before driven; $stop_step" \
    "call in flight: saga $saga key $key (no effect under the key yet; no open transaction)"

  start_worker w2 300 --concurrency 4 --lease-ms "$lease_ms"
  local p2=$WPID
  wait_finished "$n" 90 || fail "w2 finished only $DONE of $n sagas within 90 s: $COUNTS"
  local took
  took=$(elapsed_s "${stopped_ms}000000")
  log "w2 finished all $n sagas ${took} s after w1 was stopped (lease $lease_ms ms);" \
    "w2 drove $(grep -c ' drove ' "$WORK/w2.log" || true)"
  [[ $(proc_state "$p1") == T ]] || fail "w1 is no longer stopped"

  # Everything is done: any journal write from now on can only be w1's.
  local journal_before effects_before steps_before calls_before
  journal_before=$(q "SELECT count(*) || '/' || coalesce(max(seq), 0) FROM journal")
  effects_before=$(q "SELECT count(*) FROM effects")
  steps_before=$(q "SELECT md5(string_agg(saga_id || idx || state || attempt || updated_ms, ','
                                          ORDER BY saga_id, idx)) FROM steps")
  calls_before=$("$TL" "$LEDGER" --json | jq '.calls | length')
  kill -CONT "$p1"
  log "SIGCONTed w1"
  # Its in-flight calls end within the 300 ms latency; its commits and lease
  # renewals must all be refused. Give it several lease periods.
  local i
  for ((i = 0; i < 30; i++)); do
    sleep 0.2
    grep -q ' left ' "$WORK/w1.log" && [[ $i -ge 15 ]] && break
  done
  local journal_after effects_after steps_after calls_after
  journal_after=$(q "SELECT count(*) || '/' || coalesce(max(seq), 0) FROM journal")
  effects_after=$(q "SELECT count(*) FROM effects")
  steps_after=$(q "SELECT md5(string_agg(saga_id || idx || state || attempt || updated_ms, ','
                                         ORDER BY saga_id, idx)) FROM steps")
  calls_after=$("$TL" "$LEDGER" --json | jq '.calls | length')
  local drove_after left_lines
  drove_after=$(grep -c ' drove ' "$WORK/w1.log" || true)
  left_lines=$(grep ' left ' "$WORK/w1.log" || true)
  log "w1 after SIGCONT: $(grep -c ' left ' <<<"$left_lines" || true) sagas left," \
    "$((drove_after - drove_before)) driven; provider calls received meanwhile:" \
    "$((calls_after - calls_before))"
  [[ -n "$left_lines" ]] && sed 's/^/    /' <<<"$left_lines"
  "$TL" "$LEDGER" --json | jq -r --arg k "$key" \
    '.calls[] | select(.idempotency_key == $k) | "    calls under \($k): \(.operation) \(.at) \(.outcome)"'

  [[ "$journal_after" == "$journal_before" ]] ||
    fail "w1 wrote to the journal after the takeover: journal $journal_before -> $journal_after"
  [[ "$effects_after" == "$effects_before" ]] ||
    fail "w1 recorded effects after the takeover: $effects_before -> $effects_after"
  [[ "$steps_after" == "$steps_before" ]] || fail "w1 changed step rows after the takeover"
  [[ $drove_after -eq $drove_before ]] ||
    fail "w1 reports having driven $((drove_after - drove_before)) sagas after the takeover"
  grep -q -E ' left .*(lease lost|[Aa]borted)' <<<"$left_lines" ||
    fail "w1 did not report leaving a saga with \"lease lost\"/aborted after SIGCONT"

  stop_worker "$p2" w2
  stop_worker "$p1" w1
  check_outcome "$n"
  echo "SUMMARY case=stop sagas=$n succeeded=$n workers=2 workers_stopped=1" \
    "fenced_left=$(grep -c ' left ' <<<"$left_lines" || true) late_journal_writes=0" \
    "duplicates=$DUPLICATES losses=$LOSSES effects=$EFFECTS takeover_s=$took" \
    "total_s=$(elapsed_s "$T_START")"
}

case_restart() {
  local n=${MW_SAGAS:-300}
  submit_sagas "$n"
  local t0
  t0=$(date +%s%N)
  # Slower providers than `kill` (20 ms a call, 4 sagas at once per worker),
  # so that sagas are in flight when the server goes down, and the restart
  # lands near the first third.
  start_worker w1 20 --concurrency 4 --lease-ms 2000
  local p1=$WPID
  start_worker w2 20 --concurrency 4 --lease-ms 2000
  local p2=$WPID
  wait_finished $((n / 3)) 120 || fail "only $DONE of $n sagas finished in 2 minutes: $COUNTS"
  local before=$DONE crash_ms up_ms
  crash_ms=$(now_ms)
  log "restarting PostgreSQL (immediate) with $before of $n sagas finished: $COUNTS"
  bash "$PG_SERVER" restart "$PGDIR" || fail "pg-test-server.sh restart failed"
  up_ms=$(now_ms)
  log "PostgreSQL accepts connections again after $((up_ms - crash_ms)) ms"
  wait_finished "$n" 180 || fail "only $DONE of $n sagas finished within 3 minutes: $COUNTS"
  local run_s
  run_s=$(elapsed_s "$t0")
  # Recovery time: from the restart command to the first saga that finished
  # once the server was back (updated_ms is the workers' clock, this
  # machine's). Sagas finishing while pg_ctl was still shutting the server
  # down do not count.
  local first_ms last_ms
  first_ms=$(q "SELECT min(updated_ms) FROM sagas WHERE state = 'succeeded'
                AND updated_ms >= $up_ms")
  last_ms=$(q "SELECT max(updated_ms) FROM sagas")
  [[ -n "$first_ms" ]] || fail "no saga finished after the restart"
  local recovery_ms=$((first_ms - crash_ms))
  log "recovery: the first saga finished $recovery_ms ms after the restart began" \
    "($((first_ms - up_ms)) ms after the server accepted connections again);" \
    "all $n done $((last_ms - crash_ms)) ms after the restart began"
  log "w1 drove $(grep -c ' drove ' "$WORK/w1.log" || true), left $(grep -c ' left ' \
    "$WORK/w1.log" || true); w2 drove $(grep -c ' drove ' "$WORK/w2.log" || true), left" \
    "$(grep -c ' left ' "$WORK/w2.log" || true)"
  grep -h ' left ' "$WORK"/w1.log "$WORK"/w2.log | sed 's/^/    /' | head -n 20
  stop_worker "$p1" w1
  stop_worker "$p2" w2
  check_outcome "$n"
  echo "SUMMARY case=restart sagas=$n succeeded=$n workers=2 pg_restarts=1" \
    "finished_before_restart=$before downtime_ms=$((up_ms - crash_ms))" \
    "recovery_ms=$recovery_ms drained_ms=$((last_ms - crash_ms)) duplicates=$DUPLICATES losses=$LOSSES effects=$EFFECTS" \
    "run_s=$run_s total_s=$(elapsed_s "$T_START")"
}

"case_$CASE"
log "PASS ($CASE)"
