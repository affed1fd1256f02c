# The placement-blind baseline: the architecture with the smallest single-accelerator latency of
# one microbatch (search_blind, over the whole space), then placed like any other:
#   search_blind -> estimate_blind -> schedule_blind -> place_blind
# (path prefixes: rules/common.smk).


rule search_blind:
    """The whole space's single-accelerator latencies for one trace, estimated and summed a block
    of architectures at a time (phaze.search.baselines), and the least of them."""
    input:
        unpack(W.search_blind_inputs),
    output:
        "results/baselines/blind/{model}/choice.parquet",
    log:
        f"{LOGS}/search/blind_{{model}}.log",
    benchmark:
        f"{BENCH}/search/blind_{{model}}.tsv"
    conda:
        "../environment.yml"
    params:
        code=code_version("estimate", "search/baselines.py", "search/commands.py"),
        cfg=W.section(
            "costmodel", "place.network", "place.preset_networks", "place.devices"
        ),
        trace=W.search_blind_trace,
    shell:
        "python3 -m phaze search blind --model {wildcards.model:q} --trace {params.trace:q}"
        ' --space {input.space:q} --config "$PHAZE_CONFIG" --out {output:q} > {log:q} 2>&1'


rule estimate_blind:
    input:
        unpack(W.trace_inputs),
        space=W.space,
        choice="results/baselines/blind/{model}/choice.parquet",
    output:
        f"{ESTIMATE}/blind.parquet",
    log:
        f"{LOGS}/estimate/{{model}}/b{{mbs}}_s{{seq}}_{{shard}}/blind.log",
    benchmark:
        f"{BENCH}/estimate/{{model}}/b{{mbs}}_s{{seq}}_{{shard}}/blind.tsv"
    conda:
        "../environment.yml"
    params:
        code=code_version("estimate"),
        cfg=W.section(
            "costmodel", "place.network", "place.preset_networks", "place.devices"
        ),
        trace=W.trace_dir_of,
    shell:
        "python3 -m phaze estimate --trace {params.trace:q} --space {input.space:q}"
        ' --chunks {input.choice:q} --chunk 0 --config "$PHAZE_CONFIG" --out {output:q}'
        " > {log:q} 2>&1"


rule schedule_blind:
    input:
        unpack(W.trace_inputs),
        latency=f"{ESTIMATE}/blind.parquet",
        space=W.space,
        choice="results/baselines/blind/{model}/choice.parquet",
    output:
        table=f"{SCHED}/blind.parquet",
        solutions=f"{SCHED}/blind.solutions.parquet",
    log:
        f"{LOGS}/schedule/{{model}}/b{{mbs}}_s{{seq}}_{{shard}}/blind.log",
    benchmark:
        f"{BENCH}/schedule/{{model}}/b{{mbs}}_s{{seq}}_{{shard}}/blind.tsv"
    conda:
        "../environment.yml"
    params:
        code=code_version("schedule"),
        # the search's final ILP solve (ilp, or deep when it deepens): the baseline's schedules
        # get the same solver effort as the answers'
        cfg=W.schedule_blind_params(),
        tier=W.final_solve,
        trace=W.trace_dir_of,
    shell:
        "python3 -m phaze schedule --tier {params.tier:q} --trace {params.trace:q}"
        " --latency {input.latency:q} --space {input.space:q} --chunks {input.choice:q}"
        ' --chunk 0 --config "$PHAZE_CONFIG" --out {output.table:q}'
        " --solutions {output.solutions:q} > {log:q} 2>&1"


rule place_blind:
    input:
        unpack(W.place_inputs("blind")),
    output:
        W.place_outputs("blind"),
    log:
        f"{LOGS}/place/{{model}}/b{{mbs}}_blind.log",
    benchmark:
        f"{BENCH}/place/{{model}}/b{{mbs}}_blind.tsv"
    conda:
        "../environment.yml"
    params:
        code=code_version("place", "step", "network.py", "arch/presets.py"),
        cfg=W.section("place", "costmodel", "step"),
        cmds=W.place_commands("blind"),
    shell:
        'python3 -m phaze search batch --config "$PHAZE_CONFIG" {params.cmds:q} > {log:q} 2>&1'
