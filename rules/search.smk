# The search, as Snakemake rounds.
#
#   search_plan (checkpoint)     space.parquet -> chunks.parquet: area bucket, round, chunk per arch
#   per round r, for the (model, microbatch) pairs a running search still needs:
#     estimate (rules/estimate.smk) trace x chunk -> operator latencies
#     schedule_bounds            trace x chunk -> list-schedule makespans + lower bounds (no ILP)
#     place_bounds               model x HBM x microbatch x recompute -> throughput upper bound (ub)
#                                and achievable throughput (lo) of every arch of the round
#     search_prune (checkpoint)  which archs can still beat the best proven -> ILP chunk tables
#     schedule_ilp               ILP only for those archs
#     place_ilp                  placement on the ILP makespans
#     search_state (checkpoint)  early-stop test; round r+1 exists only if a search still runs
#   baselines: search_blind (+ estimate/schedule/place of its arch); tpuv4 is pinned to round 0.
#   search_summary               results/summary/{best,comparison,explored}.parquet
import functools as _functools
import os as _os

import pandas as _pd

SPACE = f"{RESULTS}/arch/space.parquet"
PLAN_KEYS = ("bucket_width_mm2", "round_buckets", "chunk_archs", "baseline_preset")
SEARCH_STATE_CODE = code_version(*(f"search/{f}.py" for f in ("evaluate", "stop", "plan", "files", "commands", "cli")))
SEARCH_STATE_CFG = _json.dumps({k: v for k, v in SEARCH.items() if k not in ("chunk_archs",)}, sort_keys=True)
PLAN = f"{RESULTS}/arch/chunks.parquet"
TAG = "b{mbs}_s{seq}_tp{tp}"
TRACE_DIR = f"{RESULTS}/trace/{{model}}/{TAG}"


def _trace_dir_of(wc):
    # from wildcards, not from `input`: params are re-evaluated inside remote (cluster) jobs,
    # where named inputs of unpack()ed functions are not available
    return f"{RESULTS}/trace/{wc.model}/b{wc.mbs}_s{wc.seq}_tp{wc.tp}"


def _trace_inputs(wc):
    d = _trace_dir_of(wc)
    return {"ops": f"{d}/ops.parquet", "edges": f"{d}/edges.parquet", "layers": f"{d}/layers.parquet"}


@_functools.lru_cache(maxsize=None)
def _read_plan(path, mtime):
    return _pd.read_parquet(path, columns=["arch", "round", "chunk"])


def plan_table():
    path = checkpoints.search_plan.get().output[0]
    return _read_plan(path, _os.path.getmtime(path))


def round_chunks(r):
    p = plan_table()
    return sorted(int(c) for c in p.loc[p["round"] == int(r), "chunk"].unique())


@_functools.lru_cache(maxsize=None)
def _read_state(path, mtime):
    with open(path) as fh:
        return _json.load(fh)


def state_of(r):
    path = checkpoints.search_state.get(round=int(r)).output[0]
    return _read_state(path, _os.path.getmtime(path))


def pairs_of_round(r):
    """(model, microbatch) pairs computed in round r."""
    r = int(r)
    if r == 0:
        return PAIRS
    return [(m, int(b)) for m, b in state_of(r - 1)["needed"]]


def _place_dir(m, h, b, rec):
    return f"{RESULTS}/place/{m}/h{gib_str(h)}_b{b}_r{rec}"


def bound_place_files(r):
    return [f"{_place_dir(m, h, b, rec)}/r{r}_{tier}.parquet"
            for m, b in pairs_of_round(r) for h in HBM_GIB for rec in RECOMPUTE for tier in ("ub", "lo")]


@_functools.lru_cache(maxsize=None)
def _read_selection(path, mtime):
    return _pd.read_parquet(path, columns=["arch", "chunk"])


def _selection(r, m, b):
    # cached by file and mtime: DAG evaluation asks for every earlier round's selection often
    d = checkpoints.search_prune.get(round=int(r)).output[0]
    path = f"{d}/{m}_b{b}.parquet"
    return _read_selection(path, _os.path.getmtime(path))


