# The search, as Snakemake rounds (the round logic is phaze.workflow.Sweep, `W`):
#   search_plan (checkpoint)    space.parquet -> chunks.parquet: area bucket and walk round per arch
#   space_bounds                model x microbatch -> a proven throughput upper bound of every
#                               arch of the space (vectorised, in one job)
#   per round r:
#     search_select (checkpoint) space bounds + every earlier placement -> the (model,
#                               microbatch, arch) components round r refines, and the state
#                               (answers and certificates so far); empty = the search is done
#     search_tier               model x microbatch -> the array tier: list-schedule makespans +
#                               lower bounds of the round's archs, and per HBM the placement on
#                               the lower bounds (ub) and on the list schedules (lo); under
#                               place.model upstream instead estimate_round, schedule_bounds
#                               (trace x chunk) and place_bounds (model x microbatch)
#     search_prune (checkpoint) which of the round's components still matter -> ILP chunk tables
#     estimate_round            trace x chunk -> operator latencies of a chunk the ILP solves
#     schedule_ilp, place_ilp   the ILP for those only, and placement on its makespans (ilp)
#                               and on its proven lower bounds (ilp_ub)
#     with search.deepen_node_limit > 0, once more at {solve} = deep; with
#     search.certify_split_nodes > 0, once more at {solve} = certify (the final solve with the
#     split, for the components whose bounds keep a certificate above its gap)
#   baselines: rules/baselines.smk (placement-blind); the tpuv4 presets are refined in round 0.
#   search_summary              results/summary/{best,comparison,explored,front,certified}.parquet
# select, prune and summary read a manifest listing each input file with its model, microbatch,
# round and tier; the job writes it first (`--build-manifest`: the Sweep function that gives its
# inputs, on the finished checkpoints' outputs), so every rule is a plain shell job.


checkpoint search_plan:
    input:
        "results/arch/space.parquet",
    output:
        "results/arch/chunks.parquet",
    log:
        f"{LOGS}/search/plan.log",
    benchmark:
        f"{BENCH}/search/plan.tsv"
    conda:
        "../environment.yml"
    params:
        # only what decides the plan
        code=code_version("search/plan.py"),
        cfg=W.search_plan_params(),
    shell:
        'python3 -m phaze search plan --space {input:q} --config "$PHAZE_CONFIG"'
        " --out {output:q} > {log:q} 2>&1"


rule space_bounds:
    input:
        unpack(W.space_bounds_inputs),
    output:
        "results/search/space/{model}/b{mbs}.parquet",
    log:
        f"{LOGS}/search/space/{{model}}_b{{mbs}}.log",
    benchmark:
        f"{BENCH}/search/space/{{model}}_b{{mbs}}.tsv"
    conda:
        "../environment.yml"
    resources:
        mem_mb=4000,
        runtime=20,
    params:
        code=code_version(
            "search/space_bounds.py",
            "search/dominance.py",
            "estimate",
            "schedule",
            "place",
            "step",
            "network.py",
            "arch/presets.py",
        ),
        cfg=W.section(
            "costmodel",
            "place",
            "step",
        ),
        args=W.space_bounds_args,
    shell:
        'python3 -m phaze search bounds {params.args:q} --config "$PHAZE_CONFIG"'
        " --out {output:q} > {log:q} 2>&1"


checkpoint search_select:
    input:
        unpack(W.search_select_inputs),
    output:
        select="results/search/r{round}/select.parquet",
        state="results/search/r{round}/state.json",
    log:
        f"{LOGS}/search/r{{round}}_select.log",
    benchmark:
        f"{BENCH}/search/r{{round}}_select.tsv"
    conda:
        "../environment.yml"
    params:
        code=W.search_code(),
        cfg=W.search_params(),
        bench=BENCH,
        out=lambda wc, output: os.path.dirname(output.select),
        plan=W.plan,
        previous=W.previous_state_args,
    # the job builds its manifest (the files it reads, with what each holds) in its own process
    # (--build-manifest), from the same Sweep function as its inputs; the round's progress line
    # goes to the terminal too. No named input in these commands: a dry run formats them before
    # the checkpoints decide them
    shell:
        "python3 -m phaze search select --plan {params.plan:q} --round {wildcards.round}"
        " {params.previous:q} --build-manifest --manifest {log:q}.manifest.json"
        ' --config "$PHAZE_CONFIG" --benchmarks {params.bench:q} --out-dir {params.out:q}'
        " > {log:q} 2>&1"
        " && (grep -m 1 '^phaze search: round' {log:q} || true)"


