"""Context parallelism in the step model (Megatron-LM's ``--context-parallel-size``): the layer
a context-parallel rank runs, the rank layout tp-cp-ep-dp-pp, the key/value ring, the gradient
reduction over dp·cp, memory, the search against brute force, and the command-line checks."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from phaze.errors import PhazeError
from phaze.network import HierarchicalNetwork, LinkLevel
from phaze.place.megatron import Axes, optimize
from phaze.step.layers import ChainCost, LayerCost
from phaze.step.megatron_args import megatron_arguments
from phaze.step.model import Layout, StepConstants, price
from phaze.step.strategy import Strategy, context_parallel_reason

ZERO = LayerCost(0.0, 0.0, 0.0, 0.0)


def consts(**kw) -> StepConstants:
    base = {
        "state_bytes_per_param": 16.0,
        "optimizer_state_bytes_per_param": 12.0,
        "grad_bytes_per_param": 2.0,
        "weight_bytes_per_param": 2.0,
        "optimizer_bytes_per_param": 0.0,
        "grad_accumulation_bytes_per_param": 0.0,
        "ddp_bucket_bytes": 1e9,
        "hbm_bandwidth_Bps": 1e12,
        "scatter_gather": False,
    }
    return StepConstants(**{**base, **kw})


def block_at_local_seq() -> LayerCost:
    """One block costed on the rank's seq/cp tokens (what the trace at seq/cp gives)."""
    return LayerCost(
        fwd_s=1.0,
        bwd_s=2.0,
        params=1.0,
        activation_bytes=100.0,
        attention_fwd_s=0.4,
        attention_bwd_s=0.8,
        attention_activation_bytes=20.0,
        input_bytes=5.0,
        fwd_matmul_flops=3.0,
        attention_matmul_flops=1.0,
        kv_bytes=1.0,
    )


def chain(cp: int, blocks: int = 2) -> ChainCost:
    return ChainCost(
        first=ZERO,
        block=block_at_local_seq().context_parallel(cp),
        last=ZERO,
        blocks=blocks,
        tp=1,
        microbatch=1,
        sequence_parallel=False,
        boundary_bytes=0.0,
        cp=cp,
    )


def one_node(devices: int = 4, bandwidth: float = 1.0) -> HierarchicalNetwork:
    link = LinkLevel(bandwidth, 0.0)
    return HierarchicalNetwork(devices, link, link)


def test_a_context_parallel_layer_runs_cp_attention_blocks_and_keeps_the_rest():
    """cp = 2 by hand: core attention twice (computation, FLOPs, saved scores), the rest as
    costed on seq/cp tokens; cp = 1 is the layer itself."""
    b = block_at_local_seq()
    assert b.context_parallel(1) is b
    c = b.context_parallel(2)
    assert (c.fwd_s, c.bwd_s) == (1.4, 2.8)
    assert (c.attention_fwd_s, c.attention_bwd_s) == (0.8, 1.6)
    assert (c.fwd_matmul_flops, c.attention_matmul_flops) == (4.0, 2.0)
    assert (c.activation_bytes, c.attention_activation_bytes) == (120.0, 40.0)
    assert (c.params, c.input_bytes, c.kv_bytes) == (1.0, 5.0, 1.0)


def test_the_rank_order_is_tp_cp_ep_dp_pp():
    """Megatron's ``RankGenerator(order='tp-cp-ep-dp-pp')``: with tp 2, cp 2, dp 2, pp 2 the
    context-parallel ring of rank 0 is {0, 2}, its gradient group (dp with cp) {0, 2, 4, 6},
    its tensor-parallel group {0, 1}, and the second stage starts at rank 8."""
    s = Strategy(devices=16, tp=2, pp=2, microbatch=1, global_batch=4, cp=2)
    assert (s.dp, s.cdp, s.microbatches) == (2, 4, 2)
    assert s.cp_group() == [0, 2]
    assert s.cp_group(tp_rank=1, dp_rank=1) == [5, 7]
    assert s.dp_group() == [0, 2, 4, 6]
    assert s.tp_group() == [0, 1]
    assert s.rank(0, 0, 1) == 8
    assert sorted(
        r
        for k in range(2)
        for c in range(2)
        for d in range(2)
        for j in range(2)
        for r in [s.rank(k, d, j, c)]
    ) == list(range(16))


