# Stage 1: trace. One job per model x microbatch x shard (tensor-parallel width, and for a
# mixture-of-experts model expert-parallel size: tp2, tp2_ep4) x sequence length.


rule trace:
    input:
        W.trace_config_inputs,
    output:
        ops="results/trace/{model}/b{mbs}_s{seq}_{shard}/ops.parquet",
        edges="results/trace/{model}/b{mbs}_s{seq}_{shard}/edges.parquet",
        layers="results/trace/{model}/b{mbs}_s{seq}_{shard}/layers.parquet",
    log:
        "results/logs/trace/{model}/b{mbs}_s{seq}_{shard}.log",
    benchmark:
        "results/benchmarks/trace/{model}/b{mbs}_s{seq}_{shard}.tsv"
    wildcard_constraints:
        shard=r"tp(1|2|4|8)(_ep\d+)?(_etp1)?",
    conda:
        "../environment.yml"
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        code=code_version("trace"),
        cfg=W.trace_params(),
        model=W.trace_model,
        tp=W.shard_tp,
        ep=W.shard_ep,
        etp=W.shard_etp,
        out=lambda wc, output: os.path.dirname(output.ops),
    shell:
        "python3 -m phaze trace --model {params.model:q} --microbatch {wildcards.mbs}"
        " --tp {params.tp:q} --ep {params.ep:q} --etp {params.etp:q} --seq {wildcards.seq}"
        ' --config "$PHAZE_CONFIG"'
        " --out {params.out:q} > {log:q} 2>&1"
