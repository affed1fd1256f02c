"""The ``phaze search`` actions: file in, file out, logic in the pure modules."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from phaze.config import load_config
from phaze.errors import PhazeError
from phaze.io import read_table, write_json_atomic, write_table
from phaze.search.files import load_manifest, load_place
from phaze.search.plan import make_plan, n_rounds
from phaze.search.progress import jobs_cpu_seconds, progress_line, round_progress
from phaze.search.scores import (
    SearchSettings,
    all_scores,
    components,
    ilp_requests,
    needed_pairs,
    search_states,
    select_for_ilp,
)


def _config(args) -> dict:
    return load_config(args.config)


def baseline_presets(search_cfg: dict) -> tuple[str, ...]:
    """The presets the comparison is made against (config ``search``), computed in round 0."""
    names = (search_cfg["baseline_preset"], search_cfg["upstream_baseline_preset"])
    return tuple(dict.fromkeys(n for n in names if n))


def _pairs(place: pd.DataFrame) -> list[tuple[str, int]]:
    return sorted({(str(m), int(b)) for m, b in zip(place["model"], place["microbatch"])})


def _scores(place: pd.DataFrame, settings: SearchSettings) -> pd.DataFrame:
    models = sorted(place["model"].astype(str).unique())
    return all_scores(components(place, settings.final_tier), models)


def plan(args: argparse.Namespace) -> int:
    from phaze.arch.space import area_budget_mm2

    config = _config(args)
    cfg = config["search"]
    space = read_table(args.space, "space")
    df = make_plan(
        space,
        cfg["bucket_width_mm2"],
        cfg["round_buckets"],
        cfg["chunk_archs"],
        baseline_presets(cfg),
        area_budget_mm2(config["arch"]),
    )
    write_table(df, args.out, "chunks")
    print(
        f"phaze search plan: {len(df)} archs, {df['bucket'].max() + 1} buckets, "
        f"{n_rounds(df)} rounds, {df['chunk'].max() + 1} chunks -> {args.out}"
    )
    return 0


def _load_round_inputs(args):
    cfg = _config(args)["search"]
    settings = SearchSettings.from_config(cfg)
    plan_df = read_table(args.plan, "chunks")
    entries = load_manifest(args.manifest, ("place",))["place"]
    if not entries:
        raise PhazeError(f"round {args.round}: no placement files in {args.manifest}")
    place = load_place(entries)
    round_of = {e["path"]: e["round"] for e in entries}
    return cfg, settings, plan_df, place, place["source"].map(round_of)


def prune(args: argparse.Namespace) -> int:
    cfg, settings, plan_df, place, rounds = _load_round_inputs(args)
    r = args.round
    stage = args.stage
    if stage == "deep" and settings.final_tier != "deep":
        raise PhazeError("prune --stage deep needs search.deepen_node_limit > 0 in the config")
    # States after the previous round, recomputed from the same files (deterministic).
    earlier = place[rounds < r]
    prior = search_states(_scores(earlier, settings), plan_df, r - 1, settings) if r > 0 else None
    scores = _scores(place, settings)
    selected = select_for_ilp(scores, plan_df, r, settings, prior)
    current = place[rounds == r]
    pairs = _pairs(current)
    requests = ilp_requests(selected, plan_df, r, pairs, baseline_presets(cfg))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for m, b in pairs:
        sub = requests[(requests["model"] == m) & (requests["microbatch"] == b)]
        write_table(
            sub[["arch", "chunk"]].reset_index(drop=True), out / f"{m}_b{b}.parquet", "chunks"
        )
    selected.astype({"hi": float, "threshold": float}).to_parquet(out / "selected.parquet.tmp")
    (out / "selected.parquet.tmp").replace(out / "selected.parquet")
    # the candidates: every (model, microbatch, arch) of the round, or those the ILP tier solved
    computed = place[(rounds == r) & (place["tier"] == ("ub" if stage == "ilp" else "ilp"))]
    n_total = len(computed[["model", "microbatch", "arch"]].drop_duplicates())
    what = "ILP" if stage == "ilp" else "deep ILP"
    print(
        f"phaze search prune: round {r}: {what} for {len(requests)} of {n_total} "
        f"(model, microbatch, arch) in this round -> {out}"
    )
    return 0


def state(args: argparse.Namespace) -> int:
    _cfg, settings, plan_df, place, _rounds = _load_round_inputs(args)
    r = args.round
    scores = _scores(place, settings)
    states = search_states(scores, plan_df, r, settings)
    pairs = _pairs(place)
    need = needed_pairs(states, pairs)
    more = r + 1 < n_rounds(plan_df)
    doc = {
        "round": r,
        "continue": bool(more and need),
        "needed": [[m, b] for m, b in need] if more else [],
        "rounds_total": n_rounds(plan_df),
        "searches": json.loads(states.to_json(orient="records")),
    }
    progress = round_progress(scores, states, r, doc["rounds_total"])
    # the state file stays a function of the results; the CPU so far goes to the log only
    doc["progress"] = progress
    write_json_atomic(args.out, doc)
    print(progress_line({**progress, "jobs_cpu_s": jobs_cpu_seconds(args.benchmarks)}))
    print(f"phaze search state: continue={doc['continue']} -> {args.out}")
    return 0


def blind(args: argparse.Namespace) -> int:
    from phaze.search.baselines import placement_blind_choice

    layers = read_table(Path(args.trace) / "layers.parquet", "layers")
    latency = pd.concat([read_table(p, "latency") for p in args.latency], ignore_index=True)
    space = read_table(args.space, "space")
    choice = placement_blind_choice(latency, layers, space)
    choice["chunk"] = 0
    choice["model"] = args.model
    write_table(choice, args.out, "chunks")
    print(
        f"phaze search blind: {args.model}: arch {choice['arch'][0]} "
        f"({choice['latency_s'][0]:.4g} s per microbatch on one accelerator) -> {args.out}"
    )
    return 0


def _ilp_counts(entries: list[dict], gap: float) -> dict:
    """ILP instances: those whose bound-tier gap (list schedule vs lower bound) exceeds the
    configured ``schedule.gap`` — the ones the ILP tier must hand to the solver. Counted for the
    (model, microbatch, arch) that got the ILP tier (``solved``) and for those pruning skipped."""
    ilp_archs, deep_archs, bounds = set(), set(), []
    for e in entries:
        df = read_table(e["path"], "schedule")
        if e["tier"] in ("ilp", "blind"):
            ilp_archs.update((e["model"], e["microbatch"], a) for a in df["arch"])
        elif e["tier"] == "deep":
            deep_archs.update((e["model"], e["microbatch"], a) for a in df["arch"])
        else:
            bounds.append(df.assign(model=e["model"], microbatch=e["microbatch"]))
    solved = avoided = deepened = 0
    if bounds:
        b = pd.concat(bounds, ignore_index=True)
        open_gap = (b["makespan_s"] - b["lower_bound_s"]) > gap * b["makespan_s"]
        keys = list(zip(b["model"], b["microbatch"], b["arch"]))
        got_ilp = pd.Series([k in ilp_archs for k in keys], index=b.index)
        got_deep = pd.Series([k in deep_archs for k in keys], index=b.index)
        solved = int((open_gap & got_ilp).sum())
        avoided = int((open_gap & ~got_ilp).sum())
        deepened = int((open_gap & got_deep).sum())
    return {
        "ilp_instances": solved,
        "ilp_instances_avoided_by_pruning": avoided,
        # of the solved ones, those solved again by the deep tier
        "ilp_instances_deepened": deepened,
        "archs_with_ilp": len({a for _, _, a in ilp_archs}),
        "archs_deepened": len({a for _, _, a in deep_archs}),
    }


def _max_or_none(df: pd.DataFrame, col: str) -> float | None:
    vals = pd.to_numeric(df[col], errors="coerce") if col in df.columns else pd.Series([])
    vals = vals[vals.notna()]
    return float(vals.max()) if len(vals) else None


def summarize(args: argparse.Namespace) -> int:
    from phaze.search.summary import summarize as build

    config = _config(args)
    cfg = config["search"]
    settings = SearchSettings.from_config(cfg)
    plan_df = read_table(args.plan, "chunks")
    space = read_table(args.space, "space")
    doc = load_manifest(args.manifest, ("place", "blind_place", "blind", "schedules"))
    if not doc["place"]:
        raise PhazeError(f"summarize: no placement files in {args.manifest}")
    last = max(e["round"] for e in doc["place"])
    place = load_place(doc["place"])
    blind_place = load_place(doc["blind_place"])
    blind = (
        pd.concat([read_table(e["path"]) for e in doc["blind"]], ignore_index=True)
        if doc["blind"]
        else pd.DataFrame(columns=["model", "arch"])
    )
    models = sorted(place["model"].astype(str).unique())
    out = build(
        plan_df,
        space,
        place,
        blind_place,
        blind,
        models,
        settings,
        last,
        cfg["baseline_preset"],
        cfg["upstream_baseline_preset"],
    )
    d = Path(args.out_dir)
    write_table(out["best"], d / "best.parquet", "best")
    write_table(out["comparison"], d / "comparison.parquet", "comparison")
    write_table(out["explored"], d / "explored.parquet", "explored")
    ex = out["explored"]
    stats = {
        "rounds_computed": last + 1,
        "rounds_total": n_rounds(plan_df),
        "archs_in_space": len(plan_df),
        "archs_computed": int(ex["arch"].nunique()),
        "searches": len(out["states"]),
        "searches_stopped_early": int((out["states"]["stop_bucket"] >= 0).sum()),
        # the largest certificate over the answers (phaze.search.scores.certified_gap)
        "certified_gap_max": _max_or_none(out["best"], "certified_gap"),
        "settings": {
            "mode": settings.mode,
            "stop_rule": settings.stop_rule,
            "patience": settings.patience,
            "pruning": settings.pruning,
            "round_buckets": cfg["round_buckets"],
            "bucket_width_mm2": cfg["bucket_width_mm2"],
            "deepen_node_limit": cfg["deepen_node_limit"],
        },
        **_ilp_counts(doc["schedules"], config["schedule"]["gap"]),
    }
    write_json_atomic(d / "search_stats.json", stats)
    print(json.dumps(stats, indent=1))
    return 0


def batch(args: argparse.Namespace) -> int:
    """Run each command with the phaze CLI in this process; stop at the first failure."""
    import shlex

    from phaze.cli import main

    commands = []
    for i, cmd in enumerate(args.commands, 1):
        try:
            argv = shlex.split(cmd)
        except ValueError as exc:  # an unbalanced quote
            raise PhazeError(f"command {i} of the batch cannot be parsed: {exc}: {cmd!r}") from exc
        if not argv:
            raise PhazeError(f"command {i} of the batch is empty")
        if argv[0] == "search" and len(argv) > 1 and argv[1] == "batch":
            raise PhazeError("search batch cannot nest itself")
        if args.config and "--config" not in argv:
            argv += ["--config", args.config]
        commands.append(argv)
    for argv in commands:  # every command parses before the first runs
        rc = main(argv)
        if rc:
            return rc
    return 0