rule estimate_round:
    input:
        unpack(W.trace_inputs),
        space=W.space,
        # lets a remote job evaluate the `archs` param (it reads the checkpoint); ancient(): its
        # mtime never re-runs a job, the content of `archs` does
        selection=lambda wc: ancient(W.round_selection_file(wc)),
    output:
        f"{ESTIMATE}/r{{round}}_c{{chunk}}.parquet",
    log:
        f"{LOGS}/estimate/{{model}}/b{{mbs}}_s{{seq}}_{{shard}}/r{{round}}_c{{chunk}}.log",
    benchmark:
        f"{BENCH}/estimate/{{model}}/b{{mbs}}_s{{seq}}_{{shard}}/r{{round}}_c{{chunk}}.tsv"
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
        trace=W.trace_dir_of,
        archs=W.round_archs,
    shell:
        "python3 -m phaze estimate --trace {params.trace:q} --space {input.space:q}"
        ' --archs {params.archs:q} --config "$PHAZE_CONFIG" --out {output:q} > {log:q} 2>&1'


# the round's bound tier: the array tier (place.model megatron) in one job per model x
# microbatch x round, or the per-architecture rules (place.model upstream, which it refuses)
if W.array_tier:

    rule search_tier:
        input:
            unpack(W.search_tier_inputs),
            # lets a remote job evaluate the `archs` param (it reads the checkpoint); ancient():
            # its mtime never re-runs a job, the content of `archs` does
            selection=lambda wc: ancient(W.round_selection_file(wc)),
        output:
            ub=W.place_outputs("r{round}_ub"),
            lo=W.place_outputs("r{round}_lo"),
            layers="results/schedule/{model}/tier/b{mbs}_r{round}.parquet",
        log:
            f"{LOGS}/search/tier/{{model}}_b{{mbs}}_r{{round}}.log",
        benchmark:
            f"{BENCH}/search/tier/{{model}}_b{{mbs}}_r{{round}}.tsv"
        conda:
            "../environment.yml"
        params:
            code=code_version(
                "search/array_tier.py",
                "search/space_bounds.py",
                "estimate",
                "schedule",
                "place",
                "step",
                "network.py",
                "arch/presets.py",
            ),
            cfg=W.section("costmodel", "place", "step"),
            args=W.search_tier_args,
            # the archs of round r's selection, as a param: a re-run select that picks the
            # same archs re-runs no job
            archs=W.search_tier_archs,
        shell:
            "python3 -m phaze search tier {params.args:q} --archs {params.archs:q}"
            ' --config "$PHAZE_CONFIG" --ub {output.ub:q} --lo {output.lo:q}'
            " --layers {output.layers:q} > {log:q} 2>&1"

else:

    rule schedule_bounds:
        input:
            unpack(W.trace_inputs),
            latency=f"{ESTIMATE}/r{{round}}_c{{chunk}}.parquet",
            space=W.space,
            selection=lambda wc: ancient(W.round_selection_file(wc)),
        output:
            table=f"{SCHED}/bounds/r{{round}}_c{{chunk}}.parquet",
            solutions=f"{SCHED}/bounds/r{{round}}_c{{chunk}}.solutions.parquet",
        log:
            f"{LOGS}/schedule/{{model}}/b{{mbs}}_s{{seq}}_{{shard}}/bounds/r{{round}}_c{{chunk}}.log",
        benchmark:
            f"{BENCH}/schedule/{{model}}/b{{mbs}}_s{{seq}}_{{shard}}/bounds/r{{round}}_c{{chunk}}.tsv"
        conda:
            "../environment.yml"
        params:
            code=code_version("schedule"),
            cfg=W.section("schedule"),
            trace=W.trace_dir_of,
            archs=W.round_archs,
        shell:
            "python3 -m phaze schedule --tier bounds --trace {params.trace:q}"
            " --latency {input.latency:q} --space {input.space:q} --archs {params.archs:q}"
            ' --config "$PHAZE_CONFIG" --out {output.table:q} --solutions {output.solutions:q}'
            " > {log:q} 2>&1"

    rule place_bounds:
        input:
            unpack(W.place_inputs("bounds")),
        output:
            ub=W.place_outputs("r{round}_ub"),
            lo=W.place_outputs("r{round}_lo"),
        log:
            f"{LOGS}/place/{{model}}/b{{mbs}}_r{{round}}_bounds.log",
        benchmark:
            f"{BENCH}/place/{{model}}/b{{mbs}}_r{{round}}_bounds.tsv"
        conda:
            "../environment.yml"
        params:
            # place reads costmodel (links, HBM bandwidth; presets' overrides) and the step model's
            # accounting (config step)
            code=code_version("place", "step", "network.py", "arch/presets.py"),
            cfg=W.section("place", "costmodel", "step"),
            cmds=W.place_commands("bounds"),
        shell:
            'python3 -m phaze search batch --config "$PHAZE_CONFIG" {params.cmds:q} > {log:q} 2>&1'


