#!/usr/bin/env bash
# The MCP conformance suite (@modelcontextprotocol/conformance, pinned in
# package-lock.json, on the Node 22 of the npm package `node`) against idem
# as an MCP server: over Streamable HTTP (/mcp on `idem serve`) or over stdio
# (`idem mcp`, behind stdio_bridge.mjs, which carries messages unchanged).
# Scenarios that fail on purpose are listed, with why, in
# conformance-baseline.yml (http) and conformance-baseline-stdio.yml; the
# suite fails on any other failure and on a baseline entry that passes.
# Usage: tests/mcp/conformance.sh IDEM SOURCE_DIR http|stdio
set -euo pipefail
IDEM=$1 SRC=$2 MODE=$3
cd "$SRC/tests/mcp"
NODE=node_modules/node/bin/node
SUITE=node_modules/@modelcontextprotocol/conformance/dist/index.js
if [ ! -x "$NODE" ] || [ ! -f "$SUITE" ]; then
  echo "tests/mcp/node_modules is missing: run scripts/install-deps.sh (npm ci)" >&2
  exit 1
fi
DIR=$(mktemp -d "${TMPDIR:-/tmp}/idem-mcp-conformance-$MODE-XXXXXX")
PID=
cleanup() {
  if [ -n "$PID" ]; then kill -TERM "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
  rm -rf "$DIR"
}
trap cleanup EXIT
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
if [ "$MODE" = http ]; then
  BASELINE=conformance-baseline.yml
  "$IDEM" --db "$DIR/journal.db" serve --listen "127.0.0.1:$PORT" --insecure-no-auth --workers 1 \
    >"$DIR/server.log" 2>&1 &
  PID=$!
  READY="http://127.0.0.1:$PORT/healthz"
else
  BASELINE=conformance-baseline-stdio.yml
  "$NODE" stdio_bridge.mjs "$PORT" "$DIR" "$IDEM" --db @DB@ mcp >"$DIR/server.log" 2>&1 &
  PID=$!
  READY="http://127.0.0.1:$PORT/mcp"
fi
for _ in $(seq 1 150); do
  if curl -s -o /dev/null "$READY"; then break; fi
  if ! kill -0 "$PID" 2>/dev/null; then cat "$DIR/server.log" >&2; exit 1; fi
  sleep 0.1
done
set +e
"$NODE" "$SUITE" server --url "http://127.0.0.1:$PORT/mcp" --expected-failures "$BASELINE" \
  -o "$DIR/results"
RC=$?
kill -TERM "$PID" 2>/dev/null
wait "$PID"
SERVER_RC=$?
PID=
set -e
if [ "$SERVER_RC" -ne 0 ] && [ "$MODE" = stdio ]; then
  echo "conformance: the stdio bridge saw stdout lines that are not JSON-RPC" >&2
  RC=1
fi
if [ "$RC" -ne 0 ]; then
  echo "--- server log ($MODE) ---" >&2
  tail -50 "$DIR/server.log" >&2
fi
exit "$RC"
