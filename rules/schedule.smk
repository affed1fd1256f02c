# Stage 4: per-layer operator scheduling of one architecture chunk for one trace directory:
#   results/schedule/{model}/{tag}/{chunk}.parquet   (read by rules/place.smk)
# One row per arch x layer signature x pass: makespan_s, lower_bound_s, gap, status, ...
# The search rounds (rules/search.smk: schedule_bounds, schedule_ilp) call the same CLI on their
# own paths. SCHEDULE_TIER (ilp | bounds) may be set before this file is included; it is a param,
# so switching it re-runs exactly these jobs.

SCHEDULE_TIER = globals().get("SCHEDULE_TIER", "ilp")


rule schedule:
    input:
        ops=f"{RESULTS}/trace/{{model}}/{{tag}}/ops.parquet",
        edges=f"{RESULTS}/trace/{{model}}/{{tag}}/edges.parquet",
        latency=f"{RESULTS}/estimate/{{model}}/{{tag}}/{{chunk}}.parquet",
        space=f"{RESULTS}/arch/space.parquet",
        chunks=f"{RESULTS}/arch/chunks.parquet",
    output:
        f"{RESULTS}/schedule/{{model}}/{{tag}}/{{chunk}}.parquet",
    log:
        f"{RESULTS}/logs/schedule/{{model}}/{{tag}}/{{chunk}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/schedule/{{model}}/{{tag}}/{{chunk}}.tsv"
    wildcard_constraints:
        tag=r"b\d+_s\d+_tp\d+",
        chunk=r"\d+",
    params:
        code=code_version("schedule"),
        cfg=config_section(config, "schedule"),
        tier=SCHEDULE_TIER,
        trace=lambda wildcards, input: os.path.dirname(input.ops),
    threads: 1
    resources:
        mem_mb=1500,
        # SCIP's limit per ILP solve bounds the job; the watchdog bounds a hung solve
        runtime=60,
    shell:
        "{PHAZE} schedule --tier {params.tier} --trace {params.trace:q} --latency {input.latency:q}"
        " --space {input.space:q} --chunks {input.chunks:q} --chunk {wildcards.chunk}"
        " --config {CONFIG_JSON} --out {output:q} > {log:q} 2>&1"
