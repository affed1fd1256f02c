# Stage 1: trace. One job per model x microbatch x tensor-parallel width (x sequence length).


rule trace:
    input:
        W.trace_config_inputs,
    output:
        ops="results/trace/{model}/b{mbs}_s{seq}_tp{tp}/ops.parquet",
        edges="results/trace/{model}/b{mbs}_s{seq}_tp{tp}/edges.parquet",
        layers="results/trace/{model}/b{mbs}_s{seq}_tp{tp}/layers.parquet",
    log:
        "results/logs/trace/{model}/b{mbs}_s{seq}_tp{tp}.log",
    benchmark:
        "results/benchmarks/trace/{model}/b{mbs}_s{seq}_tp{tp}.tsv"
    wildcard_constraints:
        tp=r"1|2|4|8",
    conda:
        "../environment.yml"
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        code=code_version("trace"),
        cfg=W.trace_params(),
        model=W.trace_model,
        out=lambda wc, output: os.path.dirname(output.ops),
    shell:
        "python3 -m phaze trace --model {params.model:q} --microbatch {wildcards.mbs}"
        ' --tp {wildcards.tp} --seq {wildcards.seq} --config "$PHAZE_CONFIG"'
        " --out {params.out:q} > {log:q} 2>&1"
