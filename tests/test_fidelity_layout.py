"""An uneven pipeline split stated in a table of runs (Megatron-LM's layout syntax): parsed, priced,
and refused with one line when it does not fit the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from phaze.errors import PhazeError
from phaze.fidelity.validate import read_runs, run_strategy
from phaze.step.megatron_args import megatron_arguments, parse_pipeline_layout
from phaze.step.strategy import Strategy

DATA = Path(__file__).resolve().parents[1] / "phaze" / "fidelity" / "data"


def test_the_published_layouts_give_the_hand_counted_blocks_per_rank():
    """DeepSeek-V3's Et|(tt|)*30mL over pp 8 x vp 4: chunk 0 holds block 0, chunk 1 blocks 1-2,
    all three dense and folded into the first layer, so rank 0 keeps chunks 8, 16, 24 (2 MoE
    blocks each: 6), rank 1 chunks 9, 17, 25 (6), ranks 2-6 four chunks of 2 (8), rank 7
    chunks 7, 15, 23 and the empty 31 (6): 6+6+5·8+6 = 58 MoE blocks. Qwen3-235B-A22B's
    Et*2|(t*3|)*30t*2L: ranks 0 and 7 hold 2+3+3+3 = 11, the others 12: 2·11+6·12 = 94."""
    dsv3 = parse_pipeline_layout("Et|(tt|)*30mL", 8, 4, 58, 3)
    assert dsv3 == (0, 0) + (2,) * 29 + (0,)
    s = Strategy(1024, 2, 8, 1, 8192, interleave=4, ep=64, chunks=dsv3, sequence_parallel=True)
    assert s.check_layers(58) == (6, 6, 8, 8, 8, 8, 8, 6)
    qwen = parse_pipeline_layout("Et*2|(t*3|)*30t*2L", 8, 4, 94)
    assert qwen == (2,) + (3,) * 30 + (2,)
    s = Strategy(256, 2, 8, 1, 8192, interleave=4, chunks=qwen)
    assert s.check_layers(94) == (11, 12, 12, 12, 12, 12, 12, 11)
    # commas and spaces are ignored, as Megatron-LM ignores them
    assert parse_pipeline_layout("E t,t|t*3 L", 2, 1, 5) == (2, 3)


def test_the_table_rows_carry_their_layout_into_the_priced_strategy():
    """The FP8 table's DeepSeek-V3 and Qwen3-235B-A22B rows reach the step model with the
    per-rank blocks above and whole experts (etp 1); Megatron's arguments for that strategy
    give the layout back (without the folded dense blocks and the unpriced m)."""
    rows = {r["model"]: r for r in read_runs(DATA / "h100_published_fp8.csv")}
    dsv3 = run_strategy(rows["deepseek-v3"])
    assert dsv3.check_layers(58) == (6, 6, 8, 8, 8, 8, 8, 6) and dsv3.etp == 1
    qwen = run_strategy(rows["qwen3-235b-a22b"])
    assert qwen.check_layers(94) == (11, 12, 12, 12, 12, 12, 12, 11) and qwen.ep == 32
    assert rows["llama3-8b"]["chunks"] is None and run_strategy(rows["llama3-8b"]).chunks is None
    args = megatron_arguments(qwen, 94)
    assert "--pipeline-model-parallel-layout Et*2|" + "t*3|" * 30 + "t*2L" in args


def test_an_uneven_layout_prices_its_fullest_rank(tmp_path):
    """Qwen3-235B-A22B's row priced with its layout (fullest rank 12 blocks) and with one that
    piles 4 blocks into chunk 0 (Et*4|(t*3|)*30L: rank 0 holds 13): the second is slower, by
    the extra block on the critical rank m times (m = 8192 / 16 = 512 microbatches).
    Mutation checked: ignoring `chunks` in Strategy.check_layers makes both price alike."""
    from phaze.config import load_config
    from phaze.fidelity.validate import validate_runs

    lines = (DATA / "h100_published_fp8.csv").read_text().splitlines()
    header = next(x for x in lines if x.startswith("model,"))
    row = next(x for x in lines if x.startswith("qwen3-235b-a22b,"))
    skew = row.replace("Et*2|(t*3|)*30t*2L", "Et*4|(t*3|)*30L")
    (tmp_path / "runs.csv").write_text(f"{header}\n{row}\n{skew}\n")
    report = validate_runs(load_config(None), tmp_path / "runs.csv")
    published, piled = (r["predicted_time_s"] for r in report["rows"])
    assert piled > published * (1 + 0.5 / 12)


@pytest.mark.parametrize(
    "layout,pp,vp,blocks,message",
    [
        ("Et*2|t*2L", 2, 1, 5, "holds 4 transformer blocks, the model has 5"),
        ("Et|t|t|tL", 2, 1, 4, "has 4 model chunks, pp·interleave = 2·1 = 2"),
        ("Et|t|tL", 2, 2, 3, "has 3 model chunks, pp·interleave = 2·2 = 4"),
        ("tt|EtL", 2, 1, 3, "the embedding E must be once, in chunk 0"),
        ("EtL|tt", 2, 1, 3, "the loss L must be once, in the last chunk"),
        ("Etx|tL", 2, 1, 2, "unknown symbol(s) 'x'"),
    ],
)
def test_a_layout_that_does_not_fit_the_run_is_refused(layout, pp, vp, blocks, message):
    with pytest.raises(PhazeError) as err:
        parse_pipeline_layout(layout, pp, vp, blocks)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_model_chunks_not_matching_the_strategy_are_refused():
    base = {"devices": 2, "tp": 1, "pp": 2, "microbatch": 1, "global_batch": 8}
    with pytest.raises(PhazeError, match="3 model chunks, pp·interleave = 2·1 = 2"):
        Strategy(**base, chunks=(1, 1, 1))
    with pytest.raises(PhazeError, match="integers >= 0"):
        Strategy(**base, chunks=(2, -1))
    with pytest.raises(PhazeError, match="the model chunks hold 3 blocks, the model has 4"):
        Strategy(**base, chunks=(2, 1)).check_layers(4)


def test_a_bad_layout_in_a_table_exits_2_with_one_line(tmp_path):
    """The FP8 table's Qwen3-235B-A22B row with a layout one block short, then with 31 model
    chunks for pp 8 x vp 4: exit 2, one line naming the row and the problem."""
    lines = (DATA / "h100_published_fp8.csv").read_text().splitlines()
    header = next(x for x in lines if x.startswith("model,"))
    row = next(x for x in lines if x.startswith("qwen3-235b-a22b,"))
    cases = (
        (row.replace("t*2L", "tL"), "holds 93 transformer blocks, the model has 94"),
        (row.replace("*30t*2L", "*29t*5L"), "has 31 model chunks, pp·interleave = 8·4 = 32"),
        (row.replace(",1,1,fp8,", ",4,1,fp8,", 1), "expert_tensor_parallel must be 1 or"),
    )
    for bad, message in cases:
        assert bad != row
        (tmp_path / "runs.csv").write_text(header + "\n" + bad + "\n")
        out = subprocess.run(
            [sys.executable, "-m", "phaze", "validate", "--reference", str(tmp_path / "runs.csv")],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 2
        (line,) = out.stderr.strip().splitlines()
        assert "row 1" in line and message in line
