# Stage 4 on its own: the ILP tier of per-layer operator scheduling for one architecture chunk of
# one trace, results/schedule/{model}/{tag}/{chunk}.parquet (read by the stand-alone rule place).
# One row per arch x layer signature x pass: makespan_s, lower_bound_s, gap, status, ...
# The search (rules/search.smk: schedule_bounds under place.model upstream, schedule_ilp) runs the
# same CLI on its own paths.


rule schedule:
    input:
        ops="results/trace/{model}/{tag}/ops.parquet",
        edges="results/trace/{model}/{tag}/edges.parquet",
        latency="results/estimate/{model}/{tag}/{chunk}.parquet",
        space="results/arch/space.parquet",
        chunks="results/arch/chunks.parquet",
    output:
        table="results/schedule/{model}/{tag}/{chunk}.parquet",
        solutions="results/schedule/{model}/{tag}/{chunk}.solutions.parquet",
    log:
        "results/logs/schedule/{model}/{tag}/{chunk}.log",
    benchmark:
        "results/benchmarks/schedule/{model}/{tag}/{chunk}.tsv"
    wildcard_constraints:
        tag=r"b\d+_s\d+_tp\d+(_ep\d+)?(_etp1)?",
        chunk=r"\d+",
    conda:
        "../environment.yml"
    threads: 1
    resources:
        mem_mb=1500,
        # SCIP's limit per ILP solve bounds the job; the watchdog bounds a hung solve
        runtime=60,
    params:
        code=code_version("schedule"),
        cfg=W.section("schedule"),
        trace=lambda wc, input: os.path.dirname(input.ops),
    shell:
        "python3 -m phaze schedule --tier ilp --trace {params.trace:q} --latency {input.latency:q}"
        " --space {input.space:q} --chunks {input.chunks:q} --chunk {wildcards.chunk}"
        ' --config "$PHAZE_CONFIG" --out {output.table:q} --solutions {output.solutions:q}'
        " > {log:q} 2>&1"
