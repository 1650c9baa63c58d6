#!/usr/bin/env bash
# Runs the web UI's browser test (tests/ui/ui_test.mjs) for ctest:
#   run.sh IDEM TRAVEL_PROVIDERS SOURCE_DIR SCREENSHOT_DIR
# It needs node, Debian's chromium (/usr/bin/chromium, or $IDEM_CHROMIUM)
# and tests/ui/node_modules (playwright-core), all from
# scripts/install-deps.sh; it downloads nothing.
set -euo pipefail
[[ $# -eq 4 ]] || {
  echo "usage: $0 IDEM TRAVEL_PROVIDERS SOURCE_DIR SCREENSHOT_DIR" >&2
  exit 2
}
HERE=$(cd "$(dirname "$0")" && pwd)
CHROMIUM=${IDEM_CHROMIUM:-/usr/bin/chromium}
command -v node >/dev/null || { echo "ui test: node not found (scripts/install-deps.sh)" >&2; exit 1; }
[[ -x "$CHROMIUM" ]] || { echo "ui test: no browser at $CHROMIUM (scripts/install-deps.sh installs chromium)" >&2; exit 1; }
[[ -d "$HERE/node_modules/playwright-core" ]] || {
  echo "ui test: $HERE/node_modules/playwright-core missing: run scripts/install-deps.sh (npm ci in tests/ui)" >&2
  exit 1
}
exec node "$HERE/ui_test.mjs" "$@"
