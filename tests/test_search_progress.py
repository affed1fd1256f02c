"""The per-round progress line of the search (phaze.search.progress)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from phaze.search.progress import jobs_cpu_seconds, progress_line, round_progress

BENCH_HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def test_jobs_cpu_seconds_sums_every_benchmark_file(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.tsv").write_text(
        BENCH_HEADER + "1.0\t0:00:01\t1\t1\t1\t1\t0\t0\t90\t2.5\n"
    )
    (tmp_path / "y.tsv").write_text(
        BENCH_HEADER
        + "1.0\t0:00:01\t1\t1\t1\t1\t0\t0\t90\t4.0\n"
        + "1.0\t0:00:01\t1\t1\t1\t1\t0\t0\t90\tNA\n"
    )
    (tmp_path / "being_written.tsv").write_text("")
    (tmp_path / "other.tsv").write_text("a\tb\n1\t2\n")
    assert jobs_cpu_seconds(tmp_path) == pytest.approx(6.5)
    assert jobs_cpu_seconds(tmp_path / "absent") == 0.0
    assert jobs_cpu_seconds(None) is None


def _scores():
    rows = [
        # strategy, model, microbatch, arch, ach, has_ilp, has_deep
        ("phaze-per-model", "m1", 1, "a", 10.0, True, True),
        ("phaze-per-model", "m1", 2, "a", 12.0, False, False),
        ("phaze-per-model", "m1", 1, "b", 11.0, False, False),
        ("phaze-per-model", "m2", 1, "a", np.nan, False, False),
        ("phaze-per-model", "m2", 1, "c", 3.0, True, False),
        ("phaze-common", "*", -1, "a", 99.0, True, True),
    ]
    cols = ["strategy", "model", "microbatch", "arch", "ach", "has_ilp", "has_deep"]
    return pd.DataFrame(rows, columns=cols)


def test_round_progress_counts_searches_archs_ilps_and_best():
    states = pd.DataFrame({"running": [True, False, False], "stop_bucket": [-1, 3, 4]})
    doc = round_progress(_scores(), states, round_=1, rounds_total=5)
    assert doc["round"] == 1 and doc["rounds_total"] == 5
    assert (doc["searches_running"], doc["searches_stopped"], doc["searches"]) == (1, 2, 3)
    assert doc["archs_visited"] == 3
    # (m1,1,a) and (m2,1,c) had the ILP; (m1,2,a), (m1,1,b), (m2,1,a) were settled without it
    assert (doc["ilp_solved"], doc["ilp_avoided"], doc["ilp_deepened"]) == (2, 3, 1)
    assert doc["best_throughput_seq_s"] == {"m1": 12.0, "m2": 3.0}


def test_progress_line_is_one_line_with_every_figure():
    states = pd.DataFrame({"running": [True], "stop_bucket": [-1]})
    doc = round_progress(_scores(), states, round_=0, rounds_total=2)
    line = progress_line({**doc, "jobs_cpu_s": 123.4})
    assert "\n" not in line
    assert line.startswith("phaze search: round 1/2: 1 searches running, 0/1 stopped")
    assert (
        "3 archs visited" in line
        and "ILP for 2 " in line
        and "(1 deepened)" in line
        and "3 settled by bounds" in line
    )
    assert "jobs 123 CPU-s" in line and "m1 12" in line and "m2 3" in line
    assert "jobs - CPU-s" in progress_line(doc)
