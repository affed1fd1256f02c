"""End-to-end: config/test.yaml through Snakemake in a temporary copy of the repository.

One module fixture runs the workflow, interrupting it (Ctrl-C, SIGINT to the process group) while
a `schedule` job runs and re-running it with the README's command; the tests then check the
summary tables and plots, that no truncated Parquet file was ever left under a final name, that
edits re-run exactly what depends on them (dry runs in further copies), and that the stand-alone
stage rules `schedule` and `place` run on the finished run's inputs.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from phaze.search.dominance import edges_of

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
# The flags of scripts/run.sh (the README's run command); test_run_command_flags checks they match.
RUN_FLAGS = ["--cores", "2", "--scheduler", "greedy", "--rerun-incomplete", "--printshellcmds"]
CONFIG = ["--configfile", "config/test.yaml"]
pytestmark = pytest.mark.slow


def _all_parquet_readable(root: Path) -> list[str]:
    bad = []
    for p in root.rglob("*.parquet"):
        try:
            pq.read_metadata(p)
        except Exception:  # noqa: BLE001 - any failure means a truncated/corrupt file
            bad.append(str(p))
    return bad


# A shell without job control starts background commands with SIGINT ignored, and an ignored
# signal stays ignored across exec (CI runners and `cmd &` do this): Snakemake is started through
# a one-line exec that gives SIGINT its default disposition back, as in a terminal.
DEFAULT_SIGINT = [
    sys.executable,
    "-c",
    (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    ),
]


def _interrupt_first_schedule_job(work: Path, snakemake_env) -> tuple[bool, int]:
    """Start the run and send SIGINT (what Ctrl-C in a terminal does) once a schedule job runs.
    Returns (a signal was sent, the run's exit code)."""
    with open(work / "first_run.log", "w") as log:
        proc = subprocess.Popen(
            [*DEFAULT_SIGINT, SNAKEMAKE, *RUN_FLAGS, *CONFIG],
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=snakemake_env,
        )
        interrupted = False
        deadline = time.time() + 300
        logs = work / "results" / "logs" / "schedule"
        while time.time() < deadline and proc.poll() is None:
            if logs.exists() and any(logs.rglob("*.log")):
                time.sleep(0.5)  # let the solver get going
                os.killpg(proc.pid, signal.SIGINT)
                interrupted = True
                break
            time.sleep(0.2)
        proc.wait(timeout=120)
    return interrupted, proc.returncode


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, copy_checkout, snakemake_env, snakemake):
    work = copy_checkout(tmp_path_factory.mktemp("wf") / "repo")
    interrupted, first_rc = _interrupt_first_schedule_job(work, snakemake_env)
    truncated_after_kill = _all_parquet_readable(work / "results")
    second = snakemake(work, *RUN_FLAGS, *CONFIG, timeout=900)
    (work / "second_run.log").write_text(second.stdout + second.stderr)
    return {
        "dir": work,
        "interrupted": interrupted,
        "first_rc": first_rc,
        "truncated_after_kill": truncated_after_kill,
        "second": second,
    }


def test_run_command_flags():
    text = (REPO / "scripts" / "run.sh").read_text()
    for flag in ("--rerun-incomplete",):
        assert flag in text


@pytest.mark.parametrize(
    ("args", "cores"),
    [
        ([], ["--cores", "2", "--scheduler", "greedy"]),
        (["--configfile", "config/paper.yaml"], ["--cores", "2", "--scheduler", "greedy"]),
        (["--profile", "profiles/slurm"], []),
        (["--profile=profiles/local"], []),
        (["-j", "32"], ["--scheduler", "greedy"]),
        (["-j32"], ["--scheduler", "greedy"]),
        (["--cores", "8"], ["--scheduler", "greedy"]),
        (["--scheduler", "ilp"], ["--cores", "2"]),
    ],
)
def test_run_command_leaves_parallelism_to_a_profile(tmp_path, args, cores):
    # run.sh in a scratch tree whose set-up is a no-op and whose snakemake prints its arguments
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "run.sh", tmp_path / "scripts" / "run.sh")
    (tmp_path / "scripts" / "setup.sh").write_text("exit 0\n")
    fake = tmp_path / ".venv" / "bin" / "snakemake"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PHAZE_CORES"}
    out = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "run.sh"), *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.split()
    assert out == [*cores, "--rerun-incomplete", "--printshellcmds", *args]


