"""benchmarks/paper.py: every rule's benchmark file is charged to that rule, and the
/usr/bin/time report is read correctly."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("paper", REPO / "benchmarks" / "paper.py")
paper = importlib.util.module_from_spec(spec)
spec.loader.exec_module(paper)

SAMPLE = {
    "model": "gpt3-175b",
    "mbs": "2",
    "seq": "2048",
    "shard": "tp8",
    "chunk": "3",
    "round": "12",
    "tag": "b2_s2048_tp8",
    "hbm": "32",
    "solve": "deep",
}


def _rule_benchmarks(solve: str = "deep"):
    """(rule name, benchmark path relative to results/benchmarks) of every rule in rules/, with
    the ILP solves' ``{solve}`` wildcard set to ``solve``."""
    sample = {**SAMPLE, "solve": solve}
    out = []
    for smk in sorted((REPO / "rules").glob("*.smk")):
        text = smk.read_text()
        for m in re.finditer(
            r"^ *(?:rule|checkpoint) (\w+):\n(?:(?!^ *(?:rule|checkpoint) ).*\n)*?\s+benchmark:\n\s+f?\"([^\"]+)\"",
            text,
            re.MULTILINE,
        ):
            path = m.group(2).replace("{BENCH}", "results/benchmarks")
            path = re.sub(r"\{\{?(\w+)\}?\}", lambda w: sample[w.group(1)], path)
            out.append((m.group(1), Path(path).relative_to("results/benchmarks")))
    return out


@pytest.mark.parametrize("solve", ["ilp", "deep", "certify"])
def test_every_rules_benchmark_file_maps_to_its_rule(solve):
    pairs = _rule_benchmarks(solve)
    rules = {
        r
        for smk in (REPO / "rules").glob("*.smk")
        for r in re.findall(r"^ *(?:rule|checkpoint) (\w+):", smk.read_text(), re.MULTILINE)
    }
    assert {r for r, _ in pairs} == rules - {"all"}
    for rule, path in pairs:
        assert paper.rule_of(path) == rule, (rule, path)


def test_gnu_time_report(tmp_path):
    f = tmp_path / "time.txt"
    f.write_text(
        '\tCommand being timed: "bash scripts/run.sh"\n'
        "\tUser time (seconds): 7000.50\n"
        "\tSystem time (seconds): 199.50\n"
        "\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03.5\n"
        "\tMaximum resident set size (kbytes): 812345\n"
        "\tExit status: 0\n"
    )
    t = paper.gnu_time(f)
    assert t["cpu_s"] == 7200.0
    assert t["wall_s"] == 3723.5
    assert t["exit_status"] == 0


