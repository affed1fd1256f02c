"""The ``phaze search`` actions: file in, file out, logic in the pure modules."""

from __future__ import annotations

import argparse
import json
import math
import shlex
from pathlib import Path

import numpy as np
import pandas as pd

from phaze.arch.space import area_budget_mm2
from phaze.cli import main
from phaze.config import load_config
from phaze.errors import PhazeError
from phaze.io import read_table, write_json_atomic, write_table
from phaze.io.manifest import write_manifest
from phaze.place.inputs import check_trace_flags, trace_record, trace_shapes
from phaze.search.array_tier import run as run_tier
from phaze.search.baselines import placement_blind_choice, space_single_accelerator_latency
from phaze.search.dominance import scope_edges
from phaze.search.files import (
    check_components,
    check_memory,
    load_manifest,
    load_place,
    load_space_steps,
)
from phaze.search.plan import make_plan, n_rounds
from phaze.search.progress import jobs_cpu_seconds, progress_line, round_progress
from phaze.search.rounds import COMPONENT_COLUMNS, select, solve_selection, walk_prior_states
from phaze.search.scores import LEVEL, SearchSettings, components
from phaze.search.space_bounds import bounds_table
from phaze.search.summary import summarize as build_summary
from phaze.units import GIB
from phaze.workflow.sweep import step_manifest


def _config(args) -> dict:
    return load_config(args.config)


def baseline_presets(search_cfg: dict) -> tuple[str, ...]:
    """The presets the comparison is made against (config ``search``), computed in round 0."""
    names = (search_cfg["baseline_preset"], search_cfg["upstream_baseline_preset"])
    return tuple(dict.fromkeys(n for n in names if n))


def plan(args: argparse.Namespace) -> int:
    config = _config(args)
    cfg = config["search"]
    space = read_table(args.space, "space")
    # the rounds will hold every component: refuse a space they cannot hold before any job runs
    place = config["place"]
    axes = (config["models"], config["trace"]["microbatch"], place["hbm_gib"], place["devices"])
    check_components(len(space) * math.prod(len(a) for a in axes), "search plan")
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
        f"{n_rounds(df)} rounds of the area walk -> {args.out}"
    )
    return 0


class RoundInputs:
    """What a round decision reads: the config, the plan, and every component known (space
    bounds and placements, each placement file with its round)."""

    def __init__(self, args: argparse.Namespace):
        config = _config(args)
        self.cfg = config["search"]
        self.settings = SearchSettings.from_config(self.cfg)
        self.pinned = baseline_presets(self.cfg)
        self.plan = read_table(args.plan, "chunks")
        doc = load_manifest(args.manifest, ("space", "place"))
        if not doc["space"]:
            raise PhazeError(f"round {args.round}: no space bounds in {args.manifest}")
        check_memory(doc["space"], f"search round {args.round}")
        # the steps' text goes to the edges: the space bounds keep the columns components() reads
        self.space, self.edges = load_space_steps(doc["space"])
        self.models = sorted(self.space["model"].astype(str).unique())
        self.place = load_place(doc["place"])
        rounds = {e["path"]: e["round"] for e in doc["place"]}
        self.rounds = self.place["source"].map(rounds) if len(self.place) else pd.Series([])
        self.round = args.round

    def components(self, upto_round: int, extra_tiers: tuple[str, ...] = ()) -> pd.DataFrame:
        """Components known after the rounds before ``upto_round``, plus round ``upto_round``'s
        placements of ``extra_tiers``."""
        place = self.place
        if len(place):
            keep = (self.rounds < upto_round) | (
                (self.rounds == upto_round) & place["tier"].isin(extra_tiers)
            )
            place = place[keep.to_numpy()]
        if place.empty:
            place = pd.DataFrame(
                columns=["model", "hbm_capacity_bytes", "microbatch", "devices", "arch", "tier"]
                + ["throughput_seq_s"]
            )
        return components(place, self.settings.final_tier, self.space, self.edges)

    def release(self) -> None:
        """Drop the space bounds and the dominance steps after the last :meth:`components`:
        each holds every component of the space once more, beside the components."""
        self.space = self.edges = None


def walk_position(state_path: str | None) -> tuple[int | None, int]:
    """(visit, completed) of a round's state.json: the plan round the area walk visits in that
    round (None: none) and the plan rounds it completed before; (None, −1) before round 0."""
    if state_path is None:
        return None, -1
    try:
        doc = json.loads(Path(state_path).read_text())
        visit, completed = doc["walk_visit"], int(doc["walk_completed"])
    except FileNotFoundError:
        raise PhazeError(f"search state not found: {state_path}") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise PhazeError(f"{state_path} is not a search state: {exc}") from None
    return (None if visit is None else int(visit)), completed


