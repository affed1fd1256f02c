"""phaze.workflow without Snakemake: the sweep's paths, the search rounds read from checkpoint
files, the manifests the search steps read (and that they equal the jobs' inputs), the batched
placement commands, provenance hashes; and the rule files' lint."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from phaze.cli import build_parser
from phaze.cli import main as phaze_main
from phaze.config import validate_config
from phaze.errors import PhazeError
from phaze.io.manifest import write_manifest
from phaze.search import commands
from phaze.search.files import load_manifest
from phaze.workflow import Sweep, code_version, config_section
from phaze.workflow.provenance import PACKAGE_ROOT
from phaze.workflow.sweep import parse_shard, shard_name, step_manifest

REPO = Path(__file__).resolve().parents[1]


class FakeCheckpoints:
    """Snakemake's `checkpoints` as input functions see it: NAME.get(**wildcards).output."""

    def __init__(self, root: Path):
        self.root = root
        self.search_plan = self._Checkpoint(lambda: [root / "chunks.parquet"])
        self.search_prune = self._Checkpoint(lambda round, solve: [root / f"r{round}" / solve])
        self.search_select = self._Checkpoint(
            lambda round: SimpleNamespace(
                select=root / f"r{round}" / "select.parquet",
                state=root / f"r{round}" / "state.json",
            )
        )

    class _Checkpoint:
        def __init__(self, outputs_of):
            self.outputs_of = outputs_of

        def get(self, **wc):
            out = self.outputs_of(**wc)
            paths = out if isinstance(out, list) else list(vars(out).values())
            for path in paths:
                if not path.exists():
                    raise LookupError(f"checkpoint not done: {path}")  # Snakemake: Incomplete...
            if isinstance(out, list):
                return SimpleNamespace(output=[str(p) for p in out])
            return SimpleNamespace(
                output=SimpleNamespace(**{k: str(v) for k, v in vars(out).items()})
            )


def _select(rows):
    return pd.DataFrame(rows, columns=["model", "microbatch", "arch", "chunk", "why"])


@pytest.fixture
def sweep(tmp_path):
    """Two models x two microbatches; round 0 refines every pair (opt-350m b1 in two chunks),
    round 1 one pair, round 2 nothing (the search is done)."""
    cfg = validate_config(
        {
            "models": ["opt-350m", "gpt2-xl"],
            "trace": {"microbatch": [1, 2], "tp": [1, 2, 4], "seq": {"gpt2-xl": 256}},
            "place": {"hbm_gib": [32, 80.5]},
        }
    )
    ck = FakeCheckpoints(tmp_path)
    plan = pd.DataFrame(
        {"arch": ["a", "b", "c", "d"], "round": [0, 0, 1, 1], "chunk": [0, 1, 2, 2]}
    )
    plan.to_parquet(tmp_path / "chunks.parquet")
    selects = {
        0: [
            ("opt-350m", 1, "a", 0, "gap"),
            ("opt-350m", 1, "b", 1, "walk"),
            ("opt-350m", 2, "a", 0, "gap"),
            ("gpt2-xl", 1, "b", 0, "walk"),
            ("gpt2-xl", 2, "b", 0, "walk"),
        ],
        1: [("opt-350m", 2, "d", 0, "gap")],
        2: [],
    }
    for r, rows in selects.items():
        (tmp_path / f"r{r}").mkdir()
        _select(rows).to_parquet(tmp_path / f"r{r}" / "select.parquet")
        (tmp_path / f"r{r}" / "state.json").write_text(json.dumps({"continue": bool(rows)}))
    ilp = {
        (0, "opt-350m", 1): [("a", 0), ("b", 1)],
        (0, "opt-350m", 2): [],
        (0, "gpt2-xl", 1): [("b", 0)],
        (0, "gpt2-xl", 2): [],
        (1, "opt-350m", 2): [("d", 0)],
    }
    for (r, m, b), rows in ilp.items():
        d = tmp_path / f"r{r}" / "ilp"
        d.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows, columns=["arch", "chunk"]).to_parquet(d / f"{m}_b{b}.parquet")
    return Sweep(cfg, ck)


def wc(**kw):
    return SimpleNamespace(**kw)


