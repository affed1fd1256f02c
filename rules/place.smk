# Stage 5: placement of one chunk of architectures, for one model x HBM x microbatch x recompute.
#   results/place/{model}/h{hbm}_b{mbs}_r{rec}/{chunk}.parquet
# The search rounds (rules/search.smk: place_bounds, place_ilp) call the same CLI on their own
# schedule tiers. Swap the inputs by redefining place_trace_dirs / place_schedule_files.


def place_trace_dirs(wildcards):
    """One trace dir per tensor-parallel width the model admits (ascending t)."""
    return [trace_dir(wildcards.model, wildcards.mbs, t) for t in model_tps(wildcards.model)]


def place_schedule_files(wildcards):
    """Per t (same order as place_trace_dirs), the schedule tables of this chunk."""
    m, b = wildcards.model, int(wildcards.mbs)
    return [[f"{RESULTS}/schedule/{m}/{tag(m, b, t)}/{wildcards.chunk}.parquet"]
            for t in model_tps(m)]


def _place_chunk_inputs(wildcards):
    return {
        "layers": [f"{d}/layers.parquet" for d in place_trace_dirs(wildcards)],
        "schedules": [f for per_t in place_schedule_files(wildcards) for f in per_t],
        "space": f"{RESULTS}/arch/space.parquet",
    }


def _place_chunk_args(wildcards):
    tps = model_tps(wildcards.model)
    return (f"--model {wildcards.model} --tp {' '.join(map(str, tps))}"
            f" --trace-dirs {' '.join(place_trace_dirs(wildcards))}"
            f" --schedules {' '.join(','.join(fs) for fs in place_schedule_files(wildcards))}"
            f" --hbm-gib {wildcards.hbm} --microbatch {wildcards.mbs} --recompute {wildcards.rec}")


rule place:
    input:
        unpack(_place_chunk_inputs),
    output:
        f"{RESULTS}/place/{{model}}/h{{hbm}}_b{{mbs}}_r{{rec}}/{{chunk}}.parquet",
    wildcard_constraints:
        chunk=r"\d+",
        rec=r"on|off",
    params:
        # place reads costmodel.link_* (pipeline transfers, all-reduce) and presets' overrides
        code=code_version("place", "arch/presets.py"),
        cfg=config_section(config, "place", "costmodel"),
        args=_place_chunk_args,
    log:
        f"{RESULTS}/logs/place/{{model}}/h{{hbm}}_b{{mbs}}_r{{rec}}/{{chunk}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/place/{{model}}/h{{hbm}}_b{{mbs}}_r{{rec}}/{{chunk}}.tsv"
    resources:
        mem_mb=1000,
        runtime=10,
    shell:
        "{PHAZE} place {params.args} --space {input.space} --config {CONFIG_JSON}"
        " --out {output} > {log} 2>&1"
