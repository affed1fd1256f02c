"""The per-round progress line of the search (phaze.search.progress)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from phaze.search.progress import jobs_cpu_seconds, progress_line, round_progress
from phaze.search.scores import SearchSettings

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


def _comp():
    """Components known: level 0 = space bound only, 1 = bound tier, 2 = ILP, 3 = deep; and
    whether the certify solve has taken them."""
    rows = [
        # model, microbatch, arch, ach, level, has_certify
        ("m1", 1, "a", 10.0, 3, True),
        ("m1", 2, "a", 12.0, 1, False),
        ("m1", 1, "b", 11.0, 1, False),
        ("m2", 1, "a", np.nan, 0, False),
        ("m2", 1, "c", 3.0, 2, False),
    ]
    cols = ["model", "microbatch", "arch", "ach", "level", "has_certify"]
    return pd.DataFrame(rows, columns=cols)


def _walk():
    return pd.DataFrame({"running": [True, False, False], "stop_bucket": [-1, 3, 4]})


def _selection():
    return pd.DataFrame({"model": ["m1", "m2"], "microbatch": [2, 1], "arch": ["d", "d"]})


def test_round_progress_counts_archs_components_and_best():
    settings = SearchSettings(mode="early_stop")
    doc = round_progress(_comp(), {}, _walk(), _selection(), 1, settings)
    assert doc["round"] == 1 and doc["mode"] == "early_stop"
    assert (doc["walk_running"], doc["walk_stopped"], doc["walk_searches"]) == (1, 2, 3)
    # refined: every component above the space bound; a, b and c (m2's a is only bounded)
    assert doc["archs_refined"] == 3 and doc["components_refined"] == 4
    assert (doc["components_ilp"], doc["components_deep"]) == (2, 1)
    assert doc["components_certified"] == 1
    assert (doc["components_this_round"], doc["archs_this_round"]) == (2, 1)
    # no global search: the best achieved value per model
    assert doc["best_throughput_seq_s"] == {"m1": 12.0, "m2": 3.0}
    assert "certified_gap_max" not in doc


def test_round_progress_takes_answers_and_certificates_from_the_global_states():
    states = pd.DataFrame(
        {
            "strategy": ["phaze-per-model", "phaze-per-model", "phaze-common"],
            "model": ["m1", "m2", "*"],
            "score": [11.5, np.nan, 0.9],
            "certified_gap": [0.02, np.nan, 0.005],
            "front_gap": [0.1, np.nan, 0.3],
            "open_gap": [2, 0, 0],
            "open_front": [0, 0, 1],
        }
    )
    doc = round_progress(
        _comp(), {"global_states": states}, _walk(), _selection(), 2, SearchSettings()
    )
    assert doc["best_throughput_seq_s"] == {"m1": 11.5, "m2": None}
    assert doc["certified_gap_max"] == pytest.approx(0.02)
    assert doc["front_gap_max"] == pytest.approx(0.3)
    assert (doc["searches_open"], doc["searches"]) == (2, 3)


def test_progress_line_is_one_line_with_every_figure():
    states = pd.DataFrame(
        {
            "strategy": ["phaze-per-model"],
            "model": ["m1"],
            "score": [12.0],
            "certified_gap": [0.0123],
            "front_gap": [np.nan],
            "open_gap": [1],
            "open_front": [0],
        }
    )
    doc = round_progress(
        _comp(), {"global_states": states}, _walk(), _selection(), 0, SearchSettings()
    )
    line = progress_line({**doc, "jobs_cpu_s": 123.4})
    assert "\n" not in line
    assert line.startswith("phaze search: round 0: refining 2 (model, microbatch, arch) of 1 archs")
    assert "so far 3 archs refined, ILP for 2 (1 deepened, 1 certified)" in line
    assert "walk 1 running, 2/3 stopped" in line
    assert "certificate 1.23 %, front -, 1/1 global searches open" in line
    assert "jobs 123 CPU-s" in line and "m1 12" in line
    assert "jobs - CPU-s" in progress_line(doc)
