#!/usr/bin/env bash
# `make bench-peers` (docs/bench.md, "The peer engines"): idem beside DBOS
# Transact and Restate on the same three-step no-op saga and the same closed
# loop at C=1/16/64, in interleaved rounds (idem-sqlite, idem-pg, dbos,
# restate, then the server path: idem-serve, restate-http), repeated
# BENCH_REPS times (3; 1 with BENCH_QUICK=1). Each round runs with only its
# own servers up: a throwaway PostgreSQL (scripts/pg-test-server.sh) for
# idem-pg and dbos, a restate-server for restate, `idem serve` and a loopback
# no-op HTTP tool for idem-serve; everything a round started is stopped when
# it ends, and the trap stops whatever is left on exit.
#
#   bench/peers/run.sh [BUILD_DIR]     BUILD_DIR defaults to build
#   BENCH_QUICK=1                      one round, short windows (about a minute)
#   BENCH_REPS=N                       rounds (default 3)
#   BENCH_PEERS_CONC=1,16,64           the concurrencies
#   BENCH_PEERS_ONLY=idem-serve,...    only these systems' rounds (a quick
#                                      check of one path; every system by default)
#
# The peers come from bench/peers/node_modules, installed by `npm ci` in
# scripts/install-deps.sh (pinned in package-lock.json); nothing is
# downloaded here. Rows land in bench/out/peers/rounds.jsonl, the table in
# bench/out/peers/results.txt.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-build}
[[ "$build" = /* ]] || build="$root/$build"
peers="$root/bench/peers"
bench="$build/bench/idem-bench"
idem="$build/idem"
out="$root/bench/out/peers"
restate_bin="$peers/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server"

die() { echo "bench-peers: $*" >&2; exit 1; }
[[ -x "$bench" && -x "$idem" ]] || die "$bench or $idem is missing (make build)"
[[ -d "$peers/node_modules/@dbos-inc/dbos-sdk" && -x "$restate_bin" ]] ||
  die "the peers are not installed in $peers/node_modules (make deps: npm ci there)"
command -v node >/dev/null || die "node is missing (make deps)"

quick=${BENCH_QUICK:-0}
if [[ "$quick" != 0 ]]; then
  reps=${BENCH_REPS:-1} warm=0.3 dur=1.0
else
  reps=${BENCH_REPS:-3} warm=0.7 dur=2.0
fi
conc=${BENCH_PEERS_CONC:-1,16,64}
loop=(--conc "$conc" --warm "$warm" --dur "$dur")

rm -rf "$out"
mkdir -p "$out"
rows="$out/rounds.jsonl"
: >"$rows"

# Everything started here, by pid; stopped by pid (never by name).
started=()
pg_dir=""
stop_pid() {
  local pid=$1
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}
stop_pg() {
  [[ -n "$pg_dir" ]] && bash "$root/scripts/pg-test-server.sh" stop "$pg_dir" >/dev/null 2>&1 || true
  pg_dir=""
}
cleanup() {
  local pid
  for pid in "${started[@]}"; do stop_pid "$pid"; done
  started=()
  stop_pg
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}
wait_http() {  # URL [tries]
  for _ in $(seq 1 "${2:-200}"); do
    curl -sf -o /dev/null "$1" && return 0
    sleep 0.1
  done
  die "$1 did not answer"
}
start_bg() {  # LOG CMD... : starts CMD in the background, its pid in $last_pid
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  last_pid=$!
  started+=("$last_pid")
}
stop_started() {
  local pid
  for pid in "${started[@]}"; do stop_pid "$pid"; done
  started=()
}

start_pg() {
  pg_dir="$out/pg"
  rm -rf "$pg_dir"
  bash "$root/scripts/pg-test-server.sh" start "$pg_dir" >&2
  pg_url=$(cat "$pg_dir/url")
}

start_restate() {  # NAME: a fresh restate-server with its defaults, loopback ports
  local dir="$out/restate-$1"
  rm -rf "$dir"
  mkdir -p "$dir"
  local node_port ingress_port admin_port
  node_port=$(free_port) ingress_port=$(free_port) admin_port=$(free_port)
  start_bg "$dir/server.log" env RESTATE_BASE_DIR="$dir" \
    RESTATE_BIND_ADDRESS="127.0.0.1:$node_port" \
    RESTATE_ADVERTISED_ADDRESS="http://127.0.0.1:$node_port/" \
    RESTATE_INGRESS__BIND_ADDRESS="127.0.0.1:$ingress_port" \
    RESTATE_ADMIN__BIND_ADDRESS="127.0.0.1:$admin_port" \
    RESTATE_DISABLE_TELEMETRY=true RESTATE_LOG_FILTER=warn \
    "$restate_bin" --no-logo --listen-mode tcp
  restate_ingress="http://127.0.0.1:$ingress_port"
  restate_admin="http://127.0.0.1:$admin_port"
  wait_http "$restate_admin/health" 600
  wait_http "$restate_ingress/restate/health" 600
}

start_tool() {  # a loopback no-op HTTP tool; its URL in $tool_url
  local port
  port=$(free_port)
  start_bg "$out/tool.log" node "$peers/noop_tool.mjs" "$port"
  tool_url="http://127.0.0.1:$port"
  wait_http "$tool_url/" 100
}

# `idem serve` on SQLite with the no-op tools; URL in $serve_url. --workers 64:
# as many sagas driven at once as the loop's largest C, as Restate runs every
# invocation at once (the default of 4 caps idem-serve at ~250 sagas/s here).
# --http-threads 160: every request of the loop's largest C waits for its
# outcome (at most half the handler threads wait; with the default 8, 60 of
# 64 requests were answered 202 at once and asked again).
start_serve() {
  local dir="$out/serve"
  rm -rf "$dir"
  mkdir -p "$dir"
  local token port
  token=$(openssl rand -hex 32)
  printf '[{"name": "bench", "token_sha256": "%s", "roles": ["agent"]}]\n' \
    "$(printf %s "$token" | sha256sum | cut -d' ' -f1)" >"$dir/auth.json"
  chmod 600 "$dir/auth.json"
  node -e '
    const [dir, url] = process.argv.slice(1);
    const tool = (n) => ({name: "noop." + n, effect: "write", description: "a loopback no-op",
      base_url: url, commit: {method: "POST", path: "/" + n}, honours_keys: true,
      timeout_ms: 5000, connect_timeout_ms: 500});
    const step = (id, n) => ({id, tool: "noop." + n, args: {n: "${input.n}"}, compensate: null,
      reason: "a no-op has nothing to undo"});
    const fs = require("fs");
    fs.writeFileSync(dir + "/tools.json", JSON.stringify({tools: ["a", "b", "c"].map(tool)}));
    fs.writeFileSync(dir + "/spec.json", JSON.stringify({name: "bench3",
      steps: [step("s1", "a"), step("s2", "b"), step("s3", "c")]}));' "$dir" "$tool_url"
  port=$(free_port)
  start_bg "$dir/serve.log" "$idem" --store "$dir/journal.db" serve --listen "127.0.0.1:$port" \
    --auth "$dir/auth.json" --tools "$dir/tools.json" --no-ui --max-connections-per-client 256 \
    --workers 64 --http-threads 160
  serve_url="http://127.0.0.1:$port"
  serve_token=$token
  serve_spec="$dir/spec.json"
  wait_http "$serve_url/healthz" 300
}

only=${BENCH_PEERS_ONLY:-}
wanted() { [[ -z "$only" || ",$only," == *",$1,"* ]]; }

round() {  # NAME CMD...: one system's round, its JSON lines appended
  local name=$1
  shift
  echo "bench-peers: round $rep/$reps: $name" >&2
  "$@" | grep '^{' | tee -a "$rows" >&2
}

echo "bench-peers: $(uptime)" >&2
t0=$(date +%s)
for rep in $(seq 1 "$reps"); do
  if wanted idem-sqlite; then
    round idem-sqlite "$bench" --peer-round sqlite --out-dir "$out/idem" "${loop[@]}"
  fi

  if wanted idem-pg || wanted dbos; then
    start_pg
    if wanted idem-pg; then
      round idem-pg "$bench" --peer-round pg --pg-url "$pg_url" --out-dir "$out/idem" "${loop[@]}"
    fi
    if wanted dbos; then
      dbos_url=$(printf %s "$pg_url" | sed -E 's#/[^/?]+(\?|$)#/dbos_bench\1#')
      (cd "$peers" && round dbos node dbos_bench.mjs --url "$dbos_url" "${loop[@]}")
    fi
    stop_pg
  fi

  if wanted restate; then
    start_restate "lib-$rep"
    (cd "$peers" && round restate node restate_bench.mjs --ingress "$restate_ingress" \
      --admin "$restate_admin" --port "$(free_port)" "${loop[@]}")
    stop_started
  fi

  # The server path: submit-and-wait over loopback HTTP, loopback HTTP tools.
  if wanted idem-serve; then
    start_tool
    start_serve
    (cd "$peers" && round idem-serve node idem_serve_bench.mjs --url "$serve_url" \
      --token "$serve_token" --spec "$serve_spec" "${loop[@]}")
    stop_started
  fi

  if wanted restate-http; then
    start_tool
    start_restate "http-$rep"
    (cd "$peers" && round restate-http node restate_bench.mjs --system restate-http \
      --ingress "$restate_ingress" --admin "$restate_admin" --port "$(free_port)" \
      --tool "$tool_url/a" "${loop[@]}")
    stop_started
  fi
done
echo "bench-peers: $(( $(date +%s) - t0 )) s; $(uptime)" >&2
node "$peers/summarize.mjs" "$rows" | tee "$out/results.txt"