def test_axes_and_paths(sweep):
    assert sweep.models == ["opt-350m", "gpt2-xl"]
    assert sweep.tps("opt-350m") == [1, 2, 4] and sweep.tps("gpt2-xl") == [1]  # 25 heads
    assert sweep.tag("opt-350m", 2, "tp4") == "b2_s2048_tp4"
    assert sweep.trace_dir("gpt2-xl", 1, "tp1") == "results/trace/gpt2-xl/b1_s256_tp1"
    assert sweep.shards("opt-350m") == [(1, 1, 1), (2, 1, 2), (4, 1, 4)]  # dense: ep 1 only
    assert sweep.place_outputs("blind") == [
        f"results/place/{{model}}/h{h}_b{{mbs}}/blind.parquet" for h in ("32", "80.5")
    ]
    assert sweep.trace_dir_of(wc(model="m", mbs="1", seq="8", shard="tp2")) == (
        "results/trace/m/b1_s8_tp2"
    )
    assert (Sweep.shard_tp(wc(shard="tp2")), Sweep.shard_ep(wc(shard="tp2"))) == (2, 1)
    assert (Sweep.shard_tp(wc(shard="tp2_ep4")), Sweep.shard_ep(wc(shard="tp2_ep4"))) == (2, 4)
    assert sweep.space_bounds_file("gpt2-xl", 2) == "results/search/space/gpt2-xl/b2.parquet"
    args = build_parser().parse_args(
        ["search", "bounds", *sweep.space_bounds_args(wc(model="opt-350m", mbs="2")), "--out", "x"]
    )
    assert args.tp == [1, 2, 4] and args.microbatch == 2 and args.ep is None
    assert args.trace_dirs == [sweep.trace_dir("opt-350m", 2, f"tp{t}") for t in (1, 2, 4)]
    inputs = sweep.space_bounds_inputs(wc(model="opt-350m", mbs="2"))
    assert inputs["layers"] == [f"{d}/layers.parquet" for d in args.trace_dirs]


def test_expert_parallel_shards(tmp_path):
    """A mixture-of-experts model traces every trace.ep dividing its experts at every width, in
    its own directories (tp2_ep4); the space bound and the placement read them all with --ep; a
    dense model beside it keeps its ep-free paths and commands; no size dividing the experts is
    an error naming the model."""
    cfg = validate_config(
        {
            "models": ["mixtral-8x7b", "opt-350m"],
            "trace": {"microbatch": [1], "tp": [1, 2], "ep": [1, 3, 4]},
        }
    )
    sweep = Sweep(cfg, FakeCheckpoints(tmp_path))
    assert sweep.eps("mixtral-8x7b") == [1, 4] and sweep.eps("opt-350m") == [1]
    assert sweep.shard_names("mixtral-8x7b") == ["tp1", "tp1_ep4", "tp2", "tp2_ep4"]
    assert parse_shard("tp2_ep4") == (2, 4, 2) and parse_shard("tp8") == (8, 1, 8)
    assert all(
        parse_shard(shard_name(t, e, x)) == (t, e, x)
        for t in (1, 8)
        for e in (1, 2, 16)
        for x in {1, t}
    )
    args = build_parser().parse_args(
        [
            "search",
            "bounds",
            *sweep.space_bounds_args(wc(model="mixtral-8x7b", mbs="1")),
            "--out",
            "x",
        ]
    )
    assert list(zip(args.tp, args.ep)) == [(1, 1), (1, 4), (2, 1), (2, 4)]
    assert args.trace_dirs[1] == "results/trace/mixtral-8x7b/b1_s4096_tp1_ep4"
    dense = build_parser().parse_args(
        ["search", "bounds", *sweep.space_bounds_args(wc(model="opt-350m", mbs="1")), "--out", "x"]
    )
    assert dense.ep is None and dense.trace_dirs[0] == "results/trace/opt-350m/b1_s2048_tp1"
    bad = validate_config({"models": ["mixtral-8x7b"], "trace": {"ep": [3]}})
    with pytest.raises(PhazeError, match="mixtral-8x7b: no size of trace.ep"):
        Sweep(bad, FakeCheckpoints(tmp_path)).shards("mixtral-8x7b")


