#!/usr/bin/env bash
# The TypeScript client and its adapters (clients/typescript): compiles it
# with the pinned tsc, then runs the given node:test files (default: all of
# test/) against a real `idem serve` and the travel providers on loopback.
# Usage: tests/typescript_client_test.sh IDEM TRAVEL_PROVIDERS TRAVEL_LEDGER SOURCE_DIR [TEST_FILE...]
set -euo pipefail
export IDEM_BIN=$1 TRAVEL_PROVIDERS_BIN=$2 TRAVEL_LEDGER_BIN=$3 IDEM_SOURCE_DIR=$4
shift 4
cd "$IDEM_SOURCE_DIR/clients/typescript"
if [ ! -x node_modules/.bin/tsc ]; then
  echo "clients/typescript/node_modules is missing: run scripts/install-deps.sh (npm ci)" >&2
  exit 1
fi
node_modules/.bin/tsc -p tsconfig.json
# One suite at a time: each starts its own servers, and the machine is small.
if [ $# -eq 0 ]; then set -- test/; fi
exec node --test --test-concurrency=1 "$@"
