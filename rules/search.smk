# The search, as Snakemake rounds (the round logic is phaze.workflow.Sweep, `W`):
#   search_plan (checkpoint)    space.parquet -> chunks.parquet: area bucket, round, chunk per arch
#   per round r, for the (model, microbatch) pairs a running search still needs:
#     estimate (estimate.smk)   trace x chunk -> operator latencies
#     schedule_bounds           trace x chunk -> list-schedule makespans + lower bounds (no ILP)
#     place_bounds              model x microbatch -> per HBM x recompute, throughput upper bound
#                               (ub) and achievable throughput (lo) of every arch of the round
#     search_prune (checkpoint) which archs can still beat the best proven -> ILP chunk tables
#     schedule_ilp, place_ilp   the ILP for those archs only, and placement on its makespans
#                               (ilp) and on its proven lower bounds (ilp_ub: the certificate)
#     with search.deepen_node_limit > 0, once more at {stage} = deep: search_prune re-prunes
#     with the ILP tier in, schedule_ilp / place_ilp solve the archs left with the deep limits
#     search_state (checkpoint) early-stop test; round r+1 exists only if a search still runs
#   baselines: rules/baselines.smk (placement-blind); the tpuv4 preset is pinned to round 0.
#   search_summary              results/summary/{best,comparison,explored}.parquet
# prune, state and summary get a manifest (written by their run: block from the Sweep function
# that gives their inputs) listing each file with its model, microbatch, round and tier; run:
# blocks execute in Snakemake's own environment (no conda: directive applies to them).


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
        # only what decides the plan: a rewritten chunks.parquet re-runs every estimate after it
        code=code_version("search/plan.py"),
        cfg=W.plan_params(),
    shell:
        'python3 -m phaze search plan --space {input:q} --config "$PHAZE_CONFIG"'
        " --out {output:q} > {log:q} 2>&1"


rule schedule_bounds:
    input:
        unpack(W.trace_inputs),
        latency=f"{ESTIMATE}/{{chunk}}.parquet",
        space=W.space,
        plan=W.plan,
    output:
        f"{SCHED}/bounds/c{{chunk}}.parquet",
    log:
        f"{LOGS}/schedule/{{model}}/b{{mbs}}_s{{seq}}_tp{{tp}}/bounds/c{{chunk}}.log",
    benchmark:
        f"{BENCH}/schedule/{{model}}/b{{mbs}}_s{{seq}}_tp{{tp}}/bounds/c{{chunk}}.tsv"
    conda:
        "../environment.yml"
    params:
        code=code_version("schedule"),
        cfg=W.section("schedule"),
        trace=W.trace_dir_of,
    shell:
        "python3 -m phaze schedule --tier bounds --trace {params.trace:q}"
        " --latency {input.latency:q} --space {input.space:q} --chunks {input.plan:q}"
        ' --chunk {wildcards.chunk} --config "$PHAZE_CONFIG" --out {output:q} > {log:q} 2>&1'


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
        plan=W.plan,
        place=W.prune_inputs,
    output:
        directory("results/search/r{round}/{stage}"),
    log:
        f"{LOGS}/search/r{{round}}_{{stage}}_prune.log",
    benchmark:
        f"{BENCH}/search/r{{round}}_{{stage}}_prune.tsv"
    params:
        code=W.search_code(),
        cfg=W.search_params(),
    run:
        manifest = W.write_manifest(
            f"{log}.manifest.json", W.prune_manifest(wildcards), input
        )
        shell(
            "python3 -m phaze search prune --plan {input.plan:q} --round {wildcards.round}"
            " --stage {wildcards.stage:q} --manifest {manifest:q}"
            ' --config "$PHAZE_CONFIG" --out {output:q} > {log:q} 2>&1'
        )