def test_whole_expert_shards(tmp_path):
    """trace.etp [tp, 1]: a mixture-of-experts model also traces whole experts at every width
    above 1 (tp2_etp1, tp2_ep4_etp1), and the space bound and the placement read them with
    --etp; at width 1 the two are one trace; a dense model keeps its paths and commands."""
    cfg = validate_config(
        {
            "models": ["mixtral-8x7b", "opt-350m"],
            "trace": {"microbatch": [1], "tp": [1, 2], "ep": [1, 4], "etp": ["tp", 1]},
        }
    )
    sweep = Sweep(cfg, FakeCheckpoints(tmp_path))
    assert sweep.shard_names("mixtral-8x7b") == [
        "tp1",
        "tp1_ep4",
        "tp2",
        "tp2_etp1",
        "tp2_ep4",
        "tp2_ep4_etp1",
    ]
    assert sweep.shard_names("opt-350m") == ["tp1", "tp2"]
    assert Sweep.shard_etp(wc(shard="tp2_ep4_etp1")) == 1 and Sweep.shard_etp(wc(shard="tp2")) == 2
    args = build_parser().parse_args(
        [
            "search",
            "bounds",
            *sweep.space_bounds_args(wc(model="mixtral-8x7b", mbs="1")),
            "--out",
            "x",
        ]
    )
    assert list(zip(args.tp, args.ep, args.etp)) == [
        (1, 1, 1),
        (1, 4, 1),
        (2, 1, 2),
        (2, 1, 1),
        (2, 4, 2),
        (2, 4, 1),
    ]
    assert args.trace_dirs[3] == "results/trace/mixtral-8x7b/b1_s4096_tp2_etp1"
    dense = build_parser().parse_args(
        ["search", "bounds", *sweep.space_bounds_args(wc(model="opt-350m", mbs="1")), "--out", "x"]
    )
    assert dense.etp is None


def test_rounds_from_the_checkpoints(sweep):
    assert (
        sweep.round_chunks(0, "opt-350m", 1) == [0, 1] and sweep.round_chunks(1, "gpt2-xl", 1) == []
    )
    assert sweep.pairs_of_round(0) == sorted(
        (m, b) for m in ("opt-350m", "gpt2-xl") for b in (1, 2)
    )
    assert sweep.pairs_of_round(1) == [("opt-350m", 2)] and sweep.pairs_of_round(2) == []
    assert sweep.last_round() == 1
    assert sweep.round_archs(wc(round="0", model="opt-350m", mbs="1", chunk="1")) == "b"
    assert sweep.ilp_chunks(0, "opt-350m", 1) == [0, 1] and sweep.ilp_chunks(0, "gpt2-xl", 2) == []
    assert (
        sweep.schedule_ilp_archs(wc(round="0", model="opt-350m", mbs="1", chunk="1", solve="ilp"))
        == "b"
    )


def test_manifests_list_exactly_the_jobs_inputs_with_their_metadata(sweep, tmp_path, monkeypatch):
    assert sweep.solves == ["ilp"]
    select1 = sweep.search_select_manifest(wc(round="1"))
    assert select1["space"] == sweep.space_records() and len(select1["space"]) == 4
    # round 0 bounds (4 pairs x 2 HBM x ub/lo) and its ILP files (2 pairs with a selection x 2
    # HBM x ilp/ilp_ub); the placement axes are inside each job
    assert len(select1["place"]) == 4 * 2 * 2 + 2 * 2 * 2
    prune1 = sweep.search_prune_manifest(wc(round="1", solve="ilp"))["place"]
    assert prune1[: len(select1["place"])] == select1["place"]
    assert {(e["round"], e["tier"]) for e in prune1} == {
        (0, "ub"),
        (0, "lo"),
        (0, "ilp"),
        (0, "ilp_ub"),
        (1, "ub"),
        (1, "lo"),
    }
    for e in prune1:
        d = sweep.place_dir(e["model"], 32 if "h32_" in e["path"] else 80.5, e["microbatch"])
        assert e["path"] == f"{d}/r{e['round']}_{e['tier']}.parquet"
    # the previous round's select and prune come first in time: a re-run checkpoint orders the
    # later ones
    s1 = sweep.search_select_inputs(wc(round="1"))
    assert s1["files"] == [e["path"] for kind in select1.values() for e in kind]
    assert s1["previous"] == "results/search/r0/state.json"
    assert s1["order"] == ["results/search/r0/ilp"]
    p1 = sweep.search_prune_inputs(wc(round="1", solve="ilp"))
    assert p1["select"] == "results/search/r1/select.parquet" and p1["order"] == []
    assert p1["state"] == "results/search/r1/state.json"
    summary = sweep.search_summary_manifest()
    assert summary["place"] == prune1 + [
        e for e in summary["place"] if (e["round"], e["tier"]) in ((1, "ilp"), (1, "ilp_ub"))
    ]
    sched = summary["schedules"]
    bounds = [e for e in sched if e["tier"] == "bounds"]
    # the array tier's layer table: one per (model, microbatch) of a round (4 in round 0, 1 in
    # round 1), every width in it
    assert [e["path"] for e in bounds] == [
        sweep.tier_layers_file(m, b, r)
        for r, m, b in [(0, "gpt2-xl", 1), (0, "gpt2-xl", 2), (0, "opt-350m", 1)]
        + [(0, "opt-350m", 2), (1, "opt-350m", 2)]
    ]
    sched = [e for e in sched if e["tier"] != "bounds"]
    ilp = [e for e in sched if e["tier"] == "ilp"]
    assert sorted({(e["model"], e["microbatch"], e["path"].rsplit("/", 1)[1]) for e in ilp}) == [
        ("gpt2-xl", 1, "r0_c0.parquet"),
        ("opt-350m", 1, "r0_c0.parquet"),
        ("opt-350m", 1, "r0_c1.parquet"),
        ("opt-350m", 2, "r1_c0.parquet"),
    ]
    assert all(
        e["path"].startswith(sweep.schedule_dir(e["model"], e["microbatch"], f"tp{e['tp']}"))
        for e in sched
    )
    assert len([e for e in sched if e["tier"] == "blind"]) == (3 + 1) * 2
    inputs = sweep.search_summary_inputs(wc())
    sched = summary["schedules"]
    assert inputs["files"] == [e["path"] for kind in summary.values() for e in kind]
    assert summary["state"] == [{"path": "results/search/r2/state.json"}]
    # what the search CLIs read back: every file exists
    monkeypatch.chdir(tmp_path)
    for e in [e for kind in summary.values() for e in kind]:
        Path(e["path"]).parent.mkdir(parents=True, exist_ok=True)
        Path(e["path"]).touch()
    path = write_manifest("m.json", summary)
    assert load_manifest(path, tuple(summary)) == summary