def test_interrupted_run_resumes_and_leaves_no_truncated_parquet(run_dir):
    assert run_dir["interrupted"], "the run finished before a schedule job started"
    assert run_dir["first_rc"] != 0
    assert run_dir["truncated_after_kill"] == []
    second = run_dir["second"]
    assert second.returncode == 0, second.stderr[-3000:]
    assert _all_parquet_readable(run_dir["dir"] / "results") == []


def test_summary_tables_and_plots_are_nontrivial(run_dir):
    assert run_dir["second"].returncode == 0
    res = run_dir["dir"] / "results"
    cmp = pd.read_parquet(res / "summary" / "comparison.parquet")
    best = pd.read_parquet(res / "summary" / "best.parquet")
    explored = pd.read_parquet(res / "summary" / "explored.parquet")
    assert set(cmp["strategy"]) == {
        "phaze-per-model",
        "phaze-common",
        "tpuv4-expert",
        "tpuv4-phaze",
        "tpuv4-upstream-expert",
        "tpuv4-upstream-phaze",
        "placement-blind",
    }
    for col in (
        "speedup_vs_tpuv4_expert",
        "speedup_vs_tpuv4_phaze",
        "speedup_vs_tpuv4_upstream_expert",
        "speedup_vs_placement_blind",
    ):
        vals = cmp[col].to_numpy(float)
        assert all(math.isfinite(v) and v > 0 for v in vals), (col, vals)
    # the searched space holds upstream's TPUv4 point (the area budget), not the faithful tpuv4,
    # which lies outside the budget: the search never loses to the former
    for (model, hbm), grp in cmp.groupby(["model", "hbm_capacity_bytes"]):
        thr = grp.set_index("strategy")["throughput_seq_s"]
        assert thr["phaze-per-model"] >= thr["tpuv4-upstream-phaze"] * (1 - 1e-12), model
        assert thr["tpuv4-phaze"] >= thr["tpuv4-expert"] * (1 - 1e-9), model
        assert thr["tpuv4-upstream-phaze"] >= thr["tpuv4-upstream-expert"] * (1 - 1e-9), model
    for hbm, grp in cmp.groupby("hbm_capacity_bytes"):
        thr = grp.pivot_table(index="model", columns="strategy", values="throughput_seq_s")
        assert thr["phaze-common"].mean() >= thr["tpuv4-upstream-phaze"].mean() * (1 - 1e-12)
    space = pd.read_parquet(res / "arch" / "space.parquet")
    faithful = set(space.loc[space["preset"] == "tpuv4", "arch"])
    plan = pd.read_parquet(res / "arch" / "chunks.parquet").set_index("arch")
    assert (plan.loc[list(faithful), "bucket"] == -1).all()
    assert not explored["arch"].isin(faithful).any()  # a baseline, never a candidate
    assert set(cmp.loc[cmp["strategy"] == "tpuv4-phaze", "arch"]) == faithful
    assert (best["throughput_seq_s"] > 0).all() and len(best) >= 2
    # every answer carries its certificate; baselines have none
    assert (best["certified_gap"] >= 0).all(), best["certified_gap"]
    searched = cmp["strategy"].isin(["phaze-per-model", "phaze-common"])
    assert cmp.loc[searched, "certified_gap"].notna().all()
    assert cmp.loc[~searched, "certified_gap"].isna().all()
    stats = json.loads((res / "summary" / "search_stats.json").read_text())
    mine = best[best["mode"] == stats["settings"]["mode"]]
    assert stats["settings"]["mode"] == "global"
    assert stats["certified_gap_max"] == pytest.approx(mine["certified_gap"].max())
    # the global answer is certified over every architecture of the space, the early stop's
    # over the buckets it visited; both over the whole space in space_gap
    assert set(best["mode"]) == {"global", "early_stop"}
    glob = best[best["mode"] == "global"]
    assert (glob["certified_gap"] == glob["space_gap"]).all()
    early = best[best["mode"] == "early_stop"]
    pm = ["strategy", "common_score", "model", "hbm_capacity_bytes", "devices"]
    both = glob.merge(early, on=pm, suffixes=("", "_early"))
    # the global answer is never beaten by the early stop's by more than its certificate
    assert (
        both["search_score"] * (1 + both["certified_gap"])
        >= both["search_score_early"] * (1 - 1e-12)
    ).all()
    # the space bound is a bound: no placement the run computed, on any schedule, beats it
    space_bounds = pd.concat(
        [pd.read_parquet(f) for f in (res / "search" / "space").rglob("*.parquet")]
    )
    placed = pd.concat(
        [pd.read_parquet(f) for f in (res / "place").rglob("r*_*.parquet") if "_ub" not in f.name]
    )
    key = ["arch", "model", "microbatch", "hbm_capacity_bytes", "devices"]
    both = placed.merge(space_bounds, on=key)
    assert (
        len(both)
        and (both["throughput_seq_s"] <= both["throughput_upper_seq_s"] * (1 + 1e-9)).all()
    ), both.loc[both["throughput_seq_s"] > both["throughput_upper_seq_s"], key]
    # ... nor the space bound of any architecture recorded as dominating it
    ups = edges_of(space_bounds)
    assert len(ups), "the test space has dominance steps"
    sb = space_bounds.rename(columns={"arch": "up", "throughput_upper_seq_s": "up_bound"})
    dom = placed.merge(ups, on=["model", "microbatch", "arch"]).merge(
        sb[["up", "model", "microbatch", "hbm_capacity_bytes", "devices", "up_bound"]],
        on=["up", "model", "microbatch", "hbm_capacity_bytes", "devices"],
    )
    assert len(dom) and (dom["throughput_seq_s"] <= dom["up_bound"] * (1 + 1e-9)).all()
    front = pd.read_parquet(res / "summary" / "front.parquet")
    certified = pd.read_parquet(res / "summary" / "certified.parquet")
    assert len(front) and (front["certified_gap"] >= 0).all()
    assert set(certified["arch"]) == set(plan.index[plan["bucket"] >= 0])
    # the deep stage (config/test.yaml deepens): it ran for the pinned tpuv4 at least, and more
    # nodes never made a placement slower nor its bound looser than the ILP tier's
    assert stats["archs_deepened"] >= 1 and stats["ilp_instances_deepened"] >= 1
    deep_files = sorted((res / "place").rglob("r*_deep.parquet"))
    assert deep_files
    for f in deep_files:
        deep = pd.read_parquet(f).set_index("arch")["throughput_seq_s"]
        ilp = pd.read_parquet(f.with_name(f.name.replace("_deep", "_ilp")))
        ilp = ilp.set_index("arch")["throughput_seq_s"].reindex(deep.index)
        assert (deep >= ilp * (1 - 1e-9)).all(), (f, deep, ilp)
        deep_ub = pd.read_parquet(f.with_name(f.name.replace("_deep", "_deep_ub")))
        ilp_ub = pd.read_parquet(f.with_name(f.name.replace("_deep", "_ilp_ub")))
        d_ub = deep_ub.set_index("arch")["throughput_seq_s"]
        i_ub = ilp_ub.set_index("arch")["throughput_seq_s"].reindex(d_ub.index)
        assert (d_ub <= i_ub * (1 + 1e-9)).all(), (f, d_ub, i_ub)
    # the placement model and the axes it chose travel with every placement
    assert set(cmp["place_model"]) == {"megatron"}
    assert set(cmp["recompute"]) <= {"none", "selective", "full"}
    assert set(cmp["ddp"]) <= {"overlap", "after"} and (cmp["interleave"] >= 1).all()
    # merged architecture columns appear once, not as pandas' _x/_y duplicates
    assert not [c for c in best.columns if c.endswith(("_x", "_y"))], list(best.columns)
    assert {"n_tc", "n_vc", "area_mm2", "peak_flops"} <= set(best.columns)
    # the search visited buckets in order; every arch of the space was computed at least by bounds
    grid = explored[explored["bucket"] >= 0]
    assert grid["bucket"].min() == 0 and explored["has_ilp"].any()
    # each round's progress line reached the Snakemake process's own output
    rounds = sorted((res / "search").glob("r*/state.json"))
    text = run_dir["second"].stdout + run_dir["second"].stderr
    printed = [ln for ln in text.splitlines() if "phaze search: round " in ln]
    assert rounds and len(printed) >= 1, text[-2000:]
    assert "archs refined" in printed[-1] and "CPU-s" in printed[-1]
    assert "certificate" in printed[-1]
    for name in ("speedup", "convergence", "area_throughput", "arch_table", "pipeline"):
        for ext in ("png", "pdf"):
            f = res / "plots" / f"{name}.{ext}"
            assert f.exists() and f.stat().st_size > 5_000, f


