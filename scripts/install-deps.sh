#!/usr/bin/env bash
# Installs every Debian package idem needs to build, test and run its demo.
# Does nothing (and needs no network) when they are all present already.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config ccache git ca-certificates
  libboost-dev libboost-locale-dev libpqxx-dev nlohmann-json3-dev libcpp-httplib-dev
  libspdlog-dev libgtest-dev libgmock-dev libsqlitecpp-dev libsqlite3-dev
  libvalijson-dev libcli11-dev libssl-dev prometheus-cpp-dev
  libbenchmark-dev sqlite3 postgresql-15 postgresql-client-15 curl jq
  chromium
  python3-venv python3-pip python3-setuptools python3-pytest
)

# The web UI's browser test: playwright-core as locked in tests/ui (no browser
# download: it drives Debian's chromium), when node_modules is missing.
UI_TESTS="$(cd "$(dirname "$0")/.." && pwd)/tests/ui"
if [ ! -d "$UI_TESTS/node_modules/playwright-core" ] && command -v npm >/dev/null; then
  (cd "$UI_TESTS" && npm ci --no-audit --no-fund --silent) ||
    echo "install-deps: npm ci in tests/ui failed; the ui_browser test will fail" >&2
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)

# npm packages pinned by a committed package-lock.json: `npm ci` only when
# node_modules is missing or the lock changed since the last install (the
# lock's SHA-256 is kept in node_modules), so nothing needs the network when
# they are present.
npm_ci() {
  local dir="$ROOT/$1" stamp want
  shift
  local flags=("$@")  # more `npm ci` flags
  stamp="$dir/node_modules/.idem-lock.sha256"
  want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  command -v npm >/dev/null || { echo "install-deps: ${dir#"$ROOT"/} needs Node.js 20 and npm" >&2; exit 1; }
  echo "install-deps: npm ci in ${dir#"$ROOT"/}" >&2
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error "${flags[@]}")
  echo "$want" >"$stamp"
}
npm_ci clients/typescript
# The Python client into clients/python/.venv, offline (scripts/python-client.sh).
bash "$ROOT/scripts/python-client.sh" >/dev/null
npm_ci tests/mcp  # the MCP SDK, the conformance suite and Node 22 (docs/mcp.md)
npm_ci tests/mcp_upstream
# The peer engines of `make bench-peers` (bench/peers): DBOS Transact and
# Restate (its server binary comes in an npm package). No install scripts:
# none is needed, and one of theirs would report to an analytics host.
npm_ci bench/peers --ignore-scripts