rule schedule_ilp:
    input:
        unpack(W.trace_inputs),
        latency=f"{ESTIMATE}/{{chunk}}.parquet",
        space=W.space,
        # lets a remote job evaluate the `archs` param (it reads the checkpoint); ancient(): its
        # mtime never re-runs an ILP, the content of `archs` does
        selection=lambda wc: ancient(W.ilp_selection_file(wc)),
    output:
        f"{SCHED}/{{stage}}/r{{round}}_c{{chunk}}.parquet",
    log:
        f"{LOGS}/schedule/{{model}}/b{{mbs}}_s{{seq}}_tp{{tp}}/{{stage}}/r{{round}}_c{{chunk}}.log",
    benchmark:
        f"{BENCH}/schedule/{{model}}/b{{mbs}}_s{{seq}}_tp{{tp}}/{{stage}}/r{{round}}_c{{chunk}}.tsv"
    conda:
        "../environment.yml"
    params:
        code=code_version("schedule"),
        cfg=W.ilp_params,
        trace=W.trace_dir_of,
        # the archs pruning selected, as a param: a re-run prune that selects the same archs
        # (say, after a placement edit) does not re-run the ILPs
        archs=W.ilp_archs,
    shell:
        "python3 -m phaze schedule --tier {wildcards.stage:q} --trace {params.trace:q}"
        " --latency {input.latency:q} --space {input.space:q} --archs {params.archs:q}"
        ' --config "$PHAZE_CONFIG" --out {output:q} > {log:q} 2>&1'


rule place_ilp:
    input:
        unpack(W.place_inputs("ilp")),
    output:
        ilp=W.place_outputs("r{round}_{stage}"),
        ub=W.place_outputs("r{round}_{stage}_ub"),
    log:
        f"{LOGS}/place/{{model}}/b{{mbs}}_r{{round}}_{{stage}}.log",
    benchmark:
        f"{BENCH}/place/{{model}}/b{{mbs}}_r{{round}}_{{stage}}.tsv"
    conda:
        "../environment.yml"
    params:
        code=code_version("place", "step", "network.py", "arch/presets.py"),
        cfg=W.section("place", "costmodel", "step"),
        cmds=W.place_commands("ilp"),
    shell:
        'python3 -m phaze search batch --config "$PHAZE_CONFIG" {params.cmds:q} > {log:q} 2>&1'


checkpoint search_state:
    input:
        plan=W.plan,
        place=W.state_inputs,
    output:
        "results/search/r{round}/state.json",
    log:
        f"{LOGS}/search/r{{round}}_state.log",
    benchmark:
        f"{BENCH}/search/r{{round}}_state.tsv"
    params:
        code=W.search_code(),
        cfg=W.search_params(),
        bench=BENCH,
    run:
        manifest = W.write_manifest(
            f"{log}.manifest.json", W.state_manifest(wildcards), input
        )
        shell(
            "python3 -m phaze search state --plan {input.plan:q} --round {wildcards.round}"
            ' --manifest {manifest:q} --config "$PHAZE_CONFIG" --benchmarks {params.bench:q}'
            " --out {output:q} > {log:q} 2>&1"
        )
        # the round's progress line, on the terminal of the Snakemake process
        shell("grep -m 1 '^phaze search: round' {log:q} || true")


rule search_summary:
    input:
        unpack(W.summary_inputs),
    output:
        **W.summary,
        stats="results/summary/search_stats.json",
    log:
        f"{LOGS}/search/summary.log",
    benchmark:
        f"{BENCH}/search/summary.tsv"
    params:
        code=code_version("search"),
        cfg=W.section("search"),
        out=lambda wc, output: os.path.dirname(output.stats),
    run:
        manifest = W.write_manifest(
            f"{log}.manifest.json", W.summary_manifest(), input
        )
        shell(
            "python3 -m phaze search summarize --plan {input.plan:q} --space {input.space:q}"
            ' --manifest {manifest:q} --config "$PHAZE_CONFIG" --out-dir {params.out:q}'
            " > {log:q} 2>&1"
        )
