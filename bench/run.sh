#!/usr/bin/env bash
# `make bench`: starts a throwaway PostgreSQL 15 (scripts/pg-test-server.sh)
# in bench/out/pg, runs idem-bench against it and the embedded store, and
# stops the server on exit. The driver runs every measurement 3 times
# (BENCH_REPS) and prints the medians; the table also lands in
# bench/out/results.txt and the figures in bench/out/results.json.
#
#   bench/run.sh [BUILD_DIR]          BUILD_DIR defaults to build
#   BENCH_QUICK=1 bench/run.sh        short runs, to check that it works
#   BENCH_ONLY=sqlite|pg              one store only
#   BENCH_GROWN=N                     finished sagas in the grown journal (1,000,000)
#   BENCH_PG_URL=postgresql://...     use that server instead of a throwaway one
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build}
[[ "$build" = /* ]] || build="$root/$build"
bin="$build/bench/idem-bench"
out="$root/bench/out"
[[ -x "$bin" ]] || { echo "bench/run.sh: $bin is missing (make build)" >&2; exit 1; }
mkdir -p "$out"

args=(--out-dir "$out" --reps "${BENCH_REPS:-3}")
[[ "${BENCH_QUICK:-0}" != 0 ]] && args+=(--quick)
[[ -n "${BENCH_ONLY:-}" ]] && args+=(--only "$BENCH_ONLY")
[[ -n "${BENCH_GROWN:-}" ]] && args+=(--grown "$BENCH_GROWN")

pg_dir="$out/pg"
cleanup() { bash "$root/scripts/pg-test-server.sh" stop "$pg_dir" >/dev/null 2>&1 || true; }
if [[ "${BENCH_ONLY:-}" != sqlite ]]; then
  if [[ -n "${BENCH_PG_URL:-}" ]]; then
    args+=(--pg-url "$BENCH_PG_URL")
  else
    # As root the server runs as `postgres`, which must be able to reach
    # bench/out (every directory above it searchable by others).
    trap cleanup EXIT INT TERM
    bash "$root/scripts/pg-test-server.sh" start "$pg_dir" >&2
    args+=(--pg-url "$(cat "$pg_dir/url")")
  fi
fi

echo "bench: $bin ${args[*]}" >&2
"$bin" "${args[@]}"