def test_iteration_time_and_memory_of_a_small_context_parallel_run_by_hand():
    """4 devices on one node (1 B/s, no latency), tp 1, pp 1, cp 2 (dp 2), 2 blocks, global
    batch 4 of microbatch 1 (m = 2). A transfer of K,V (1 B) takes 1 s; one step of core
    attention 0.8/2 = 0.4 s forward, 1.6/2 = 0.8 s backward. Forward: cp − 1 = 1 transfer,
    exposed 0.6 s; backward: K,V then dK,dV, each exposed 0.2 s. T = 2·(1.4 + 2.8 + 1.0) =
    10.4 s, pipeline 2·10.4 = 20.8 s; the gradients (2 parameters, 4 B) all-reduced over
    dp·cp = 4 ranks after backward: 2·(3/4)·4 = 6 s (over dp = 2 alone it would be 4 s).
    Memory: 2 parameters × 16 B + 1 microbatch × 2 blocks × 120 B = 272 B. Model FLOPs: 3
    passes × tp·cp ranks × 2 blocks × 4 FLOPs × 4 microbatch rounds = 192.

    Mutations tried, each fails here: cp forward transfers instead of cp − 1, one backward
    transfer of K,V instead of two, the reduction over dp instead of dp·cp, the model FLOPs
    without cp."""
    s = Strategy(devices=4, tp=1, pp=1, microbatch=1, global_batch=4, cp=2, ddp="after")
    got = price(chain(2), s, one_node(), consts(), peak_flops=1.0)
    assert got["iteration_time_s"] == pytest.approx(26.8, rel=1e-12)
    assert got["breakdown"]["context_parallel_comm_s"] == pytest.approx(2 * 2 * 1.0, rel=1e-12)
    assert got["breakdown"]["data_parallel_comm_s"] == pytest.approx(6.0, rel=1e-12)
    assert got["peak_memory_bytes"] == pytest.approx(272.0, rel=1e-12)
    assert got["model_flops"] == pytest.approx(192.0, rel=1e-12)
    assert sum(got["breakdown"].values()) == pytest.approx(got["iteration_time_s"], rel=1e-12)
    assert got["strategy"]["cp"] == 2


def test_a_ring_of_four_sends_keys_values_and_their_gradients_in_the_middle_steps():
    """cp 4 (8 devices, dp 2, 1 B/s): attention at seq/cp 0.4 s forward, 0.8 s backward, so a
    step 0.4 s / 0.8 s; K,V 1 B (1 s), with dK,dV 2 B (2 s). Forward: 3 transfers exposed
    0.6 s; backward: K,V and dK,dV alone (0.2 s each) and 2 middle transfers (1.2 s each):
    4.2 s per block."""
    s = Strategy(devices=8, tp=1, pp=1, microbatch=1, global_batch=2, cp=4, ddp="after")
    got = price(chain(4), s, one_node(8), consts(), peak_flops=1.0)
    per_block = 3 * 0.6 + 2 * 0.2 + 2 * 1.2
    assert got["breakdown"]["context_parallel_comm_s"] == pytest.approx(2 * per_block, rel=1e-12)


def test_full_recomputation_runs_the_forward_ring_again_and_selective_hides_behind_it():
    """Full: the forward (1.4 s, its ring exposed 0.6 s) again: T = 2·(1.4 + 2.8 + 1.4 + 1.2 +
    0.4) = 14.4 s. Selective: core attention's forward (0.8 s) re-runs inside the backward
    steps, so a backward step hides (1.6 + 0.8)/2 = 1.2 s ≥ 1 s: T = 2·(1.4 + 2.8 + 0.8 + 0.6)
    = 11.2 s."""
    for mode, per_mb in (("full", 14.4), ("selective", 11.2)):
        s = Strategy(
            devices=4, tp=1, pp=1, microbatch=1, global_batch=4, cp=2, ddp="after", recompute=mode
        )
        got = price(chain(2), s, one_node(), consts(), peak_flops=1.0)
        assert got["per_stage"][0]["per_microbatch_s"] == pytest.approx(per_mb, rel=1e-12)


