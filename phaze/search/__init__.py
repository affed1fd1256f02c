"""Architecture search over the placement results: area buckets, early stop, exact pruning,
Phaze-Per-Model / Phaze-Common, baselines and the summary tables.

Everything here is a pure function over DataFrames (the Snakemake rules and ``phaze search``
subcommands only read and write files around them), so each piece is unit-tested on synthetic
tables:

* :mod:`phaze.search.plan` — area buckets (visited largest first), rounds of K buckets, chunks.
* :mod:`phaze.search.stop` — the early-stop test.
* :mod:`phaze.search.scores` — per-search values (lower/upper/exact throughput), the running
  search state, pruning decisions, the answers.
* :mod:`phaze.search.baselines` — tpuv4 + expert, tpuv4 + our placement, placement-blind.
* :mod:`phaze.search.summary` — ``best``, ``comparison`` and ``explored`` tables.
"""
