# What every rule file shares: the wildcards' shapes and a few path prefixes. The sweep's axes,
# paths and the rules' input/param functions are phaze.workflow.Sweep (`W`, built in the Snakefile).
ESTIMATE = "results/estimate/{model}/b{mbs}_s{seq}_{shard}"
SCHED = "results/schedule/{model}/b{mbs}_s{seq}_{shard}"
LOGS = "results/logs"
BENCH = "results/benchmarks"


wildcard_constraints:
    model=r"[^/]+",
    mbs=r"\d+",
    shard=r"tp\d+(_ep\d+)?(_etp1)?",
    seq=r"\d+",
    chunk=r"\d+",
    round=r"\d+",
    hbm=r"[0-9.]+",
    tier=r"ub|lo|ilp",
    solve=r"ilp|deep|certify",