def ilp_selection(r, m, b):
    """Chunks of round r whose ILP selection for (m, b) is non-empty."""
    return sorted(int(c) for c in _selection(r, m, b)["chunk"].unique())


def _ilp_archs(r, m, b, chunk):
    sel = _selection(r, m, b)
    return sorted(sel.loc[sel["chunk"] == int(chunk), "arch"])


def ilp_place_files(r):
    return [f"{_place_dir(m, h, b, rec)}/r{r}_ilp.parquet"
            for m, b in pairs_of_round(r) if ilp_selection(r, m, b)
            for h in HBM_GIB for rec in RECOMPUTE]


def place_files_upto(r):
    files = []
    for q in range(int(r) + 1):
        files += bound_place_files(q) + ilp_place_files(q)
    return files


def schedule_files_upto(r):
    files = []
    for q in range(int(r) + 1):
        for m, b in pairs_of_round(q):
            chosen = set(ilp_selection(q, m, b))
            for t in model_tps(m):
                d = f"{RESULTS}/schedule/{m}/{tag(m, b, t)}"
                files += [f"{d}/bounds/c{c}.parquet" for c in round_chunks(q)]
                files += [f"{d}/ilp/r{q}_c{c}.parquet" for c in sorted(chosen)]
    return files


def write_list(path, files):
    """Input lists go to a file: a paper sweep's list exceeds the 128 KiB that Linux allows one
    command-line argument (the whole `bash -c` command is one)."""
    _os.makedirs(_os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("\n".join(map(str, files)) + "\n")
    return path


def last_round():
    r = 0
    while state_of(r)["continue"]:
        r += 1
    return r


checkpoint search_plan:
    input:
        SPACE,
    output:
        PLAN,
    params:
        # only what decides the plan: a rewritten chunks.parquet re-runs every estimate after it
        code=code_version("search/plan.py"),
        cfg=_json.dumps({k: SEARCH[k] for k in PLAN_KEYS}, sort_keys=True),
    log:
        f"{RESULTS}/logs/search/plan.log",
    benchmark:
        f"{RESULTS}/benchmarks/search/plan.tsv"
    shell:
        "{PHAZE} search plan --space {input} --config {CONFIG_JSON} --out {output} > {log} 2>&1"


rule schedule_bounds:
    input:
        unpack(_trace_inputs),
        latency=f"{RESULTS}/estimate/{{model}}/{TAG}/{{chunk}}.parquet",
        space=SPACE,
        plan=PLAN,
    output:
        f"{RESULTS}/schedule/{{model}}/{TAG}/bounds/c{{chunk}}.parquet",
    params:
        code=code_version("schedule"),
        cfg=config_section(config, "schedule"),
        trace=_trace_dir_of,
    log:
        f"{RESULTS}/logs/schedule/{{model}}/{TAG}/bounds/c{{chunk}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/schedule/{{model}}/{TAG}/bounds/c{{chunk}}.tsv"
    shell:
        "{PHAZE} schedule --tier bounds --trace {params.trace} --latency {input.latency}"
        " --space {input.space} --chunks {input.plan} --chunk {wildcards.chunk}"
        " --config {CONFIG_JSON} --out {output} > {log} 2>&1"


def _place_inputs(wc, kind):
    """Trace dirs and schedule files (per t) a placement job reads."""
    m, b = wc.model, int(wc.mbs)
    tps = model_tps(m)
    per_t = []
    for t in tps:
        d = f"{RESULTS}/schedule/{m}/{tag(m, b, t)}"
        if kind == "bounds":
            per_t.append([f"{d}/bounds/c{c}.parquet" for c in round_chunks(wc.round)])
        elif kind == "ilp":
            per_t.append([f"{d}/ilp/r{wc.round}_c{c}.parquet" for c in ilp_selection(wc.round, m, b)])
        else:
            per_t.append([f"{d}/blind.parquet"])
    return tps, per_t


def _place_input_files(kind):
    def fn(wc):
        tps, per_t = _place_inputs(wc, kind)
        layers = [f"{trace_dir(wc.model, wc.mbs, t)}/layers.parquet" for t in tps]
        return {"layers": layers, "schedules": [f for fs in per_t for f in fs], "space": SPACE}
    return fn


def _place_batch(kind, tiers):
    """One `phaze place` command per HBM x recompute x tier, run in one process (one job per
    model x microbatch x round: the placements are fast, interpreter start-up is not)."""
    import shlex

    def fn(wc):
        tps, per_t = _place_inputs(wc, kind)
        base = (f"place --model {wc.model} --tp {' '.join(map(str, tps))}"
                f" --trace-dirs {' '.join(trace_dir(wc.model, wc.mbs, t) for t in tps)}"
                f" --schedules {' '.join(','.join(fs) for fs in per_t)}"
                f" --microbatch {wc.mbs} --space {SPACE} --config {CONFIG_JSON}")
        cmds = []
        for h in HBM_GIB:
            for rec in RECOMPUTE:
                d = _place_dir(wc.model, h, wc.mbs, rec)
                for tier, column in tiers:
                    name = "blind" if kind == "blind" else f"r{wc.round}_{tier}"
                    cmds.append(f"{base} --hbm-gib {gib_str(h)} --recompute {rec}"
                                f" --latency-column {column} --out {d}/{name}.parquet")
        return " ".join(shlex.quote(c) for c in cmds)

    return fn


def _place_outputs(name):
    return [f"{RESULTS}/place/{{model}}/h{gib_str(h)}_b{{mbs}}_r{rec}/{name}.parquet"
            for h in HBM_GIB for rec in RECOMPUTE]


rule place_bounds:
    input:
        unpack(_place_input_files("bounds")),
    output:
        ub=_place_outputs("r{round}_ub"),
        lo=_place_outputs("r{round}_lo"),
    params:
        # place reads costmodel.link_* (pipeline transfers, all-reduce) and presets' overrides
        code=code_version("place", "arch/presets.py"),
        cfg=config_section(config, "place", "costmodel"),
        cmds=_place_batch("bounds", (("ub", "lower_bound_s"), ("lo", "makespan_s"))),
    log:
        f"{RESULTS}/logs/place/{{model}}/b{{mbs}}_r{{round}}_bounds.log",
    benchmark:
        f"{RESULTS}/benchmarks/place/{{model}}/b{{mbs}}_r{{round}}_bounds.tsv"
    shell:
        "{PHAZE} search batch {params.cmds} > {log} 2>&1"


checkpoint search_prune:
    input:
        plan=PLAN,
        place=lambda wc: place_files_upto(int(wc.round) - 1) + bound_place_files(wc.round),
    output:
        directory(f"{RESULTS}/search/r{{round}}/ilp"),
    params:
        code=SEARCH_STATE_CODE,
        cfg=SEARCH_STATE_CFG,
    log:
        f"{RESULTS}/logs/search/r{{round}}_prune.log",
    benchmark:
        f"{RESULTS}/benchmarks/search/r{{round}}_prune.tsv"
    run:
        files = write_list(f"{log}.inputs", input)
        shell(
            "{PHAZE} search prune --plan {PLAN} --round {wildcards.round} --place-list {files}"
            " --config {CONFIG_JSON} --out {output} > {log} 2>&1"
        )


def _ilp_selection_file(wc):
    return f"{checkpoints.search_prune.get(round=int(wc.round)).output[0]}/{wc.model}_b{wc.mbs}.parquet"


rule schedule_ilp:
    input:
        unpack(_trace_inputs),
        latency=f"{RESULTS}/estimate/{{model}}/{TAG}/{{chunk}}.parquet",
        space=SPACE,
        # declared so that a remote job may evaluate the `archs` param (it reads the checkpoint);
        # ancient(): its mtime alone never re-runs an ILP, the `archs` param's content does
        selection=lambda wc: ancient(_ilp_selection_file(wc)),
    output:
        f"{RESULTS}/schedule/{{model}}/{TAG}/ilp/r{{round}}_c{{chunk}}.parquet",
    params:
        code=code_version("schedule"),
        cfg=config_section(config, "schedule"),
        trace=_trace_dir_of,
        # The archs pruning selected, as a param: this job exists only once search_prune is done
        # (place_ilp asks the checkpoint), and a re-run prune that selects the same archs (say,
        # after a placement edit) does not re-run the ILPs.
        archs=lambda wc: ",".join(_ilp_archs(wc.round, wc.model, wc.mbs, wc.chunk)),
    log:
        f"{RESULTS}/logs/schedule/{{model}}/{TAG}/ilp/r{{round}}_c{{chunk}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/schedule/{{model}}/{TAG}/ilp/r{{round}}_c{{chunk}}.tsv"
    shell:
        "{PHAZE} schedule --tier ilp --trace {params.trace} --latency {input.latency}"
        " --space {input.space} --archs {params.archs} --config {CONFIG_JSON} --out {output}"
        " > {log} 2>&1"


rule place_ilp:
    input:
        unpack(_place_input_files("ilp")),
    output:
        _place_outputs("r{round}_ilp"),
    params:
        # place reads costmodel.link_* (pipeline transfers, all-reduce) and presets' overrides
        code=code_version("place", "arch/presets.py"),
        cfg=config_section(config, "place", "costmodel"),
        cmds=_place_batch("ilp", (("ilp", "makespan_s"),)),
    log:
        f"{RESULTS}/logs/place/{{model}}/b{{mbs}}_r{{round}}_ilp.log",
    benchmark:
        f"{RESULTS}/benchmarks/place/{{model}}/b{{mbs}}_r{{round}}_ilp.tsv"
    shell:
        "{PHAZE} search batch {params.cmds} > {log} 2>&1"


checkpoint search_state:
    input:
        plan=PLAN,
        place=lambda wc: place_files_upto(wc.round),
    output:
        f"{RESULTS}/search/r{{round}}/state.json",
    params:
        code=SEARCH_STATE_CODE,
        cfg=SEARCH_STATE_CFG,
    log:
        f"{RESULTS}/logs/search/r{{round}}_state.log",
    benchmark:
        f"{RESULTS}/benchmarks/search/r{{round}}_state.tsv"
    run:
        files = write_list(f"{log}.inputs", input)
        shell(
            "{PHAZE} search state --plan {PLAN} --round {wildcards.round} --place-list {files}"
            " --config {CONFIG_JSON} --out {output} > {log} 2>&1"
        )


# ---- placement-blind baseline ------------------------------------------------------------------
BLIND_MBS = min(MICROBATCHES)


def _blind_inputs(wc):
    d = trace_dir(wc.model, BLIND_MBS, 1)
    return {
        "layers": f"{d}/layers.parquet",
        "latency": f"{RESULTS}/estimate/{wc.model}/{tag(wc.model, BLIND_MBS, 1)}/space.parquet",
        "space": SPACE,
    }


rule estimate_space:
    """Latencies of the WHOLE space for one trace (the placement-blind baseline searches it all;
    one vectorised job instead of one per chunk)."""
    input:
        unpack(_trace_inputs),
        space=SPACE,
    output:
        f"{RESULTS}/estimate/{{model}}/{TAG}/space.parquet",
    params:
        code=code_version("estimate"),
        cfg=config_section(config, "costmodel"),
        trace=_trace_dir_of,
    log:
        f"{RESULTS}/logs/estimate/{{model}}/{TAG}/space.log",
    benchmark:
        f"{RESULTS}/benchmarks/estimate/{{model}}/{TAG}/space.tsv"
    shell:
        "{PHAZE} estimate --trace {params.trace} --space {input.space} --config {CONFIG_JSON}"
        " --out {output} > {log} 2>&1"


rule search_blind:
    input:
        unpack(_blind_inputs),
    output:
        f"{RESULTS}/baselines/blind/{{model}}/choice.parquet",
    params:
        code=code_version("search/baselines.py", "search/commands.py"),
        trace=lambda wc: trace_dir(wc.model, BLIND_MBS, 1),
    log:
        f"{RESULTS}/logs/search/blind_{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/search/blind_{{model}}.tsv"
    shell:
        "{PHAZE} search blind --model {wildcards.model} --trace {params.trace}"
        " --latency {input.latency} --space {input.space} --out {output} > {log} 2>&1"


rule estimate_blind:
    input:
        unpack(_trace_inputs),
        space=SPACE,
        choice=f"{RESULTS}/baselines/blind/{{model}}/choice.parquet",
    output:
        f"{RESULTS}/estimate/{{model}}/{TAG}/blind.parquet",
    params:
        code=code_version("estimate"),
        cfg=config_section(config, "costmodel"),
        trace=_trace_dir_of,
    log:
        f"{RESULTS}/logs/estimate/{{model}}/{TAG}/blind.log",
    benchmark:
        f"{RESULTS}/benchmarks/estimate/{{model}}/{TAG}/blind.tsv"
    shell:
        "{PHAZE} estimate --trace {params.trace} --space {input.space} --chunks {input.choice}"
        " --chunk 0 --config {CONFIG_JSON} --out {output} > {log} 2>&1"


rule schedule_blind:
    input:
        unpack(_trace_inputs),
        latency=f"{RESULTS}/estimate/{{model}}/{TAG}/blind.parquet",
        space=SPACE,
        choice=f"{RESULTS}/baselines/blind/{{model}}/choice.parquet",
    output:
        f"{RESULTS}/schedule/{{model}}/{TAG}/blind.parquet",
    params:
        code=code_version("schedule"),
        cfg=config_section(config, "schedule"),
        trace=_trace_dir_of,
    log:
        f"{RESULTS}/logs/schedule/{{model}}/{TAG}/blind.log",
    benchmark:
        f"{RESULTS}/benchmarks/schedule/{{model}}/{TAG}/blind.tsv"
    shell:
        "{PHAZE} schedule --tier ilp --trace {params.trace} --latency {input.latency}"
        " --space {input.space} --chunks {input.choice} --chunk 0"
        " --config {CONFIG_JSON} --out {output} > {log} 2>&1"


rule place_blind:
    input:
        unpack(_place_input_files("blind")),
    output:
        _place_outputs("blind"),
    params:
        # place reads costmodel.link_* (pipeline transfers, all-reduce) and presets' overrides
        code=code_version("place", "arch/presets.py"),
        cfg=config_section(config, "place", "costmodel"),
        cmds=_place_batch("blind", (("ilp", "makespan_s"),)),
    log:
        f"{RESULTS}/logs/place/{{model}}/b{{mbs}}_blind.log",
    benchmark:
        f"{RESULTS}/benchmarks/place/{{model}}/b{{mbs}}_blind.tsv"
    shell:
        "{PHAZE} search batch {params.cmds} > {log} 2>&1"


def blind_place_files():
    return [f"{_place_dir(m, h, b, rec)}/blind.parquet"
            for m in MODELS for b in MICROBATCHES for h in HBM_GIB for rec in RECOMPUTE]


def _summary_inputs(wc):
    r = last_round()
    return {
        "plan": PLAN,
        "space": SPACE,
        "state": f"{RESULTS}/search/r{r}/state.json",
        "place": place_files_upto(r),
        "blind_place": blind_place_files(),
        "blind": [f"{RESULTS}/baselines/blind/{m}/choice.parquet" for m in MODELS],
        "schedules": schedule_files_upto(r)
        + [f"{RESULTS}/schedule/{m}/{tag(m, b, t)}/blind.parquet"
           for m in MODELS for b in MICROBATCHES for t in model_tps(m)],
    }


SUMMARY = {name: f"{RESULTS}/summary/{name}.parquet" for name in ("best", "comparison", "explored")}


rule search_summary:
    input:
        unpack(_summary_inputs),
    output:
        **SUMMARY,
        stats=f"{RESULTS}/summary/search_stats.json",
    params:
        code=code_version("search"),
        cfg=config_section(config, "search"),
    log:
        f"{RESULTS}/logs/search/summary.log",
    benchmark:
        f"{RESULTS}/benchmarks/search/summary.tsv"
    run:
        files = write_list(f"{log}.inputs", input)
        shell(
            "{PHAZE} search summarize --plan {PLAN} --space {SPACE} --inputs-list {files}"
            " --config {CONFIG_JSON} --out-dir {RESULTS}/summary > {log} 2>&1"
        )