def test_the_deep_stage_reads_the_ilp_tier_and_feeds_the_next_round(sweep, tmp_path):
    """search.deepen_node_limit > 0: round r's deep selection reads its ILP tier, the next round
    and the summary read the deep tier, the deep jobs write r{r}_deep / r{r}_deep_ub."""
    cfg = validate_config({**sweep.config, "search": {"deepen_node_limit": 1000}})
    deep = Sweep(cfg, sweep.checkpoints)
    assert deep.solves == ["ilp", "deep"]
    for r, m, b, rows in ((0, "opt-350m", 1, [("b", 1)]), (1, "opt-350m", 2, [])):
        d = tmp_path / f"r{r}" / "deep"
        d.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows, columns=["arch", "chunk"]).to_parquet(d / f"{m}_b{b}.parquet")
    for m, b in (("opt-350m", 2), ("gpt2-xl", 1), ("gpt2-xl", 2)):
        pd.DataFrame([], columns=["arch", "chunk"]).to_parquet(
            tmp_path / "r0" / "deep" / f"{m}_b{b}.parquet"
        )
    prune0 = deep.search_prune_manifest(wc(round="0", solve="deep"))["place"]
    assert deep.search_prune_inputs(wc(round="0", solve="deep"))["order"] == [
        "results/search/r0/ilp"
    ]
    assert deep.search_select_inputs(wc(round="1"))["order"][-2:] == [
        "results/search/r0/ilp",
        "results/search/r0/deep",
    ]
    assert {(e["round"], e["tier"]) for e in prune0} == {
        (0, "ub"),
        (0, "lo"),
        (0, "ilp"),
        (0, "ilp_ub"),
    }
    select1 = deep.search_select_manifest(wc(round="1"))["place"]
    got = [e for e in select1 if e["tier"].startswith("deep")]
    assert sorted((e["model"], e["microbatch"], e["tier"]) for e in got) == sorted(
        ("opt-350m", 1, t) for t in ("deep", "deep_ub") for _ in (32, 80.5)
    )
    assert select1[: len(prune0)] == prune0
    # the ilp solve of round 1 reads round 0 with its deep tier
    assert got[0] in deep.search_prune_manifest(wc(round="1", solve="ilp"))["place"]
    sched = [e for e in deep.search_summary_manifest()["schedules"] if e["tier"] == "deep"]
    assert {e["path"] for e in sched} == {
        f"results/schedule/opt-350m/b1_s2048_tp{t}/deep/r0_c1.parquet" for t in (1, 2, 4)
    }
    w = wc(model="opt-350m", mbs="1", round="0", solve="deep")
    assert (
        deep.schedule_ilp_archs(wc(round="0", model="opt-350m", mbs="1", chunk="1", solve="deep"))
        == "b"
    )
    args = [build_parser().parse_args(shlex.split(c)) for c in deep.place_commands("ilp")(w)]
    assert sorted(a.out.rsplit("/", 1)[1] for a in args) == sorted(
        ["r0_deep.parquet", "r0_deep_ub.parquet"] * 2
    )
    files = {f for a in args for s in a.schedules for f in s.split(",")}
    assert files == set(deep.place_inputs("ilp")(w)["schedules"])
    assert all("/deep/r0_c1.parquet" in f for f in files)
    assert json.loads(deep.schedule_ilp_params(w))["search.deepen_node_limit"] == 1000
    assert (
        deep.schedule_blind_params() == deep.schedule_ilp_params(w) != sweep.schedule_blind_params()
    )