def test_paper_artifact_script_reads_the_run(run_dir, tmp_path):
    """benchmarks/paper.py on a finished run: every search's answer in both modes, the run's
    counts and the figures, from the summary the workflow wrote (not a hand-made one)."""
    res = run_dir["dir"] / "results"
    out = tmp_path / "artifact"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "paper.py"), "--results", str(res)]
        + ["--out", str(out), "--config", "config/test.yaml"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = json.loads((out / "run.json").read_text())
    stats = json.loads((res / "summary" / "search_stats.json").read_text())
    assert run["archs_refined"] == stats["archs_refined"] > 0
    assert run["certified_gap_max"] == stats["certified_gap_max"]
    best = pd.read_parquet(res / "summary" / "best.parquet")
    keys = ["strategy", "common_score", "model", "hbm_capacity_bytes", "devices"]
    per_search = best.fillna({"common_score": ""})
    per_search.loc[per_search["strategy"] == "phaze-common", "model"] = "*"
    assert len(run["searches"]) == len(per_search.drop_duplicates(keys)) > 0
    for row in run["searches"]:
        g, e = row["global"], row["early_stop"]
        assert row["ratio"] == pytest.approx(g["score"] / e["score"])
        # the early stop's answer is one of the architectures the global search covers
        assert g["score"] * (1 + g["certified_gap"]) >= e["score"] * (1 - 1e-12)
        assert g["archs_visited"] >= e["archs_visited"]
    for name in ("area_throughput", "speedup"):
        assert (out / f"{name}.png").stat().st_size > 10_000
    assert len(proc.stdout.strip().splitlines()) == 1 + len(run["searches"])


def _dry_run_jobs(work: Path, snakemake, *args: str) -> dict[str, int]:
    # targets first: --configfile takes every argument after it
    out = snakemake(work, *args, "-n", "--cores", "2", *CONFIG)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    if "Nothing to be done" in text:
        return {}
    block = text.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    jobs = {}
    for line in block.splitlines():
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if m and m.group(1) != "total":
            jobs[m.group(1)] = int(m.group(2))
    return jobs


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def _append_comment(path: Path) -> None:
    with open(path, "a") as fh:
        fh.write("\n# an edit that changes the code's hash\n")


# (edit, jobs a dry run must show, jobs it must not show). A dry run shows the jobs up to the
# first search checkpoint whose inputs change; what a round refines after it is decided when it
# runs (rounds whose selection is unchanged re-run only the jobs whose code or config changed).
EDITS = {
    "nothing": (
        lambda w: None,
        set(),
        {"trace", "arch", "space_bounds", "estimate_round", "search_tier"},
    ),
    "costmodel config": (
        lambda w: _edit(
            w / "config/test.yaml", "costmodel: {}", "costmodel: {glb_bandwidth_Bps: 9.0e+11}"
        ),
        {"space_bounds", "search_select"},
        {"trace", "arch"},
    ),
    "cost-model code": (
        lambda w: _append_comment(w / "phaze/estimate/model.py"),
        {"space_bounds", "search_select"},
        {"trace", "arch"},
    ),
    "schedule config": (
        lambda w: _edit(w / "config/test.yaml", "node_limit: 200\n", "node_limit: 300\n"),
        {"schedule_ilp"},
        {"trace", "arch", "space_bounds", "estimate_round", "search_tier"},
    ),
    # where earlier solutions are looked up is not what a job computes: nothing re-runs
    "schedule reuse": (
        lambda w: _edit(
            w / "config/test.yaml", "  mip_gap: 0.01\n", "  mip_gap: 0.01\n  reuse: [/tmp]\n"
        ),
        set(),
        {"trace", "arch", "space_bounds", "estimate_round", "search_tier"},
    ),
    "deep ILP limit": (
        lambda w: _edit(
            w / "config/test.yaml", "deepen_node_limit: 2000", "deepen_node_limit: 3000"
        ),
        {"search_select"},
        {"trace", "arch", "space_bounds", "estimate_round", "search_tier"},
    ),
    "placement config": (
        lambda w: _edit(w / "config/test.yaml", "optimizer: adam", "optimizer: sgd"),
        {"space_bounds", "search_select"},
        {"trace", "arch", "estimate_round"},
    ),
    "placement code": (
        lambda w: _append_comment(w / "phaze/place/dp.py"),
        {"space_bounds", "search_select"},
        {"trace", "arch", "estimate_round"},
    ),
}


@pytest.mark.parametrize("what", list(EDITS))
def test_incremental_reruns(run_dir, tmp_path, what, copy_checkout, snakemake):
    assert run_dir["second"].returncode == 0
    work = copy_checkout(tmp_path / "repo", results_from=run_dir["dir"])
    edit, must, must_not = EDITS[what]
    edit(work)
    jobs = _dry_run_jobs(work, snakemake)
    assert must <= set(jobs), (what, jobs)
    assert not (must_not & set(jobs)), (what, jobs)
    if what in ("nothing", "schedule reuse"):
        assert jobs == {}, jobs


def test_a_run_killed_after_a_prune_resumes_its_ilp_jobs_before_the_next_round(
    run_dir, tmp_path, copy_checkout, snakemake
):
    """A run stopped after round 0's ILP selection, before its ILP placements (and everything
    after): the resumed run must plan round 0's ILP jobs before round 1's select, whose inputs
    are those placements (Snakemake re-reads a job's inputs only after a checkpoint that job met
    has finished; a select that met round 0's finished prune first would run before them)."""
    assert run_dir["second"].returncode == 0
    work = copy_checkout(tmp_path / "repo", results_from=run_dir["dir"])
    res = work / "results"
    rounds = sorted(p for p in (res / "search").glob("r[0-9]*") if p.is_dir())
    assert len(rounds) >= 2, "the test config's search must take more than one round"
    # round 0's ILP-solve placements (r0_ilp, r0_ilp_ub, r0_deep, ...), not its bound tiers
    ilp = [p for p in (res / "place").rglob("r0_*.parquet") if p.stem not in ("r0_ub", "r0_lo")]
    assert ilp, "round 0 placed nothing with the ILP"
    for p in ilp:
        p.unlink()
    for d in [*rounds[1:], res / "summary", res / "search" / "r0" / "deep"]:
        shutil.rmtree(d, ignore_errors=True)
    jobs = _dry_run_jobs(work, snakemake)
    # (without the walk over each round's prunes: search_select alone, its inputs <TBD>)
    assert jobs.get("place_ilp", 0) >= 1, jobs


def test_the_run_ends_with_its_answers_and_where_they_are(run_dir):
    """The README's run prints each answer of the comparison table (phaze/report/closing.py),
    then the paths of the tables, plots and report, on stdout (Snakemake logs to stderr)."""
    second = run_dir["second"]
    assert second.returncode == 0
    cmp = pd.read_parquet(run_dir["dir"] / "results" / "summary" / "comparison.parquet")
    answers = cmp[cmp["strategy"].str.startswith("phaze-")]
    lines = second.stdout.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith("phaze: the answers")]
    rows = lines[start + 3 : start + 3 + len(answers)]
    for r in answers.itertuples():
        (line,) = [
            ln
            for ln in rows
            if ln.split()[0] == r.model
            and ("Per-Model" in ln) == (r.strategy == "phaze-per-model")
            and f" {r.hbm_capacity_bytes / 2**30:g} " in ln
        ]
        seq_s = r.throughput_seq_s
        shown = f"{seq_s:,.0f}" if seq_s >= 1000 else f"{seq_s:.4g}"
        assert r.arch in line and shown in line
        assert f"{r.speedup_vs_tpuv4_expert:.2f}" in line
    tail = lines[start + 3 + len(answers) :]
    assert tail[0].startswith("tables: results/summary/")
    assert tail[1].startswith("plots:  results/plots/ (")
    assert tail[2].startswith("report: ")


