#!/usr/bin/env bash
# The main job: the Snakemake workflow on config/config.yaml (extra arguments go to snakemake,
# e.g. `bash scripts/run.sh --configfile config/paper.yaml -j 32`, or
# `bash scripts/run.sh --profile profiles/slurm`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# A profile or an explicit core/job count decides the parallelism; otherwise $PHAZE_CORES (2).
# Adding --cores next to a profile would override the profile's own `cores:`/`jobs:`.
cores=(--cores "${PHAZE_CORES:-2}")
# Snakemake's default ILP job selector costs the Snakemake process about twice the CPU of the
# greedy one per job (benchmarks/README.md, "The Snakemake process"); jobs here have no
# resource trade-offs for it to solve. A profile or an explicit --scheduler decides instead.
scheduler=(--scheduler greedy)
for arg in "$@"; do
  case "$arg" in
    --profile | --profile=* | --workflow-profile | --workflow-profile=*)
      cores=()
      scheduler=()
      ;;
    --cores | --cores=* | -c | -c[0-9]* | --jobs | --jobs=* | -j | -j[0-9]*)
      cores=()
      ;;
    --scheduler | --scheduler=*)
      scheduler=()
      ;;
  esac
done
# --rerun-incomplete: a killed run's half-made outputs are redone, never taken for done.
exec .venv/bin/snakemake "${cores[@]}" "${scheduler[@]}" --rerun-incomplete --printshellcmds "$@"
