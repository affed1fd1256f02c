"""Bad input of every kind is exit code 2 and ONE line naming the problem — never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from phaze.cli import main
from phaze.io.tables import SCHEMAS

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
    assert "invalid float value: 'x'" in one_error_line(capsys, "place")
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
    ):
        bad.to_csv(tmp_path / "ref.csv", index=False, na_rep="nan")
        assert main(["validate", "--reference", str(tmp_path / "ref.csv")]) == 2
        assert needle in one_error_line(capsys, "validate")