def test_a_ring_that_leaves_the_node_runs_at_the_inter_node_link():
    """tp 8, cp 2 on nodes of 8: the ring's pairs are 8 ranks apart, on different nodes (the
    NIC, 1 B/s); tp 4, cp 2 keeps them inside one node (NVLink, 10 B/s)."""
    net = HierarchicalNetwork(8, LinkLevel(10.0, 0.0), LinkLevel(1.0, 0.0))
    across = Layout.build(net, 8, 1, 2, cp=2)
    inside = Layout.build(net, 4, 2, 2, cp=2)
    assert (across.cp_bw, inside.cp_bw) == (1.0, 10.0)
    assert across.ring_step_s(3.0) == 3.0
    assert Layout.build(net, 8, 1, 2).ring_step_s(3.0) == 0.0


def test_the_distributed_optimizer_shards_over_dp_times_cp():
    """Optimizer state per parameter 4 + 12/(dp·cp) = 7 B with dp 2, cp 2: 2 parameters hold
    14 B of state, the activations 240 B."""
    s = Strategy(
        devices=4, tp=1, pp=1, microbatch=1, global_batch=4, cp=2, distributed_optimizer=True
    )
    got = price(chain(2), s, one_node(), consts(), peak_flops=1.0)
    assert got["peak_memory_bytes"] == pytest.approx(2 * 7.0 + 240.0, rel=1e-12)


def test_impossible_context_parallel_sizes_give_one_line_reasons():
    assert context_parallel_reason(8192, 1) == ""
    assert context_parallel_reason(8192, 4) == ""
    assert "2·cp = 6" in context_parallel_reason(8192, 3)
    assert "2·cp = 4" in context_parallel_reason(6, 2)
    with pytest.raises(PhazeError, match="tp·cp·pp"):
        Strategy(devices=6, tp=1, pp=1, microbatch=1, global_batch=6, cp=4)
    s = Strategy(devices=8, tp=2, pp=1, microbatch=1, global_batch=4, cp=2)
    assert "--context-parallel-size 2" in megatron_arguments(s, 4)


def _brute_force(chains, net, c, devices, batch, hbm, axes):
    best = math.inf
    for (t, b, sp, cp), ch in chains.items():
        for p in range(1, min(devices, ch.blocks + 2) + 1):
            for v, rc, zero, ddp in itertools.product(
                axes.interleave, axes.recompute, axes.distributed_optimizer, axes.ddp
            ):
                for stages in itertools.product(range(ch.blocks + 1), repeat=p):
                    if sum(stages) != ch.blocks:
                        continue
                    try:
                        s = Strategy(
                            devices=devices,
                            tp=t,
                            pp=p,
                            microbatch=b,
                            global_batch=batch,
                            interleave=v,
                            recompute=rc,
                            sequence_parallel=sp,
                            distributed_optimizer=zero,
                            ddp=ddp,
                            stages=stages,
                            cp=cp,
                        )
                        s.check_layers(ch.blocks)
                    except PhazeError:
                        continue
                    got = price(ch, s, net, c, 1.0, hbm)
                    if got["fits_memory"]:
                        best = min(best, got["iteration_time_s"])
    return best


@pytest.mark.parametrize("seed", range(12))
def test_the_search_over_cp_equals_brute_force(seed):
    """Random blocks at cp 1, 2 and 4 (each costed on its own seq/cp, the ring on random
    two-level networks), every tp, pp, split and axis: the search's time is the brute force's
    minimum, and some seeds choose cp > 1 (checked over all seeds below)."""
    rng = np.random.default_rng(seed)
    devices = int(rng.choice([4, 8]))
    dpn = int(rng.choice([1, 2, 4, 8]))
    net = HierarchicalNetwork(
        dpn,
        LinkLevel(float(rng.uniform(1, 20)), float(rng.uniform(0, 0.01))),
        LinkLevel(float(rng.uniform(0.1, 2)), float(rng.uniform(0, 0.05))),
    )
    blocks = int(rng.integers(2, 5))
    chains = {}
    for cp in (1, 2, 4):
        scale = 1.0 / cp
        attn = float(rng.uniform(0.05, 0.5))
        layer = LayerCost(
            fwd_s=float(rng.uniform(0.5, 1.5)) * scale + attn * scale**2,
            bwd_s=float(rng.uniform(1.0, 3.0)) * scale + 2 * attn * scale**2,
            params=float(rng.uniform(1, 5)),
            activation_bytes=float(rng.uniform(10, 50)) * scale,
            attention_fwd_s=attn * scale**2,
            attention_bwd_s=2 * attn * scale**2,
            input_bytes=1.0 * scale,
            kv_bytes=float(rng.uniform(0.1, 2.0)) * scale,
        ).context_parallel(cp)
        chains[(1, 1, False, 1, 1, cp)] = ChainCost(
            ZERO, layer, ZERO, blocks, 1, 1, False, 1.0 * scale, cp=cp
        )
    c = consts(optimizer_bytes_per_param=float(rng.uniform(0, 4)))
    hbm = float(rng.uniform(60, 400))
    axes = Axes(interleave=(1, 2), ddp=("overlap", "after"))
    found = optimize(chains, net, c, devices, devices, hbm, axes)
    small = {(k[0], k[1], k[2], k[5]): v for k, v in chains.items()}
    expect = _brute_force(small, net, c, devices, devices, hbm, axes)
    if math.isinf(expect):
        assert found.strategy is None
        return
    assert found.time_s == pytest.approx(expect, rel=1e-9)
    assert found.strategy is not None
    got = price(chains[(1, 1, False, 1, 1, found.strategy.cp)], found.strategy, net, c, 1.0)
    assert got["iteration_time_s"] == pytest.approx(found.time_s, rel=1e-9)
    _CHOSEN.add(found.strategy.cp)