def test_search_benchmark_charges_every_rule_file_to_its_tier(tmp_path, monkeypatch):
    """benchmarks/search.py reads the same rule mapping: the deep stage's jobs count with the ILP
    tier (they were charged to the bound tier when the mapping was its own)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("search_bench", REPO / "benchmarks" / "search.py")
    search = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(search)
    root = tmp_path / "benchmarks"
    expected = {}
    for i, (rule, path) in enumerate(_rule_benchmarks(), start=1):
        f = root / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"s\tcpu_time\n1\t{i}\n")
        expected[search.tier_of(rule)] = expected.get(search.tier_of(rule), 0) + i
    cpu = search._cpu(tmp_path)
    assert dict(cpu) == expected
    # SAMPLE's stage is "deep": its schedule and place jobs are ILP-tier costs
    assert cpu["schedule_ilp"] > 0 and cpu["place_ilp"] > 0
    assert "schedule_deep" not in cpu and cpu["schedule_bounds"] > 0


def _reproduce():
    spec = importlib.util.spec_from_file_location("reproduce", REPO / "benchmarks" / "reproduce.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reproduce_refuses_a_missing_config(capsys):
    assert _reproduce().main(["--configfile", "config/no-such.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "config/no-such.yaml" in err


def test_reproduce_digests_tell_files_apart(tmp_path):
    mod = _reproduce()
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "best.parquet").write_bytes(b"same")
        (d / "search_stats.json").write_text("{}")
    assert mod.digests(a) == mod.digests(b)
    (b / "search_stats.json").write_text("{ }")
    da, db = mod.digests(a), mod.digests(b)
    assert da["best.parquet"] == db["best.parquet"]
    assert da["search_stats.json"] != db["search_stats.json"]


def _network_study():
    spec = importlib.util.spec_from_file_location(
        "network_study", REPO / "benchmarks" / "network_study.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_network_study_overlay_is_the_ici_torus_at_the_given_bandwidth():
    import yaml

    from phaze.config import validate_config

    mod = _network_study()
    top = mod.overlay(["opt-350m"], [32.0], 16e9)
    cfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    cfg["models"] = top["models"]
    cfg["place"].update(top["place"])
    net = validate_config(cfg)["place"]["network"]
    ici = yaml.safe_load((REPO / "config" / "paper-ici.yaml").read_text())["place"]["network"]
    assert net["link"]["bandwidth_Bps"] == 16e9
    assert {k: v for k, v in net.items() if k != "link"} == {
        k: v for k, v in ici.items() if k != "link"
    }
    assert net["link"]["latency_s"] == ici["link"]["latency_s"]
    assert "schedule" not in top  # the first point reuses nothing
    later = mod.overlay(["opt-350m"], [32.0], 45e9, [REPO / "results", REPO / "results"])
    cfg["schedule"] = later["schedule"]
    assert validate_config(cfg)["schedule"]["reuse"] == [str((REPO / "results").resolve())]


def test_network_study_collates_every_point_model_and_strategy(tmp_path):
    import pandas as pd

    mod = _network_study()
    points = {}
    for gbps in (4.0, 45.0):
        d = tmp_path / f"p{gbps:g}" / "summary"
        d.mkdir(parents=True)
        rows = []
        for model in ("m1", "m2"):
            for strategy in ("phaze-per-model", "tpuv4-phaze", "tpuv4-expert", "placement-blind"):
                for devices in (512, 1024):
                    rows.append(
                        {c: 1 for c in mod.COLUMNS if c not in ("link_GBps", "model", "strategy")}
                        | {"model": model, "strategy": strategy, "devices": devices}
                        | {"throughput_seq_s": gbps * devices + (strategy == "tpuv4-phaze")}
                    )
        pd.DataFrame(rows).to_parquet(d / "comparison.parquet")
        points[gbps] = d
    table = mod.collate(points)
    assert len(table) == 2 * 2 * 3  # points x models x drawn strategies, largest cluster only
    assert set(table["strategy"]) == set(mod.STRATEGIES)
    assert (table["throughput_seq_s"] >= 4.0 * 1024).all()
    fig = mod.figure(table, 4.29)
    assert len(fig.axes) == 2 and all(len(ax.lines) == 4 for ax in fig.axes)


def test_network_study_seeds_a_point_from_a_run_but_its_summary(tmp_path):
    import os

    mod = _network_study()
    run = tmp_path / "run"
    for rel in ("results/schedule/m/a.parquet", "results/summary/best.parquet", "results/x.txt"):
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(rel)
        os.utime(run / rel, (1e9, 1e9))
    meta = run / ".snakemake" / "metadata"
    meta.mkdir(parents=True)
    (meta / "key").write_text("{}")
    (run / ".snakemake" / "incomplete").mkdir()
    dest = tmp_path / "point"
    dest.mkdir()
    mod.seed(run, dest)
    assert (dest / "results/schedule/m/a.parquet").read_text() == "results/schedule/m/a.parquet"
    assert (dest / "results/schedule/m/a.parquet").stat().st_mtime == 1e9  # Snakemake's clock
    assert (dest / "results/x.txt").is_file()
    assert not (dest / "results/summary").exists()  # the point's own summary marks it done
    assert (dest / ".snakemake/metadata/key").is_file()
    assert not (dest / ".snakemake/incomplete").exists()
    with pytest.raises(SystemExit, match="no finished run"):
        mod.seed(tmp_path / "nothing", tmp_path / "p2")
