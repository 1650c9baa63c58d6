#!/usr/bin/env bash
# Installs every Debian package idem needs to build, test and run its demo.
# Does nothing (and needs no network) when they are all present already.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config ccache git ca-certificates
  libboost-dev libpqxx-dev nlohmann-json3-dev libcpp-httplib-dev
  libspdlog-dev libgtest-dev libgmock-dev libsqlitecpp-dev libsqlite3-dev
  libvalijson-dev libcli11-dev libssl-dev prometheus-cpp-dev
  libbenchmark-dev sqlite3 postgresql-15 postgresql-client-15 curl jq
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