def _chunked(sel: pd.DataFrame, chunk_archs: int) -> pd.DataFrame:
    """Chunk ids per (model, microbatch): at most ``chunk_archs`` archs each, archs sorted."""
    out = []
    for _, grp in sel.sort_values(COMPONENT_COLUMNS).groupby(["model", "microbatch"], sort=True):
        grp = grp.reset_index(drop=True)
        out.append(grp.assign(chunk=np.arange(len(grp)) // chunk_archs))
    if not out:
        return sel.assign(chunk=pd.Series(dtype="int64"))
    return pd.concat(out, ignore_index=True)


def manifest(args: argparse.Namespace) -> int:
    """Write the manifest of one workflow step (phaze.workflow.sweep.step_manifest)."""
    if args.step != "summary" and args.round is None:
        raise PhazeError(f"--step {args.step} needs --round")
    _write_step_manifest(args, args.step, args.out)
    return 0


def _write_step_manifest(args: argparse.Namespace, step: str, out: str) -> None:
    round_ = getattr(args, "round", None)
    write_manifest(out, step_manifest(_config(args), step, round_, getattr(args, "solve", "ilp")))


def _build_manifest(args: argparse.Namespace, step: str) -> None:
    """``--build-manifest``: the step's job writes its own manifest first, in this process."""
    if args.build_manifest:
        _write_step_manifest(args, step, args.manifest)


def select_round(args: argparse.Namespace) -> int:
    """Round r's components to refine (select.parquet) and the search's state before the round
    (state.json: the walk's and the global searches' answers so far; ``continue`` = anything
    to do)."""
    _build_manifest(args, "select")
    ri = RoundInputs(args)
    r = ri.round
    if (r > 0) != (args.previous_state is not None):
        raise PhazeError(
            "select needs --previous-state (round r-1's state.json) exactly when r > 0"
        )
    visit, completed = walk_position(args.previous_state)
    completed = visit if visit is not None else completed
    comp = ri.components(r)
    ups = scope_edges(ri.edges)
    ri.release()
    sel, pic = select(comp, ri.plan, r, ri.settings, ri.models, completed, ri.pinned, ups)
    sel = _chunked(sel, ri.cfg["chunk_archs"])
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_table(sel, out / "select.parquet", "select")
    walk = pic["walk_states"]
    progress = round_progress(comp, pic, walk, sel, r, ri.settings)
    doc = {
        "round": r,
        "continue": bool(len(sel)),
        # the area walk: the plan round it visits in this round (null: none) and those it
        # completed before (the next round's select and this round's prune read them)
        "walk_visit": pic["walk_visit"],
        "walk_completed": int(pic["walk_completed"]),
        "progress": progress,
        "walk": json.loads(walk.to_json(orient="records")),
        "global": json.loads(pic["global_states"].to_json(orient="records"))
        if "global_states" in pic
        else [],
    }
    write_json_atomic(out / "state.json", doc)
    print(progress_line({**progress, "jobs_cpu_s": jobs_cpu_seconds(args.benchmarks)}))
    print(f"phaze search select: round {r}: {len(sel)} (model, microbatch, arch) -> {out}")
    return 0


def prune(args: argparse.Namespace) -> int:
    """Which of round r's components the ILP solve ``--solve`` takes: one chunk table per
    (model, microbatch) of the round (its chunks are the round's select chunks) and
    selected.parquet."""
    _build_manifest(args, "prune")
    ri = RoundInputs(args)
    r, solve = ri.round, args.solve
    if solve == "deep" and ri.settings.final_tier != "deep":
        raise PhazeError("prune --solve deep needs search.deepen_node_limit > 0 in the config")
    if solve == "certify" and not ri.settings.certifies:
        raise PhazeError("prune --solve certify needs search.certify_split_nodes > 0 in the config")
    sel = read_table(args.select, "select")
    visit, completed = walk_position(args.state)
    prior = walk_prior_states(ri.components(r), ri.plan, completed, ri.settings, ri.models)
    # the round's tiers before this solve
    tiers = {
        "ilp": ("ub", "lo"),
        "deep": ("ub", "lo", "ilp", "ilp_ub"),
        "certify": ("ub", "lo", "ilp", "ilp_ub", "deep", "deep_ub"),
    }[solve]
    comp = ri.components(r, tiers)
    ri.release()
    cand = sel
    if solve in ("deep", "certify"):  # what the solves before it have taken
        need = LEVEL["ilp"] if solve == "deep" else ri.settings.final_level
        done = comp.loc[comp["level"] >= need, COMPONENT_COLUMNS]
        cand = sel.merge(done.drop_duplicates(), on=COMPONENT_COLUMNS)
    chosen = solve_selection(
        comp, ri.plan, ri.settings, ri.models, visit, prior, cand, solve, ri.pinned
    )
    chosen = chosen.merge(sel[COMPONENT_COLUMNS + ["chunk"]], on=COMPONENT_COLUMNS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for (m, b), _ in sel.groupby(["model", "microbatch"], sort=True):
        mine = chosen[(chosen["model"] == m) & (chosen["microbatch"] == b)]
        write_table(
            mine[["arch", "chunk"]].reset_index(drop=True), out / f"{m}_b{b}.parquet", "chunks"
        )
    write_table(chosen, out / "selected.parquet", "select")
    what = {"ilp": "ILP", "deep": "deep ILP", "certify": "the certify solve"}[solve]
    print(
        f"phaze search prune: round {r}: {what} for {len(chosen)} of {len(cand)} "
        f"(model, microbatch, arch) of the round -> {out}"
    )
    return 0


def bounds(args: argparse.Namespace) -> int:
    """The space bound of one model and microbatch: every architecture, HBM size, cluster size."""
    config = _config(args)
    _check_traces(args)
    df = bounds_table(args, config)
    write_table(df, args.out, "bounds")
    top = df["throughput_upper_seq_s"].max()
    print(
        f"phaze search bounds: {args.model} b{args.microbatch}: {df['arch'].nunique()} archs, "
        f"largest bound {top:.6g} seq/s -> {args.out}"
    )
    return 0


def _check_traces(args: argparse.Namespace) -> None:
    """The trace directories of ``bounds`` and ``tier`` were made with the model, microbatch and
    shard shapes the flags state (one line naming both values otherwise)."""
    if len(args.tp) != len(args.trace_dirs):
        raise PhazeError("--tp and --trace-dirs need one trace directory per width")
    shapes = trace_shapes(args.tp, args.ep, args.etp)
    records = {
        d: trace_record(d, read_table(Path(d) / "layers.parquet", "layers", nonempty=True))
        for d in args.trace_dirs
    }
    check_trace_flags(
        records,
        {
            "model": args.model,
            "microbatch": int(args.microbatch),
            "tp": [t for t, _, _ in shapes],
            "ep": [e for _, e, _ in shapes],
            "etp": [x for _, _, x in shapes],
        },
    )


def tier(args: argparse.Namespace) -> int:
    """The array tier of one model and microbatch (phaze.search.array_tier)."""
    config = _config(args)
    _check_traces(args)
    run_tier(args, config)
    return 0


def blind(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    trace = Path(args.trace)
    ops = read_table(trace / "ops.parquet", "ops", nonempty=True)
    layers = read_table(trace / "layers.parquet", "layers")
    check_trace_flags({args.trace: trace_record(trace, layers)}, {"model": args.model, "tp": 1})
    space = read_table(args.space, "space", nonempty=True)
    per_arch = space_single_accelerator_latency(
        ops, layers, space, config["costmodel"], config["place"]
    )
    choice = placement_blind_choice(per_arch, space)
    choice["chunk"] = 0
    choice["model"] = args.model
    write_table(choice, args.out, "chunks")
    print(
        f"phaze search blind: {args.model}: {len(per_arch)} archs, arch {choice['arch'][0]} "
        f"({choice['latency_s'][0]:.4g} s per microbatch on one accelerator) -> {args.out}"
    )
    return 0


def _ilp_counts(entries: list[dict], gap: float) -> dict:
    """ILP instances: those whose bound-tier gap (list schedule vs lower bound) exceeds the
    configured ``schedule.mip_gap`` — the ones the ILP tier must hand to the solver. Counted for the
    (model, microbatch, arch) that got the ILP tier (``solved``) and for those the search's
    bounds settled without it."""
    # (model, microbatch, arch) per ILP solve (the blind baseline's schedules are ILP-tier)
    took: dict[str, set] = {"ilp": set(), "deep": set(), "certify": set()}
    bounds = []
    for e in entries:
        # the bound tier's: a schedule table, or the array tier's layer values (phaze search tier)
        df = read_table(e["path"], None if e["tier"] == "bounds" else "schedule")
        if e["tier"] == "bounds":
            bounds.append(df.assign(model=e["model"], microbatch=e["microbatch"]))
        else:
            solve = "ilp" if e["tier"] == "blind" else e["tier"]
            took[solve].update((e["model"], e["microbatch"], a) for a in df["arch"])
    solved = avoided = deepened = 0
    if bounds:
        b = pd.concat(bounds, ignore_index=True)
        b = b.drop_duplicates(["model", "microbatch", "arch", "signature", "pass"])
        open_gap = (b["makespan_s"] - b["lower_bound_s"]) > gap * b["makespan_s"]
        keys = list(zip(b["model"], b["microbatch"], b["arch"]))
        got_ilp = pd.Series([k in took["ilp"] for k in keys], index=b.index)
        got_deep = pd.Series([k in took["deep"] for k in keys], index=b.index)
        solved = int((open_gap & got_ilp).sum())
        avoided = int((open_gap & ~got_ilp).sum())
        deepened = int((open_gap & got_deep).sum())
    return {
        "ilp_instances": solved,
        "ilp_instances_avoided_by_pruning": avoided,
        # of the solved ones, those solved again by the deep tier
        "ilp_instances_deepened": deepened,
        "archs_with_ilp": len({a for _, _, a in took["ilp"]}),
        "archs_deepened": len({a for _, _, a in took["deep"]}),
        "archs_certified": len({a for _, _, a in took["certify"]}),
    }


def _max_or_none(df: pd.DataFrame, col: str) -> float | None:
    vals = pd.to_numeric(df[col], errors="coerce") if col in df.columns else pd.Series([])
    vals = vals[vals.notna()]
    return float(vals.max()) if len(vals) else None


def summarize(args: argparse.Namespace) -> int:
    _build_manifest(args, "summary")
    config = _config(args)
    cfg = config["search"]
    settings = SearchSettings.from_config(cfg)
    plan_df = read_table(args.plan, "chunks")
    space = read_table(args.space, "space")
    kinds = ("state", "space", "place", "blind_place", "blind", "schedules")
    doc = load_manifest(args.manifest, kinds)
    if args.state is None:
        if len(doc["state"]) != 1:
            raise PhazeError(f"summarize: no --state and not one 'state' in {args.manifest}")
        args.state = doc["state"][0]["path"]
    if not doc["place"]:
        raise PhazeError(f"summarize: no placement files in {args.manifest}")
    last = max(e["round"] for e in doc["place"])
    check_memory(doc["space"], "search summary")
    place = load_place(doc["place"])
    bounds, edges = load_space_steps(doc["space"])
    blind_place = load_place(doc["blind_place"])
    blind = (
        pd.concat([read_table(e["path"]) for e in doc["blind"]], ignore_index=True)
        if doc["blind"]
        else pd.DataFrame(columns=["model", "arch"])
    )
    models = sorted(bounds["model"].astype(str).unique()) or sorted(
        place["model"].astype(str).unique()
    )
    visit, completed = walk_position(args.state)
    if visit is not None:
        raise PhazeError(f"{args.state}: the search is not done (its walk visits round {visit})")
    out = build_summary(
        plan_df,
        space,
        place,
        bounds,
        blind_place,
        blind,
        models,
        settings,
        completed,
        cfg["baseline_preset"],
        cfg["upstream_baseline_preset"],
        edges,
    )
    d = Path(args.out_dir)
    for name in ("best", "comparison", "explored", "front", "certified"):
        write_table(out[name], d / f"{name}.parquet", name)
    ex = out["explored"]
    best = out["best"]
    mine = best[best["mode"] == settings.mode] if len(best) else best
    stats = {
        "rounds_computed": last + 1,
        "archs_in_space": int((plan_df["bucket"] >= 0).sum()),
        "archs_refined": int(ex["arch"].nunique()),
        "components_in_space": len(bounds),
        "searches": out["searches"],
        # the largest certificate over the answers of the configured mode, over the whole space
        "certified_gap_max": _max_or_none(mine, "certified_gap"),
        "space_gap_max": _max_or_none(best, "space_gap"),
        "front_gap_max": _max_or_none(out["global_states"], "front_gap"),
        "no_answer": out["no_answer"],
        "settings": {
            "mode": settings.mode,
            "gap": settings.gap,
            "front_gap": settings.front_gap,
            "round_archs": settings.round_archs,
            "common_score": settings.common_score,
            "stop_rule": settings.stop_rule,
            "patience": settings.patience,
            "pruning": settings.pruning,
            "round_buckets": cfg["round_buckets"],
            "bucket_width_mm2": cfg["bucket_width_mm2"],
            "deepen_node_limit": cfg["deepen_node_limit"],
        },
        **out["counts"],
        **_ilp_counts(doc["schedules"], config["schedule"]["mip_gap"]),
    }
    write_json_atomic(d / "search_stats.json", stats)
    for rec in out["no_answer"]:
        what = rec["model"] if rec["model"] != "*" else f"Phaze-Common ({rec['common_score']})"
        print(
            f"phaze search summarize: no answer for {what} at {rec['hbm_capacity_bytes'] / GIB:g} GiB "
            f"on {rec['devices']} devices ({rec['mode']}): no placement fits any architecture"
        )
    print(json.dumps(stats, indent=1))
    return 0


def batch(args: argparse.Namespace) -> int:
    """Run each command with the phaze CLI in this process; stop at the first failure."""
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
