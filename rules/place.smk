# Stage 5 on its own: placement of one architecture chunk for one model x HBM x microbatch, on
# the stand-alone rule schedule's tables (every width tp the model admits); the placement axes
# (recompute among them) are searched inside the job:
#   results/place/{model}/h{hbm}_b{mbs}/{chunk}.parquet
# The search (rules/search.smk: place_bounds under place.model upstream, place_ilp, place_blind)
# runs the same CLI.


rule place:
    input:
        unpack(W.place_inputs("chunk")),
    output:
        "results/place/{model}/h{hbm}_b{mbs}/{chunk}.parquet",
    log:
        "results/logs/place/{model}/h{hbm}_b{mbs}/{chunk}.log",
    benchmark:
        "results/benchmarks/place/{model}/h{hbm}_b{mbs}/{chunk}.tsv"
    wildcard_constraints:
        chunk=r"\d+",
    conda:
        "../environment.yml"
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        # place reads costmodel (links, HBM bandwidth; presets' overrides) and the step model's
        # accounting (config step)
        code=code_version("place", "step", "network.py", "arch/presets.py"),
        cfg=W.section("place", "costmodel", "step"),
        args=W.place_chunk_args,
    shell:
        'python3 -m phaze place {params.args:q} --config "$PHAZE_CONFIG" --out {output:q}'
        " > {log:q} 2>&1"
