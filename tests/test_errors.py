"""Bad input of every kind is exit code 2 and ONE line naming the problem — never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from phaze.cli import main
from phaze.io.tables import SCHEMAS, write_table
from tests.test_place_tables import PEAK, layers_frame, run_place, schedule_frame

DATA = Path(__file__).parent / "data"
TEST_CONFIG = str(Path(__file__).parents[1] / "config" / "test.yaml")


def one_error_line(capsys, stage: str) -> str:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"phaze {stage}: error: "), err
    return err[0]


def test_output_that_is_a_directory_or_under_a_file(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out, needle in ((tmp_path, "is a directory"), (blocker / "s.parquet", "is a file")):
        assert main(["arch", "--config", TEST_CONFIG, "--out", str(out)]) == 2
        assert needle in one_error_line(capsys, "arch")
    argv = ["trace", "--model", str(DATA / "tiny-gpt2"), "--microbatch", "1", "--seq", "8"]
    assert main([*argv, "--no-verify", "--out", str(blocker)]) == 2
    assert "is a file" in one_error_line(capsys, "trace")


def test_report_on_empty_summaries_or_a_file_as_out_dir(tmp_path, capsys):
    for name in ("best", "comparison", "explored"):
        pq.write_table(SCHEMAS[name].empty_table(), tmp_path / f"{name}.parquet")
    assert main(["report", "--summary", str(tmp_path), "--out-dir", str(tmp_path / "p")]) == 2
    assert "has no rows" in one_error_line(capsys, "report")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["report", "--summary", str(tmp_path), "--out-dir", str(blocker)]) == 2
    one_error_line(capsys, "report")


def test_usage_errors_are_one_line(capsys):
    assert main(["place", "--hbm-gib", "x"]) == 2
    assert "--hbm-gib: expected a number, got 'x'" in one_error_line(capsys, "place")
    assert main(["search", "no-such-action"]) == 2
    assert "invalid choice" in one_error_line(capsys, "search")


def test_multi_line_library_messages_become_one_line(tmp_path, capsys):
    cfg = json.loads((DATA / "tiny-gpt2" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "n_embd": float("nan")}))
    argv = ["trace", "--model", str(tmp_path), "--microbatch", "1", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "n_embd" in one_error_line(capsys, "trace")


@pytest.mark.parametrize("n_layer", [0, -2, 2.5, "2"])
def test_evaluate_hf_config_with_bad_layer_count(tmp_path, capsys, n_layer):
    cfg = json.loads((DATA / "tiny-gpt2" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "n_layer": n_layer}))
    argv = ["evaluate", "--hf-config", str(tmp_path / "config.json"), "--arch", "a100-80gb"]
    argv += ["--devices", "8", "--tp", "1", "--pp", "1", "--microbatch", "1", "--global-batch", "8"]
    assert main(argv) == 2
    line = one_error_line(capsys, "evaluate")
    assert "num_hidden_layers must be >= 1" in line or "Field 'n_layer' expected int" in line


def test_validate_with_a_nan_or_repeated_reference_row(tmp_path, capsys):
    from phaze.fidelity.validate import REFERENCE

    ref = pd.read_csv(REFERENCE, comment="#").iloc[:2]
    for bad, needle in (
        (ref.assign(achieved_tflops_per_gpu=[137.0, float("nan")]), "must be finite and > 0"),
        (pd.concat([ref.iloc[:1], ref.iloc[:1]]), "repeats the run of row 1"),
        (ref.assign(gpus=[32, 0]), "gpus must be >= 1"),
        (ref.drop(columns="achieved_tflops_per_gpu"), "needs exactly one of the columns"),
        (ref.assign(mfu_percent=[40.0, 41.0]), "needs exactly one of the columns"),
        (
            ref.drop(columns="achieved_tflops_per_gpu").assign(mfu_percent=[40.0, 120.0]),
            "mfu_percent must be <= 100",
        ),
        (ref.assign(recompute=["full", "partial"]), "recompute must be full, selective or none"),
        (ref.assign(sequence_parallel=["0", "yes"]), "sequence_parallel must be 0 or 1"),
    ):
        bad.to_csv(tmp_path / "ref.csv", index=False, na_rep="nan")
        assert main(["validate", "--reference", str(tmp_path / "ref.csv")]) == 2
        assert needle in one_error_line(capsys, "validate")


# --- placement: silent wrong answers -----------------------------------------------------------
@pytest.fixture
def place_inputs(tmp_path, space_table):
    """test_place_tables' two-tp inputs (layers, schedules, space, config) in tmp_path."""
    args = {"trace": [], "sched": []}
    for t in (1, 2):
        write_table(layers_frame(t), tmp_path / f"trace_t{t}" / "layers.parquet", "layers")
        write_table(schedule_frame(t), tmp_path / f"sched_t{t}.parquet", "schedule")
        args["trace"].append(str(tmp_path / f"trace_t{t}"))
        args["sched"].append(str(tmp_path / f"sched_t{t}.parquet"))
    space = space_table(list(PEAK), peak_flops=list(PEAK.values()), preset="")
    write_table(space, tmp_path / "space.parquet", "space")
    # selective recomputation would need the ops and operator latencies too
    place = {"devices": [16], "global_batch": 256, "recompute": ["none", "full"]}
    cfg = {"models": ["tiny"], "place": place}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    return tmp_path, args