def test_a_dry_run_and_a_run_for_another_target_print_no_answers(
    run_dir, tmp_path, copy_checkout, snakemake
):
    """The closing table belongs to runs that built the summary: not to a dry run (even one
    that would rebuild it), nor to a run for another target while an older summary exists."""
    work = copy_checkout(tmp_path / "w", results_from=run_dir["dir"])
    dry = snakemake(work, *RUN_FLAGS, *CONFIG, "-n", "--forcerun", "search_summary")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "search_summary" in dry.stderr + dry.stdout
    # the target first: --configfile and --forcerun take every word after them
    one = snakemake(work, "results/arch/space.parquet", *RUN_FLAGS, *CONFIG, "--forcerun", "arch")
    assert one.returncode == 0, one.stderr[-3000:]
    assert re.search(r"^arch\s+1$", one.stderr, re.MULTILINE)  # the job stats: arch alone
    assert not re.search(r"^all\s+1$", one.stderr, re.MULTILINE)
    for out in (dry, one):
        assert "phaze: the answers" not in out.stdout + out.stderr


def test_snakemake_html_report_embeds_plots_with_captions(run_dir, snakemake):
    assert run_dir["second"].returncode == 0
    work = run_dir["dir"]
    out = snakemake(work, "--cores", "1", *CONFIG, "--report", "results/report.html")
    assert out.returncode == 0, out.stderr[-3000:]
    html = (work / "results" / "report.html").read_text(errors="replace")
    for name in (
        "speedup.png",
        "convergence.png",
        "area_throughput.png",
        "arch_table.png",
        "pipeline.png",
    ):
        assert name in html
    assert "Phaze-Per-Model" in html  # a caption from report/


