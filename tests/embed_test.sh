#!/usr/bin/env bash
# Embedding idem through find_package (ctest `embed_find_package`):
#   tests/embed_test.sh BUILD_DIR SOURCE_DIR
# installs the build into a temporary prefix, builds examples/embed against
# it as a separate project, starts the service on a loopback port, posts one
# booking twice under one Idempotency-Key (the same saga both times, created
# once), reads the saga back and its metrics, and stops the service.
set -euo pipefail

build_dir=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/idem_embed.XXXXXX")
pid=""
cleanup() {
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "embed_test: $*" >&2
  [[ -f "$work/service.err" ]] && sed 's/^/  service: /' "$work/service.err" >&2
  exit 1
}

echo "== install $build_dir into $work/prefix"
cmake --install "$build_dir" --prefix "$work/prefix" >"$work/install.log" ||
  { cat "$work/install.log" >&2; fail "cmake --install failed"; }
[[ -f "$work/prefix/lib/cmake/idem/idemConfig.cmake" ]] || fail "no idemConfig.cmake installed"
[[ -f "$work/prefix/include/saga/engine.h" ]] || fail "no saga/engine.h installed"

echo "== only the public API is installed, and it stands alone"
# Internal headers of the drivers, the machines and the stores stay in the
# source tree.
for internal in saga/run.h saga/drive.h saga/machines.h saga/msm_config.h saga/states.h \
  compensation/undo.h preview_commit/two_phase.h storage/validate.h server/context.h; do
  [[ ! -e "$work/prefix/include/$internal" ]] || fail "internal header $internal is installed"
done
# Each installed header compiles on its own against the prefix: the set is
# closed (nothing it includes is missing) and each is self-contained.
while IFS= read -r -d '' header; do
  rel=${header#"$work/prefix/include/"}
  echo "#include \"$rel\"" | g++ -std=c++17 -fsyntax-only -x c++ -I "$work/prefix/include" - \
    2>"$work/header.log" || { cat "$work/header.log" >&2; fail "installed $rel does not compile alone"; }
done < <(find "$work/prefix/include" -name '*.h' -print0)

echo "== configure and build examples/embed against the prefix"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$source_dir/examples/embed" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; fail "configuring examples/embed failed"; }
cmake --build "$work/build" -j2 >"$work/build.log" 2>&1 ||
  { tail -50 "$work/build.log" >&2; fail "building examples/embed failed"; }

echo "== start booking-service"
"$work/build/booking-service" --listen 127.0.0.1:0 --journal "$work/bookings.db" \
  >"$work/service.out" 2>"$work/service.err" &
pid=$!
port=""
for _ in $(seq 100); do
  port=$(sed -n 's|^listening on http://127.0.0.1:\([0-9]*\)$|\1|p' "$work/service.out")
  [[ -n "$port" ]] && break
  kill -0 "$pid" 2>/dev/null || fail "the service exited early"
  sleep 0.1
done
[[ -n "$port" ]] || fail "the service did not start"
url="http://127.0.0.1:$port"

book() {
  curl -sS --max-time 30 -o "$work/$1.json" -w '%{http_code}' -X POST "$url/book" \
    -H "Idempotency-Key: $2" -H 'Content-Type: application/json' -d "$3"
}
field() {
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d[sys.argv[2]])' "$1" "$2"
}

echo "== POST /book twice with one key"
body='{"guest": "Ana", "nights": 2, "amount_cents": 24000}'
code1=$(book first booking-1 "$body")
code2=$(book second booking-1 "$body")
[[ "$code1" == 201 ]] || fail "first POST /book: HTTP $code1: $(cat "$work/first.json")"
[[ "$code2" == 200 ]] || fail "second POST /book: HTTP $code2: $(cat "$work/second.json")"
saga1=$(field "$work/first.json" saga_id)
saga2=$(field "$work/second.json" saga_id)
[[ -n "$saga1" && "$saga1" == "$saga2" ]] || fail "two sagas for one key: $saga1, $saga2"
[[ $(field "$work/first.json" state) == succeeded ]] || fail "saga not succeeded: $(cat "$work/first.json")"
[[ $(field "$work/second.json" created) == False ]] || fail "the second POST created a saga"
echo "   saga $saga1 (both times)"

echo "== the same key with another body is refused; a declined card rolls back"
code3=$(book third booking-1 '{"guest": "Bob", "nights": 1, "amount_cents": 100}')
[[ "$code3" == 422 ]] || fail "reused key: HTTP $code3: $(cat "$work/third.json")"
code4=$(book fourth booking-2 '{"guest": "Ana", "nights": 9, "amount_cents": 900000}')
[[ "$code4" == 201 ]] || fail "declined booking: HTTP $code4: $(cat "$work/fourth.json")"
[[ $(field "$work/fourth.json" state) == compensated ]] ||
  fail "declined card not rolled back: $(cat "$work/fourth.json")"

echo "== GET /sagas/$saga1"
code5=$(curl -sS --max-time 10 -o "$work/saga.json" -w '%{http_code}' "$url/sagas/$saga1")
[[ "$code5" == 200 ]] || fail "GET /sagas: HTTP $code5"
[[ $(field "$work/saga.json" state) == succeeded ]] || fail "GET /sagas: $(cat "$work/saga.json")"

echo "== GET /metrics: the engine's counters and the journal's gauges"
code6=$(curl -sS --max-time 10 -o "$work/metrics.txt" -w '%{http_code}' "$url/metrics")
[[ "$code6" == 200 ]] || fail "GET /metrics: HTTP $code6"
metric() { grep -F "$1 " "$work/metrics.txt" | sed 's/.* //'; }
[[ $(metric 'idem_duplicates_absorbed_total{how="existing_intent"}') == 1 ]] ||
  fail "the repeated POST is not one duplicate absorbed: $(cat "$work/metrics.txt")"
[[ $(metric 'idem_sagas{state="succeeded"}') == 1 ]] || fail "gauge: $(cat "$work/metrics.txt")"
[[ $(metric 'idem_sagas{state="compensated"}') == 1 ]] || fail "gauge: $(cat "$work/metrics.txt")"
[[ $(metric 'idem_sagas_finished_total{outcome="compensated"}') == 1 ]] ||
  fail "counter: $(cat "$work/metrics.txt")"

echo "== stop"
kill -TERM "$pid"
wait "$pid" || fail "the service exited with $?"
pid=""
echo "embed_test: ok"