def test_the_certify_stage_follows_the_final_solve_and_leaves_the_baselines_alone(sweep, tmp_path):
    """search.certify_split_nodes > 0: a certify solve after the round's final ILP solve (ilp,
    or deep); its selection reads that solve's tiers, its jobs get the final solve's limits and
    the split's allowance and write r{r}_certify / r{r}_certify_ub; the placement-blind
    baseline keeps the final solve's settings."""
    for extra, solves in (({}, ["ilp", "certify"]), ({"deepen_node_limit": 1000}, None)):
        search = {"certify_split_nodes": 8, **extra}
        cert = Sweep(validate_config({**sweep.config, "search": search}), sweep.checkpoints)
        assert cert.solves == (solves or ["ilp", "deep", "certify"])
        assert cert.final_solve == ("deep" if extra else "ilp")
        # its selection waits for (and reads) the solves before it
        assert cert.solves_before("certify") == cert.solves[:-1]
        w = wc(model="opt-350m", mbs="1", round="0", solve="certify")
        params = json.loads(cert.schedule_ilp_params(w))
        assert params["search.certify_split_nodes"] == 8
        assert ("search.deepen_node_limit" in params) == bool(extra)
        final = wc(model="opt-350m", mbs="1", round="0", solve=cert.final_solve)
        assert cert.schedule_blind_params() == cert.schedule_ilp_params(final)
    d = tmp_path / "r0" / "certify"
    d.mkdir(parents=True, exist_ok=True)
    for m, b in (("opt-350m", 1), ("opt-350m", 2), ("gpt2-xl", 1), ("gpt2-xl", 2)):
        rows = [("b", 1)] if (m, b) == ("opt-350m", 1) else []
        pd.DataFrame(rows, columns=["arch", "chunk"]).to_parquet(d / f"{m}_b{b}.parquet")
    cfg = validate_config({**sweep.config, "search": {"certify_split_nodes": 8}})
    cert = Sweep(cfg, sweep.checkpoints)
    cmds = cert.place_commands("ilp")(wc(model="opt-350m", mbs="1", round="0", solve="certify"))
    args = [build_parser().parse_args(shlex.split(c)) for c in cmds]
    assert sorted(a.out.rsplit("/", 1)[1] for a in args) == sorted(
        ["r0_certify.parquet", "r0_certify_ub.parquet"] * 2
    )
    assert {a.latency_column for a in args} == {"makespan_s", "lower_bound_s"}


