#!/usr/bin/env bash
# The test suite (pytest arguments may follow, e.g. `bash scripts/test.sh -m "not slow"`).
# Lint and format checks first (seconds), then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/snakefmt --check Snakefile rules/
exec .venv/bin/python -m pytest "$@"