def test_stand_alone_schedule_and_place_rules(run_dir, tmp_path, copy_checkout, snakemake):
    """rule schedule and rule place (one stage through Snakemake, outside the search) on a chunk
    of the finished run: only those jobs run, the ILP-tier placement of each arch lies between
    the search's list-schedule (lo) and lower-bound (ub) placements of the same arch, and equals
    the search's ILP-tier placement where the search ran the ILP. The copy reuses the finished
    run's schedule solutions (schedule.reuse): the ILP tier's context is the search's, so the
    layers and segments the search solved are taken, not solved again."""
    assert run_dir["second"].returncode == 0
    work = copy_checkout(tmp_path / "repo", results_from=run_dir["dir"])
    reuse = f"  mip_gap: 0.01\n  reuse: [{run_dir['dir'] / 'results'}]\n"
    _edit(work / "config/test.yaml", "  mip_gap: 0.01\n", reuse)
    target = "results/place/opt-350m/h32_b1/0.parquet"
    # An estimate job that the fixture's interrupt cut short can keep Snakemake's incomplete
    # marker (the resumed run reached it only behind the search_plan checkpoint, which it does
    # not re-check): --rerun-incomplete re-runs it here; nothing else may run.
    jobs = _dry_run_jobs(work, snakemake, target, "--rerun-incomplete")
    assert {k: v for k, v in jobs.items() if k != "estimate"} == {"schedule": 2, "place": 1}
    assert jobs.get("estimate", 0) <= 2, jobs
    run = snakemake(work, target, *RUN_FLAGS, *CONFIG, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    log = run.stdout + run.stderr
    ran = set(re.findall(r"^(?:local)?rule (\w+):", log, flags=re.MULTILINE))
    assert {"schedule", "place"} <= ran <= {"estimate", "schedule", "place"}, ran
    res = work / "results"
    chunk0 = set(pd.read_parquet(res / "arch" / "chunks.parquet").query("chunk == 0")["arch"])
    for tp in (1, 2):
        tag = next((res / "trace" / "opt-350m").glob(f"b1_s*_tp{tp}")).name
        sched = pd.read_parquet(res / "schedule" / "opt-350m" / tag / "0.parquet")
        assert set(sched["arch"]) == chunk0
        line = (res / "logs" / "schedule" / "opt-350m" / tag / "0.log").read_text()
        hits = re.search(r"reused (\d+) instances \(\+(\d+) segments\) of (\d+)", line)
        assert hits and int(hits.group(1)) + int(hits.group(2)) > 0, line
        assert (res / "schedule" / "opt-350m" / tag / "0.solutions.parquet").is_file()
        assert "bounds" not in set(sched["status"]), sched["status"]  # the ILP tier ran
    got = pd.read_parquet(work / target).set_index("arch")["throughput_seq_s"]
    assert set(got.index) == chunk0 and (got > 0).all()
    d = res / "place" / "opt-350m" / "h32_b1"

    def tier(name):
        frames = [pd.read_parquet(f) for f in sorted(d.glob(f"r*_{name}.parquet"))]
        return pd.concat(frames).groupby("arch")["throughput_seq_s"].max()

    lo, ub, ilp = tier("lo"), tier("ub"), tier("ilp")
    checked = [a for a in got.index if a in lo.index]
    assert checked
    for arch in checked:
        thr = got[arch]
        assert lo[arch] * (1 - 1e-12) <= thr <= ub[arch] * (1 + 1e-12), (arch, lo[arch], thr)
    # an arch the search solved by ILP (the pinned tpuv4 at least): the same placement
    both = sorted(set(ilp.index) & set(got.index))
    assert both and all(abs(got[a] - ilp[a]) <= 1e-9 * ilp[a] for a in both), (got, ilp)