checkpoint search_prune:
    input:
        unpack(W.search_prune_inputs),
    output:
        directory("results/search/r{round}/{solve}"),
    log:
        f"{LOGS}/search/r{{round}}_{{solve}}_prune.log",
    benchmark:
        f"{BENCH}/search/r{{round}}_{{solve}}_prune.tsv"
    conda:
        "../environment.yml"
    params:
        code=W.search_code(),
        cfg=W.search_params(),
        plan=W.plan,
        select=lambda wc: W.round_select(wc.round),
        state=lambda wc: W.round_state(wc.round),
    shell:
        "python3 -m phaze search prune --plan {params.plan:q} --round {wildcards.round}"
        " --solve {wildcards.solve:q} --select {params.select:q} --state {params.state:q}"
        " --build-manifest --manifest {log:q}.manifest.json"
        ' --config "$PHAZE_CONFIG" --out {output:q} > {log:q} 2>&1'


rule schedule_ilp:
    input:
        unpack(W.trace_inputs),
        latency=f"{ESTIMATE}/r{{round}}_c{{chunk}}.parquet",
        space=W.space,
        # lets a remote job evaluate the `archs` param (it reads the checkpoint); ancient(): its
        # mtime never re-runs an ILP, the content of `archs` does
        selection=lambda wc: ancient(W.schedule_ilp_selection(wc)),
    output:
        table=f"{SCHED}/{{solve}}/r{{round}}_c{{chunk}}.parquet",
        solutions=f"{SCHED}/{{solve}}/r{{round}}_c{{chunk}}.solutions.parquet",
    log:
        f"{LOGS}/schedule/{{model}}/b{{mbs}}_s{{seq}}_{{shard}}/{{solve}}/r{{round}}_c{{chunk}}.log",
    benchmark:
        f"{BENCH}/schedule/{{model}}/b{{mbs}}_s{{seq}}_{{shard}}/{{solve}}/r{{round}}_c{{chunk}}.tsv"
    conda:
        "../environment.yml"
    params:
        code=code_version("schedule"),
        cfg=W.schedule_ilp_params,
        trace=W.trace_dir_of,
        # the archs pruning selected, as a param: a re-run prune that selects the same archs
        # (say, after a placement edit) does not re-run the ILPs
        archs=W.schedule_ilp_archs,
    shell:
        "python3 -m phaze schedule --tier {wildcards.solve:q} --trace {params.trace:q}"
        " --latency {input.latency:q} --space {input.space:q} --archs {params.archs:q}"
        ' --config "$PHAZE_CONFIG" --out {output.table:q} --solutions {output.solutions:q}'
        " > {log:q} 2>&1"


rule place_ilp:
    input:
        unpack(W.place_inputs("ilp")),
    output:
        ilp=W.place_outputs("r{round}_{solve}"),
        ub=W.place_outputs("r{round}_{solve}_ub"),
    log:
        f"{LOGS}/place/{{model}}/b{{mbs}}_r{{round}}_{{solve}}.log",
    benchmark:
        f"{BENCH}/place/{{model}}/b{{mbs}}_r{{round}}_{{solve}}.tsv"
    conda:
        "../environment.yml"
    params:
        code=code_version("place", "step", "network.py", "arch/presets.py"),
        cfg=W.section("place", "costmodel", "step"),
        cmds=W.place_commands("ilp"),
    shell:
        'python3 -m phaze search batch --config "$PHAZE_CONFIG" {params.cmds:q} > {log:q} 2>&1'


rule search_summary:
    input:
        unpack(W.search_summary_inputs),
    output:
        **W.summary,
        stats="results/summary/search_stats.json",
    log:
        f"{LOGS}/search/summary.log",
    benchmark:
        f"{BENCH}/search/summary.tsv"
    conda:
        "../environment.yml"
    params:
        code=code_version("search"),
        cfg=W.section("search"),
        out=lambda wc, output: os.path.dirname(output.stats),
        plan=W.plan,
        space=W.space,
    shell:
        "python3 -m phaze search summarize --plan {params.plan:q} --space {params.space:q}"
        " --build-manifest --manifest {log:q}.manifest.json"
        ' --config "$PHAZE_CONFIG" --out-dir {params.out:q} > {log:q} 2>&1'
