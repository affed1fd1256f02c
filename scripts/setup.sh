#!/usr/bin/env bash
# Idempotent set-up: a virtual environment at .venv in the repo root with the pinned packages.
# Re-installs only when pyproject.toml changed since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PHAZE_PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "phaze needs Python 3.11 (found $("$PY" --version 2>&1)); set PHAZE_PYTHON" >&2
  exit 2
fi
stamp=.venv/.phaze-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch is pinned to 2.13.0 in pyproject.toml: the CPU build of exactly that version is on disk.
.venv/bin/python -m pip install --quiet -e '.[test,cluster]'
echo "$want" > "$stamp"
