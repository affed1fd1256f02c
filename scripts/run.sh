#!/usr/bin/env bash
# The main job: the Snakemake workflow on config/config.yaml (extra arguments go to snakemake,
# e.g. `bash scripts/run.sh --configfile config/paper.yaml -j 32`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# --rerun-incomplete: a killed run's half-made outputs are redone, never taken for done.
exec .venv/bin/snakemake --cores "${PHAZE_CORES:-2}" --rerun-incomplete --printshellcmds "$@"
