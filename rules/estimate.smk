# Stage 3: operator latencies. One job per trace directory x architecture chunk; chunks.parquet
# (columns arch, chunk) is the search plan (checkpoint search_plan, rules/search.smk).


rule estimate:
    input:
        ops="results/trace/{model}/{tag}/ops.parquet",
        space="results/arch/space.parquet",
        chunks="results/arch/chunks.parquet",
    output:
        "results/estimate/{model}/{tag}/{chunk}.parquet",
    log:
        "results/logs/estimate/{model}/{tag}/{chunk}.log",
    benchmark:
        "results/benchmarks/estimate/{model}/{tag}/{chunk}.tsv"
    wildcard_constraints:
        tag=r"b\d+_s\d+_tp\d+(_ep\d+)?(_etp1)?",
    conda:
        "../environment.yml"
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        code=code_version("estimate"),
        cfg=W.section(
            "costmodel", "place.network", "place.preset_networks", "place.devices"
        ),
        trace=lambda wc, input: os.path.dirname(input.ops),
    shell:
        "python3 -m phaze estimate --trace {params.trace:q} --space {input.space:q}"
        ' --chunks {input.chunks:q} --chunk {wildcards.chunk} --config "$PHAZE_CONFIG"'
        " --out {output:q} > {log:q} 2>&1"
