"""`phaze optimize`: the search covers the strategies experts publish, and what it prints is what
`phaze evaluate` computes for the same strategy."""

import json

import pytest

from phaze.arch.presets import load_preset
from phaze.config import validate_config
from phaze.fidelity.evaluate import evaluate_strategy, optimize_strategy
from phaze.fidelity.validate import SEQ, gpt_spec, published_strategy, read_reference
from tests.step_cases import write_tiny_gpt2_config

CFG = validate_config({})
A100 = load_preset("a100-80gb")
ROWS = read_reference()


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['params_billion']:g}B")
def test_optimize_is_never_slower_than_the_published_strategy(row):
    """Narayanan et al. 2021, Table 1: each published strategy (tp, pp, microbatch, interleave,
    full recomputation, DDP) lies in the space `optimize` searches, so the optimum under the same
    model is at least as fast; and `evaluate` of the optimum gives its time back."""
    spec = gpt_spec(row)
    published = published_strategy(row)
    want = evaluate_strategy(spec, published, A100, seq=SEQ, config=CFG)
    assert want["fits_memory"]
    got, found = optimize_strategy(
        spec,
        A100,
        devices=row["gpus"],
        global_batch=row["global_batch"],
        seq=SEQ,
        hbm_capacity_bytes=float(A100["gpu"]["hbm_capacity_bytes"]),
        config=CFG,
        microbatches=sorted({1, row["microbatch"]}),
        tps=[1, 2, 4, 8],
    )
    assert got is not None and got["fits_memory"]
    assert got["iteration_time_s"] <= want["iteration_time_s"] * (1 + 1e-9)
    again = evaluate_strategy(spec, found.strategy, A100, seq=SEQ, config=CFG)
    assert again["iteration_time_s"] == pytest.approx(got["iteration_time_s"], rel=1e-6)
    assert found.time_s == pytest.approx(got["iteration_time_s"], rel=1e-9)
    s = found.strategy
    assert s.tp * s.pp * s.dp == row["gpus"] and row["global_batch"] % (s.microbatch * s.dp) == 0


def test_optimize_cli_json_and_evaluate_agree(tmp_path, phaze_cli):
    cfg = write_tiny_gpt2_config(
        tmp_path / "config.json", 6, n_embd=256, n_head=8, vocab=1024, seq=256
    )
    common = ["--hf-config", str(cfg), "--arch", "a100-80gb", "--devices", "16"]
    search = ["--tp", "1", "2", "--microbatch", "1"]
    out = phaze_cli(
        "optimize", *common, *search, "--global-batch", "64", "--hbm-gib", "0.5", "--json"
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    for key in ("iteration_time_s", "mfu", "peak_memory_bytes", "fits_memory", "breakdown"):
        assert key in r
    assert r["fits_memory"] and r["peak_memory_bytes"] <= 0.5 * 2**30
    s = r["strategy"]
    assert set(s) == {
        "tp",
        "pp",
        "dp",
        "ep",
        "etp",
        "microbatch",
        "interleave",
        "recompute",
        "sequence_parallel",
        "distributed_optimizer",
        "ddp",
        "stages",
    }
    assert s["ep"] == 1  # a dense model
    assert r["megatron_args"][:2] == [
        f"--tensor-model-parallel-size {s['tp']}",
        f"--pipeline-model-parallel-size {s['pp']}",
    ]
    flags = [
        "--tp",
        str(s["tp"]),
        "--pp",
        str(s["pp"]),
        "--microbatch",
        str(s["microbatch"]),
        "--interleave",
        str(s["interleave"]),
        "--recompute",
        s["recompute"],
        "--ddp",
        s["ddp"],
        "--stages",
        ",".join(map(str, s["stages"])),
    ]
    flags += ["--sequence-parallel"] * s["sequence_parallel"]
    flags += ["--distributed-optimizer"] * s["distributed_optimizer"]
    ev = phaze_cli("evaluate", *common, "--global-batch", "64", *flags)
    assert ev.returncode == 0, ev.stderr
    e = json.loads(ev.stdout)
    assert e["strategy"] == s
    assert e["iteration_time_s"] == pytest.approx(r["iteration_time_s"], rel=1e-6)
    # nothing fits: exit 2, one line
    bad = phaze_cli(
        "optimize",
        *common,
        "--tp",
        "1",
        "--microbatch",
        "1",
        "--global-batch",
        "64",
        "--hbm-gib",
        "0.001",
    )
    assert bad.returncode == 2 and "no strategy" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--tp", "1", "--pp", "1", "--sequence-parallel"], "sequence parallelism needs"),
        (["--tp", "1", "--pp", "16", "--distributed-optimizer"], "distributed optimizer needs"),
        (["--tp", "2", "--pp", "2", "--interleave", "2"], "interleave 2 does not divide"),
        (["--tp", "2", "--pp", "2", "--stages", "2,x"], "--stages takes integers"),
        (["--tp", "2", "--pp", "2", "--stages", "3,4"], "the model has 6"),
        (["--tp", "2", "--pp", "2", "--etp", "4"], "etp must be tp (2) or 1"),
        (["--tp", "2", "--pp", "2", "--etp", "1"], "etp = 1 (experts without tensor"),
    ],
)
def test_evaluate_rejects_impossible_strategies_in_one_line(tmp_path, flags, needle, phaze_cli):
    cfg = write_tiny_gpt2_config(tmp_path / "config.json", 6)
    out = phaze_cli(
        "evaluate",
        "--hf-config",
        str(cfg),
        "--arch",
        "a100-80gb",
        "--devices",
        "16",
        "--global-batch",
        "32",
        "--microbatch",
        "1",
        *flags,
    )
    assert out.returncode == 2 and needle in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_optimize_searches_the_experts_tensor_parallel_size(phaze_cli):
    """Mixtral on 64 H100s at tp 2, ep 8: the search over both etp values returns the faster of
    the searches over each alone, and its Megatron arguments name whole experts exactly when it
    chose them. (At this short sequence the experts' weights dominate and splitting them wins;
    at 4096 tokens the all-to-all inside a node does: docs/step.md.)"""
    common = ["--model", "mixtral-8x7b", "--arch", "h100-sxm", "--devices", "64"]
    common += ["--global-batch", "256", "--seq", "512", "--tp", "2", "--microbatch", "1"]
    common += ["--ep", "8", "--json"]
    got = {}
    for etps in (["tp"], ["1"], ["tp", "1"]):
        out = phaze_cli("optimize", *common, "--etp", *etps)
        assert out.returncode == 0, out.stderr
        got[tuple(etps)] = json.loads(out.stdout)
    split, whole, both = got[("tp",)], got[("1",)], got[("tp", "1")]
    assert split["strategy"]["etp"] == 2 and whole["strategy"]["etp"] == 1
    fastest = min(split["iteration_time_s"], whole["iteration_time_s"])
    assert both["iteration_time_s"] == pytest.approx(fastest, rel=1e-12)
    named = "--expert-tensor-parallel-size 1" in both["megatron_args"]
    assert named == (both["strategy"]["etp"] == 1)
    assert "--expert-tensor-parallel-size 1" in whole["megatron_args"]
