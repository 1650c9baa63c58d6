#!/usr/bin/env bash
# The Python client (clients/python): installed offline into its venv
# (scripts/python-client.sh: again only if its sources changed), then its
# pytest suites with Debian's python3 and python3-pytest against a real
# `idem serve` and the travel providers on loopback, and the vocabulary
# check of both clients and the web UI against server/openapi.json.
# Usage: tests/python_client_test.sh IDEM TRAVEL_PROVIDERS TRAVEL_LEDGER SOURCE_DIR
set -euo pipefail
export IDEM_BIN=$1 TRAVEL_PROVIDERS_BIN=$2 TRAVEL_LEDGER_BIN=$3 IDEM_SOURCE_DIR=$4
PY=$(bash "$IDEM_SOURCE_DIR/scripts/python-client.sh")
cd "$IDEM_SOURCE_DIR/clients/python/tests"
# The package under test is the installed one, not the source folder.
"$PY" -c 'import idem_client, sys; sys.exit(0 if "/.venv/" in idem_client.__file__ else "idem_client is not the installed one: " + idem_client.__file__)'
exec "$PY" -m pytest -q -p no:cacheprovider --durations=5 .
