# Stage 1: trace. One job per model x microbatch x tensor-parallel width (x sequence length).
# Path helpers trace_dir(model, mbs, tp), model_seq(model), model_tps(model) and MODEL_ARG live in
# rules/common.smk.
import json as _trace_json


def _trace_input(wildcards):
    # A model given as a config.json path: re-trace when that file changes.
    arg = MODEL_ARG.get(wildcards.model, wildcards.model)
    if os.path.isdir(arg):
        return [os.path.join(arg, "config.json")]
    return [arg] if arg.endswith(".json") else []


rule trace:
    input:
        _trace_input,
    output:
        ops=f"{RESULTS}/trace/{{model}}/b{{mbs}}_s{{seq}}_tp{{tp}}/ops.parquet",
        edges=f"{RESULTS}/trace/{{model}}/b{{mbs}}_s{{seq}}_tp{{tp}}/edges.parquet",
        layers=f"{RESULTS}/trace/{{model}}/b{{mbs}}_s{{seq}}_tp{{tp}}/layers.parquet",
    log:
        f"{RESULTS}/logs/trace/{{model}}/b{{mbs}}_s{{seq}}_tp{{tp}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/trace/{{model}}/b{{mbs}}_s{{seq}}_tp{{tp}}.tsv"
    wildcard_constraints:
        tp=r"1|2|4|8",
    params:
        code=code_version("trace"),
        # Only what changes a trace's content: the microbatch/t/seq lists choose WHICH traces
        # exist, so editing them must not re-run the ones already made.
        cfg=lambda wildcards: _trace_json.dumps({"fuse": config["trace"]["fuse"]}),
        model=lambda wildcards: MODEL_ARG.get(wildcards.model, wildcards.model),
        out=lambda wildcards, output: os.path.dirname(output.ops),
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        "{PHAZE} trace --model {params.model:q} --microbatch {wildcards.mbs} "
        "--tp {wildcards.tp} --seq {wildcards.seq} --config {CONFIG_JSON} "
        "--out {params.out:q} > {log:q} 2>&1"