def test_place_instance_with_a_nan_latency(tmp_path, capsys):
    ins = json.loads((DATA / "place_upstream_reference.json").read_text())["cases"][2]["instance"]
    ins["nodes"]["1"][0]["optimalLatencyFw"] = float("nan")
    (tmp_path / "i.json").write_text(json.dumps(ins))
    assert main(["place", "--instance", str(tmp_path / "i.json")]) == 2
    assert "optimalLatencyFw must be finite" in one_error_line(capsys, "place")


@pytest.mark.parametrize("hbm", ["nan", "inf", "1e400", "-1", "0"])
def test_place_hbm_gib_must_be_finite_and_positive(place_inputs, capsys, hbm):
    tmp_path, args = place_inputs
    assert run_place(tmp_path, args, hbm=hbm) == 2
    line = one_error_line(capsys, "place")  # nan, inf, 1e400: a usage error already
    assert "--hbm-gib" in line and "finite number" in line
    assert not (tmp_path / "place.parquet").exists()


def test_place_schedule_rows_repeated_in_a_file_or_across_chunk_files(place_inputs, capsys):
    tmp_path, args = place_inputs
    sched = pd.read_parquet(args["sched"][1])
    pd.concat([sched, sched.iloc[[3]]]).to_parquet(tmp_path / "dup.parquet", index=False)
    bad = {**args, "sched": [args["sched"][0], str(tmp_path / "dup.parquet")]}
    assert run_place(tmp_path, bad) == 2
    assert "rows repeat the key" in one_error_line(capsys, "place")
    twice = {**args, "sched": [args["sched"][0], f"{args['sched'][1]},{args['sched'][1]}"]}
    assert run_place(tmp_path, twice) == 2
    assert "schedules for tp=2" in one_error_line(capsys, "place")


def test_place_tp_flag_must_match_the_trace(place_inputs, capsys):
    tmp_path, args = place_inputs
    # the trace directories as `phaze trace` writes them: layers carry their tp
    for t, d in zip((1, 2), args["trace"]):
        pd.DataFrame(layers_frame(t)).assign(tp=t).to_parquet(f"{d}/layers.parquet", index=False)
    assert run_place(tmp_path, args) == 0
    swapped = {**args, "trace": args["trace"][::-1]}
    assert run_place(tmp_path, swapped) == 2
    assert "--tp 1 but" in one_error_line(capsys, "place")


def test_search_batch_with_an_unbalanced_quote(capsys):
    assert main(["search", "batch", "place --model 'x"]) == 2
    assert "cannot be parsed: No closing quotation" in one_error_line(capsys, "search")


# --- the config ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,needle",
    [
        ("place: {hbm_gib: [.nan]}", "place/hbm_gib/0: NaN and infinite numbers are not allowed"),
        ("schedule: {time_limit_s: .inf}", "schedule/time_limit_s: NaN and infinite"),
        ("models: [opt-350m, opt-350m]", "has non-unique elements"),
        ("trace: {microbatch: [1, 1]}", "has non-unique elements"),
        ("trace: {microbatch: [8192]}", "global_batch 4096 is not a multiple of trace.microbatch"),
        ("arch: {presets: [no-such-chip]}", "unknown preset 'no-such-chip'"),
        ("search: {baseline_preset: nope}", "search.baseline_preset: unknown preset 'nope'"),
    ],
)
def test_config_values_the_schema_alone_would_accept(tmp_path, capsys, text, needle):
    (tmp_path / "c.yaml").write_text(text)
    assert main(["arch", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "s")]) == 2
    assert needle in one_error_line(capsys, "arch")


def test_malformed_json_config_is_reported_as_json(tmp_path, capsys):
    (tmp_path / "c.json").write_text('{"arch": {"n_tc": [4,}')
    assert main(["arch", "--config", str(tmp_path / "c.json"), "--out", str(tmp_path / "s")]) == 2
    assert "is not valid JSON" in one_error_line(capsys, "arch")


@pytest.mark.parametrize(
    "change,needle",
    [
        (lambda s: s.assign(n_tc=[0, 64, 1]), "'n_tc' must be finite and >= 1 (row 0"),
        (lambda s: s.assign(n_tc=[-8, 64, 1]), "'n_tc' must be finite and >= 1"),
        (lambda s: s.assign(freq_hz=[float("nan"), 1.05e9, 2e9]), "'freq_hz' must be finite"),
        (lambda s: pd.concat([s, s.iloc[[1]]]), "2 rows repeat the key {'arch': 'b'}"),
    ],
)
def test_estimate_rejects_bad_architecture_rows(tmp_path, capsys, change, needle):
    from tests.test_estimate import fixture_ops, small_space

    write_table(fixture_ops(), tmp_path / "trace" / "ops.parquet", "ops")
    change(small_space()).to_parquet(tmp_path / "space.parquet", index=False)
    argv = [
        "estimate",
        "--trace",
        str(tmp_path / "trace"),
        "--space",
        str(tmp_path / "space.parquet"),
    ]
    assert main([*argv, "--out", str(tmp_path / "lat.parquet")]) == 2
    assert needle in one_error_line(capsys, "estimate")
    assert not (tmp_path / "lat.parquet").exists()
