#!/usr/bin/env bash
# The test suite (pytest arguments may follow, e.g. `bash scripts/test.sh -m "not slow"`).
# Lint and format checks first (seconds), then pytest on two workers (pytest-xdist, one test file
# per worker at a time; `-n 0` after the command runs it in one process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/snakefmt --check Snakefile rules/
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