_CHOSEN: set[int] = set()


def test_the_random_searches_choose_context_parallelism_somewhere():
    """Runs after the parametrized cases (file order): some of them chose cp > 1 and some
    cp = 1, so the brute-force comparison exercised both."""
    if not _CHOSEN:
        pytest.skip("run with the brute-force cases")
    assert _CHOSEN & {2, 4} and 1 in _CHOSEN


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "phaze", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_command_lines_refuse_a_cp_that_does_not_split_the_sequence_or_the_devices():
    """Exit 2 with one line: 2·cp not dividing the sequence (evaluate, optimize), cp not
    dividing the devices (optimize), tp·cp·pp not dividing them (evaluate)."""
    common = ["--model", "llama3-8b", "--arch", "h100-sxm", "--global-batch", "8"]
    runs = [
        [
            "evaluate",
            *common,
            "--devices",
            "6",
            "--tp",
            "1",
            "--pp",
            "1",
            "--cp",
            "3",
            "--microbatch",
            "1",
        ],
        [
            "evaluate",
            *common,
            "--devices",
            "8",
            "--tp",
            "1",
            "--pp",
            "1",
            "--cp",
            "3",
            "--microbatch",
            "1",
        ],
        ["optimize", *common, "--devices", "8", "--cp", "1", "3"],
        ["optimize", *common, "--devices", "6", "--cp", "4"],
    ]
    for args in runs:
        out = _cli(*args)
        assert out.returncode == 2, (args, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "cp" in lines[0], out.stderr


def test_a_gpu_chain_at_cp_halves_every_ranks_work_and_keeps_the_models_flops():
    """A tiny GPT on h100-sxm (seq 256) at cp 2, costed on 128 tokens with core attention as two
    ring blocks: each rank's forward matmul FLOPs are exactly half those
    of cp 1 (the GEMMs on half the tokens, the attention s²/cp) and its saved activations half
    (to a few scalar bytes), the model FLOPs of the run the
    same, and core attention's backward is found (the trace marks forward ops only) and counted
    twice. Mutation tried: no backward attention (bwd not scaled) fails."""
    from phaze.arch.presets import load_preset
    from phaze.config import load_config
    from phaze.fidelity.evaluate import gpu_chains
    from tests.step_cases import TINY_SEQ, tiny_gpt

    cfg, h100, spec = load_config(None), load_preset("h100-sxm"), tiny_gpt(layers=2)
    one = gpu_chains(spec, 1, 1, TINY_SEQ, h100, cfg)[False]
    two = gpu_chains(spec, 1, 1, TINY_SEQ, h100, cfg, cp=2)[False]
    assert two.cp == 2 and two.boundary_bytes == one.boundary_bytes / 2
    for layer in ("first", "block", "last"):
        a, b = getattr(one, layer), getattr(two, layer)
        assert b.fwd_matmul_flops == pytest.approx(a.fwd_matmul_flops / 2, rel=1e-12)
        assert b.activation_bytes == pytest.approx(a.activation_bytes / 2, rel=1e-4)
    assert two.model_flops_per_microbatch() == pytest.approx(
        one.model_flops_per_microbatch(), rel=1e-12
    )
    assert one.block.kv_bytes == 2 * TINY_SEQ * spec.hidden * 2
    assert two.block.kv_bytes == one.block.kv_bytes / 2
    assert 0 < one.block.attention_bwd_s < one.block.bwd_s
    assert two.block.attention_bwd_s > 0
    local = gpu_chains(spec, 1, 1, TINY_SEQ // 2, h100, cfg)[False]  # one ring block's costing
    assert two.block.bwd_s == pytest.approx(
        local.block.bwd_s + local.block.attention_bwd_s, rel=1e-12
    )


DATA = Path(__file__).resolve().parents[1] / "phaze" / "fidelity" / "data"


def test_the_published_h100_tables_carry_context_parallelism_and_precision():
    """The BF16 table reads (context_parallel 2 on every row, precision bf16) into Megatron's
    strategies; a table without the two columns reads them as cp 1 and the config's precision
    (None: the Mixtral run); the FP8 table's rows read as fp8."""
    from phaze.fidelity.validate import read_runs, run_strategy

    rows = read_runs(DATA / "h100_published_bf16.csv")
    assert len(rows) == 4 and all(r["precision"] == "bf16" for r in rows)
    got = [(s.tp, s.pp, s.cp, s.dp, s.interleave) for s in map(run_strategy, rows)]
    assert got == [(1, 1, 2, 4, 1), (1, 1, 2, 64, 1), (4, 4, 2, 2, 5), (4, 4, 2, 32, 5)]
    (mixtral,) = read_runs(DATA / "megatron_mixtral_release.csv")
    assert (mixtral["context_parallel"], mixtral["precision"]) == (1, None)
    assert run_strategy(mixtral).cp == 1
    fp8 = read_runs(DATA / "h100_published_fp8.csv")
    assert [r["model"] for r in fp8] == [
        "llama3-8b",
        "llama3-70b",
        "qwen3-30b-a3b",
        "deepseek-v3",
        "qwen3-235b-a22b",
    ]
    assert all(r["precision"] == "fp8" for r in fp8)


def test_a_run_the_step_model_cannot_price_is_refused_with_one_line(tmp_path):
    """The FP8 table's DeepSeek-V3 row without its pipeline layout: exit 2 naming the uneven
    split; a model the registry lacks: exit 2 naming it; a precision the step model does not
    price (fp16): exit 2 naming it."""
    lines = (DATA / "h100_published_fp8.csv").read_text().splitlines()
    header = next(x for x in lines if x.startswith("model,"))
    dsv3 = next(x for x in lines if x.startswith("deepseek-v3,"))
    cases = (
        (dsv3.replace("Et|(tt|)*30mL", ""), "cannot be split evenly over pp = 8"),
        (dsv3.replace("deepseek-v3,", "qwen3-480b,", 1), "unknown model 'qwen3-480b'"),
        (dsv3.replace(",fp8,", ",fp16,"), "fp16 is not modelled"),
    )
    for row, message in cases:
        (tmp_path / "runs.csv").write_text(header + "\n" + row + "\n")
        out = _cli("validate", "--reference", str(tmp_path / "runs.csv"))
        assert out.returncode == 2
        (line,) = out.stderr.strip().splitlines()
        assert message in line


def test_a_ring_on_a_torus_waits_for_its_farthest_pair():
    """Four chips on a line of the torus (no wraparound), cp 4: the ring's pair 3 -> 0 is three
    hops, so every step takes S/B + 3·L (B = 2 B/s, L = 0.1 s)."""
    from phaze.network import TorusNetwork

    net = TorusNetwork((4, 1, 1), (False, False, False), LinkLevel(2.0, 0.1))
    layout = Layout.build(net, 1, 1, 4, cp=4)
    assert (layout.cp_bw, layout.cp_lat) == (2.0, pytest.approx(0.3))
    assert layout.ring_step_s(1.0) == pytest.approx(0.5 + 0.3)


def test_optimize_cp_all_lists_every_size_that_splits_the_sequence_and_the_devices():
    from phaze.fidelity.optimize_cli import context_parallel_sizes

    assert context_parallel_sizes(None, 8192, 8) == [1]
    assert context_parallel_sizes(["all"], 8192, 8) == [1, 2, 4, 8]
    assert context_parallel_sizes(["all"], 24, 64) == [1, 2, 4]
    assert context_parallel_sizes(["all"], 3, 8) == [1]
    assert context_parallel_sizes(["4", "2", "2"], 8192, 8) == [2, 4]
    with pytest.raises(PhazeError, match="--cp takes integers"):
        context_parallel_sizes(["two"], 8192, 8)
