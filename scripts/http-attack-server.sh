#!/usr/bin/env bash
# The attacks of issue 12 at full size against a real `idem serve` (with its
# default limits, an auth file and an empty journal): tests/http_attack.cc
# with --port, reading the server process's RSS. About a minute.
# Usage: scripts/http-attack-server.sh [BUILD_DIR] [http_attack flags]
set -euo pipefail
BUILD=${1:-build}
shift || true
ROOT=$(cd "$(dirname "$0")/.." && pwd)
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-http-attack.XXXXXX")
PID=""
cleanup() {
  if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
HASH=$(printf '%s' attack-token | sha256sum | cut -d' ' -f1)
printf '[{"name": "agent-1", "token_sha256": "%s", "roles": ["agent"]}]\n' "$HASH" >"$WORK/auth.json"
chmod 600 "$WORK/auth.json"
"$BUILD/idem" serve --db "$WORK/journal.db" --auth "$WORK/auth.json" \
  --listen "127.0.0.1:$PORT" --log-level warn >"$WORK/serve.log" 2>&1 &
PID=$!
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
echo "idem serve (pid $PID) on 127.0.0.1:$PORT, default limits"
"$BUILD/tests/http_attack" --port "$PORT" --pid "$PID" "$@"
