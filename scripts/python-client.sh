#!/usr/bin/env bash
# Installs the Python client (clients/python, distribution idem-client) into
# clients/python/.venv without the network: a venv on Debian's python3 that
# also sees Debian's packages (python3-pytest for its tests), and
# `pip install --no-index --no-build-isolation` of the folder with Debian's
# setuptools (Debian's python refuses pip outside a venv, PEP 668). Installs
# again only when the client's sources changed since the last install, so
# it costs nothing when it is current. Prints the venv's python.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR="$ROOT/clients/python"
VENV="$DIR/.venv"
PY=/usr/bin/python3
for mod in venv pip setuptools; do
  if ! "$PY" -c "import $mod" 2>/dev/null; then
    echo "python-client: $PY lacks $mod: install python3-venv python3-pip python3-setuptools (scripts/install-deps.sh)" >&2
    exit 1
  fi
done
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$VENV" >&2
fi
want=$(cd "$DIR" && cat pyproject.toml README.md idem_client/*.py idem_client/py.typed | sha256sum | cut -d' ' -f1)
stamp="$VENV/.idem-client.sha256"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  (cd "$DIR" && "$VENV/bin/python" -m pip install --quiet --no-index --no-build-isolation --no-deps \
      --force-reinstall . >&2)
  rm -rf "$DIR/build" "$DIR"/*.egg-info
  echo "$want" >"$stamp"
fi
echo "$VENV/bin/python"
