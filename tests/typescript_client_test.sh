#!/usr/bin/env bash
# The TypeScript client and its OpenAI Agents SDK adapter (clients/typescript):
# compiles it with the pinned tsc, then runs its node:test suites against a
# real `idem serve` and the travel providers on loopback.
# Usage: tests/typescript_client_test.sh IDEM TRAVEL_PROVIDERS TRAVEL_LEDGER SOURCE_DIR
set -euo pipefail
export IDEM_BIN=$1 TRAVEL_PROVIDERS_BIN=$2 TRAVEL_LEDGER_BIN=$3 IDEM_SOURCE_DIR=$4
cd "$IDEM_SOURCE_DIR/clients/typescript"
if [ ! -x node_modules/.bin/tsc ]; then
  echo "clients/typescript/node_modules is missing: run scripts/install-deps.sh (npm ci)" >&2
  exit 1
fi
node_modules/.bin/tsc -p tsconfig.json
# One suite at a time: each starts its own servers, and the machine is small.
exec node --test --test-concurrency=1 test/
