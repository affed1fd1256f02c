# Stage 5 on its own: placement of one architecture chunk for one model x HBM x microbatch x
# recompute, on the stand-alone rule schedule's tables (every width tp the model admits):
#   results/place/{model}/h{hbm}_b{mbs}_r{rec}/{chunk}.parquet
# The search (rules/search.smk: place_bounds, place_ilp, place_blind) runs the same CLI.


rule place:
    input:
        unpack(W.place_inputs("chunk")),
    output:
        "results/place/{model}/h{hbm}_b{mbs}_r{rec}/{chunk}.parquet",
    log:
        "results/logs/place/{model}/h{hbm}_b{mbs}_r{rec}/{chunk}.log",
    benchmark:
        "results/benchmarks/place/{model}/h{hbm}_b{mbs}_r{rec}/{chunk}.tsv"
    wildcard_constraints:
        chunk=r"\d+",
        rec=r"on|off",
    conda:
        "../environment.yml"
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        # place reads costmodel.link_* (pipeline transfers, all-reduce) and presets' overrides
        code=code_version("place", "arch/presets.py"),
        cfg=W.section("place", "costmodel"),
        args=W.place_chunk_args,
    shell:
        "python3 -m phaze place {params.args:q} --out {output:q} > {log:q} 2>&1"