def test_a_job_builds_from_the_results_the_manifest_snakemake_gave_its_inputs(
    sweep, tmp_path, monkeypatch
):
    """`phaze search manifest` (inside the select, prune and summary jobs) reads the finished
    checkpoints' outputs under results/ and lists exactly the files the job's declared inputs
    name (Snakemake's checkpoints, here the fixture's); a missing checkpoint output is an error."""
    res = tmp_path / "results"
    (res / "arch").mkdir(parents=True)
    shutil.copy(tmp_path / "chunks.parquet", res / "arch" / "chunks.parquet")
    shutil.copytree(tmp_path / "r0", res / "search" / "r0")
    shutil.copytree(tmp_path / "r1", res / "search" / "r1")
    shutil.copytree(tmp_path / "r2", res / "search" / "r2")
    monkeypatch.chdir(tmp_path)
    cases = [
        ("select", 1, "ilp"),
        ("prune", 0, "ilp"),
        ("prune", 1, "ilp"),
        ("summary", None, "ilp"),
    ]
    for step, r, solve in cases:
        want = sweep.step_manifest(step, r, solve)
        got = step_manifest(sweep.config, step, r, solve)
        assert got == want, (step, r)
        if step == "select":
            inputs = sweep.search_select_inputs(wc(round=r))
        elif step == "prune":
            inputs = sweep.search_prune_inputs(wc(round=r, solve=solve))
        else:
            inputs = sweep.search_summary_inputs(wc())
        assert [e["path"] for kind in got.values() for e in kind] == inputs["files"]
    # through the CLI, as the rules run it
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(sweep.config))
    out = tmp_path / "m.json"
    argv = ["search", "manifest", "--step", "prune", "--round", "1", "--config", str(cfg)]
    assert phaze_main([*argv, "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == sweep.step_manifest("prune", 1)
    # the same manifest from the step's own process (the rules' --build-manifest)
    built = tmp_path / "built.json"
    step = ["search", "prune", "--plan", "p", "--round", "1", "--select", "s", "--state", "t"]
    step += ["--out", "o", "--build-manifest", "--manifest", str(built), "--config", str(cfg)]
    commands._build_manifest(build_parser().parse_args(step), "prune")
    assert built.read_text() == out.read_text()
    # a checkpoint not yet run: one line, exit 2
    shutil.rmtree(res / "search" / "r1")
    assert phaze_main([*argv, "--out", str(out)]) == 2
    with pytest.raises(PhazeError, match="checkpoint output missing"):
        step_manifest(sweep.config, "prune", 1)


@pytest.mark.parametrize(
    "change,needle",
    [
        (lambda d: d.update(extra=[]), "unknown kinds ['extra']"),
        (lambda d: d["place"][0].pop("round"), "lacks ['round']"),
        (lambda d: d["place"][0].update(tier="best"), "has tier 'best'"),
        (lambda d: d["place"][0].update(round="0"), "round must be int"),
        (lambda d: d["place"][0].update(path="nope.parquet"), "file not found: nope.parquet"),
        (lambda d: d["place"][0].update(stage="x"), "unknown keys ['stage']"),
    ],
)
def test_an_unexpected_manifest_entry_is_an_error_naming_it(tmp_path, change, needle):
    f = tmp_path / "r0_ub.parquet"
    f.touch()
    doc = {"place": [{"path": str(f), "model": "m", "microbatch": 1, "round": 0, "tier": "ub"}]}
    assert load_manifest(write_manifest(tmp_path / "ok.json", doc), ("place",)) == doc
    change(doc)
    with pytest.raises(PhazeError) as err:
        load_manifest(write_manifest(tmp_path / "bad.json", doc), ("place",))
    assert needle in str(err.value)


@pytest.mark.parametrize("kind,names", [("bounds", ["r0_ub", "r0_lo"]), ("blind", ["blind"])])
def test_placement_commands_parse_and_write_the_rules_outputs(sweep, kind, names):
    w = wc(model="opt-350m", mbs="1", round="0")
    cmds = sweep.place_commands(kind)(w)
    outputs = [
        p.format(model="opt-350m", mbs="1") for name in names for p in sweep.place_outputs(name)
    ]
    parser = build_parser()
    args = [parser.parse_args(shlex.split(c)) for c in cmds]
    assert sorted(a.out for a in args) == sorted(outputs)
    inputs = sweep.place_inputs(kind)(w)
    for a in args:
        assert a.stage == "place" and a.tp == [1, 2, 4] and a.microbatch == 1
        assert a.trace_dirs == [sweep.trace_dir("opt-350m", 1, f"tp{t}") for t in (1, 2, 4)]
        files = [f for s in a.schedules for f in s.split(",")]
        assert files == inputs["schedules"]
        assert [f"{d}/layers.parquet" for d in a.trace_dirs] == inputs["layers"]
        # no config in the command (a param): `search batch --config "$PHAZE_CONFIG"` adds it
        assert a.config is None and a.space == sweep.space
        lats = [f for x in a.latencies for f in x.split(",")]
        assert lats == inputs["latencies"]
        assert [f"{d}/ops.parquet" for d in a.trace_dirs] == inputs["ops"]
    if kind == "bounds":
        assert {a.latency_column for a in args} == {"lower_bound_s", "makespan_s"}
        ub = [a for a in args if a.out.endswith("_ub.parquet")]
        assert {a.latency_column for a in ub} == {"lower_bound_s"}


def test_the_array_tier_job_refines_every_chunk_of_a_pair_and_writes_the_bound_tables(sweep):
    w = wc(model="opt-350m", mbs="1", round="0")
    # round 0 refines opt-350m b1 in two chunks (archs a and b): one job for both
    assert sweep.search_tier_archs(w) == "a,b"
    argv = ["search", "tier", *sweep.search_tier_args(w), "--archs", sweep.search_tier_archs(w)]
    outs = {
        k: [p.format(model="opt-350m", mbs="1") for p in sweep.place_outputs(f"r0_{k}")]
        for k in ("ub", "lo")
    }
    args = build_parser().parse_args([*argv, "--ub", *outs["ub"], "--lo", *outs["lo"]])
    assert args.tp == [1, 2, 4] and args.microbatch == 1 and args.archs == "a,b"
    assert args.trace_dirs == [sweep.trace_dir("opt-350m", 1, f"tp{t}") for t in (1, 2, 4)]
    assert args.ub == outs["ub"] and len(args.lo) == 2 and args.space == sweep.space
    inputs = sweep.search_tier_inputs(w)
    assert inputs["layers"] == [f"{d}/layers.parquet" for d in args.trace_dirs]
    # the tier refuses place.model upstream: there the round keeps the per-architecture rules
    assert sweep.array_tier
    cfg = validate_config({"models": ["opt-350m"], "place": {"model": "upstream"}})
    assert not Sweep(cfg, sweep.checkpoints).array_tier


def test_stand_alone_place_arguments(sweep):
    w = wc(model="gpt2-xl", mbs="2", hbm="32", chunk="3")
    args = build_parser().parse_args(["place", *sweep.place_chunk_args(w), "--out", "x"])
    assert args.tp == [1] and args.hbm_gib == 32.0 and args.recompute is None
    assert args.schedules == ["results/schedule/gpt2-xl/b2_s256_tp1/3.parquet"]
    # the megatron model searches selective recomputation: the operators' latencies of the chunk
    assert args.latencies == ["results/estimate/gpt2-xl/b2_s256_tp1/3.parquet"]


def test_plot_outputs_mark_the_pngs_for_the_report(sweep):
    marked = sweep.report_plots_outputs(lambda path, caption, category: (path, caption, category))
    pngs = [m for m in marked if isinstance(m, tuple)]
    assert [p for p, _, _ in pngs] == [p for p in sweep.plots() if p.endswith(".png")]
    assert ("results/plots/speedup.png", "../report/speedup.rst", "Speedups") in pngs
    assert all((REPO / "report" / Path(c).name).is_file() for _, c, _ in pngs)


def test_code_version_follows_the_code_and_rejects_missing_parts(tmp_path, monkeypatch):
    import phaze.workflow.provenance as prov

    assert PACKAGE_ROOT.name == "phaze" and code_version("search") != code_version("place")
    pkg = tmp_path / "pkg"
    for part in ("io", "x"):
        (pkg / part).mkdir(parents=True)
        (pkg / part / "a.py").write_text("A = 1\n")
    for f in ("config.py", "paths.py", "errors.py", "cli.py"):
        (pkg / f).write_text("")
    monkeypatch.setattr(prov, "PACKAGE_ROOT", pkg)
    before = prov.code_version("x")
    assert prov.code_version("x") == before != prov.code_version("io")
    (pkg / "x" / "a.py").write_text("A = 2\n")
    assert prov.code_version("x") != before
    with pytest.raises(FileNotFoundError):
        prov.code_version("no_such_part")


def test_config_section_is_canonical_and_names_only_its_sections():
    a = config_section({"b": {"y": 1, "x": 2}, "a": 3, "c": 4}, "b", "a")
    assert a == json.dumps({"a": 3, "b": {"x": 2, "y": 1}}, sort_keys=True)
    with pytest.raises(KeyError):
        config_section({"a": 1}, "missing")


def test_snakemake_lint_reports_nothing(tmp_path, copy_checkout, snakemake):
    """`snakemake --lint` on the workflow (in a copy: the Snakefile writes results/.config.json):
    not one lint, and no schema-draft warning."""
    work = copy_checkout(tmp_path / "repo")
    out = snakemake(work, "--lint", timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    text = (out.stdout + out.stderr).strip()
    assert text == "Congratulations, your workflow is in a good condition!", text[-3000:]
