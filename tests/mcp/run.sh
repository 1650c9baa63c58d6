#!/usr/bin/env bash
# The MCP tests (docs/mcp.md): the official TypeScript SDK client against
# `idem mcp` (stdio) and /mcp on `idem serve` (Streamable HTTP), with the
# travel providers and their ledger on loopback. Run by ctest (mcp_sdk).
# With PGDIR (the ctest `postgres` fixture's folder), the stdio-on-PostgreSQL
# test runs on a database of its own there (IDEM_MCP_PG_URL), dropped after.
# Usage: tests/mcp/run.sh IDEM TRAVEL_PROVIDERS TRAVEL_LEDGER SOURCE_DIR [PGDIR]
set -euo pipefail
export IDEM_BIN=$1 TRAVEL_PROVIDERS_BIN=$2 TRAVEL_LEDGER_BIN=$3 IDEM_SOURCE_DIR=$4
PGDIR=${5:-}
cd "$IDEM_SOURCE_DIR/tests/mcp"
if [ ! -d node_modules/@modelcontextprotocol/sdk ]; then
  echo "tests/mcp/node_modules is missing: run scripts/install-deps.sh (npm ci)" >&2
  exit 1
fi
if [ -n "$PGDIR" ] && [ -f "$PGDIR/url" ]; then
  PSQL=$(command -v psql || ls -d /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -n 1)
  BASE_URL=$(cat "$PGDIR/url")
  DB="mcp_sdk_$$_${RANDOM}"
  "$PSQL" "$BASE_URL" -XAtq -v ON_ERROR_STOP=1 -c "CREATE DATABASE \"$DB\"" >/dev/null
  trap '"$PSQL" "$BASE_URL" -XAtq -c "DROP DATABASE IF EXISTS \"$DB\" WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
  export IDEM_MCP_PG_URL="${BASE_URL%/*}/$DB"
fi
# One file at a time: each starts its own servers, and the machine is small.
node --test --test-concurrency=1 test/
