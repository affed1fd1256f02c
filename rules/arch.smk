# Stage 2: the architecture space. One job; re-runs when the arch code, the `arch` config section,
# a preset file, or a costmodel constant that a preset overrides changes.


rule arch:
    input:
        presets=[f"config/presets/{p}.yaml" for p in W.arch_presets()],
    output:
        "results/arch/space.parquet",
    log:
        "results/logs/arch/space.log",
    benchmark:
        "results/benchmarks/arch/space.tsv"
    conda:
        "../environment.yml"
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        code=code_version("arch"),
        cfg=W.arch_params(),
    shell:
        'python3 -m phaze arch --config "$PHAZE_CONFIG" --out {output:q} > {log:q} 2>&1'
