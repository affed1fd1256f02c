# Stage 3: operator latencies. One job per trace directory x architecture chunk; chunks.parquet
# (columns arch, chunk) is written by the workflow rules (rules/search.smk).


rule estimate:
    input:
        ops=f"{RESULTS}/trace/{{model}}/{{tag}}/ops.parquet",
        space=f"{RESULTS}/arch/space.parquet",
        chunks=f"{RESULTS}/arch/chunks.parquet",
    output:
        f"{RESULTS}/estimate/{{model}}/{{tag}}/{{chunk}}.parquet",
    log:
        f"{RESULTS}/logs/estimate/{{model}}/{{tag}}/{{chunk}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/estimate/{{model}}/{{tag}}/{{chunk}}.tsv"
    wildcard_constraints:
        tag=r"b\d+_s\d+_tp\d+",
    params:
        code=code_version("estimate"),
        cfg=config_section(config, "costmodel"),
        trace=lambda wildcards, input: os.path.dirname(input.ops),
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        "{PHAZE} estimate --trace {params.trace:q} --space {input.space:q} "
        "--chunks {input.chunks:q} --chunk {wildcards.chunk} --config {CONFIG_JSON} "
        "--out {output:q} > {log:q} 2>&1"
