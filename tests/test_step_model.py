"""The step model (phaze/step): against an independent reference on random chains and networks,
against the GPU evaluation of `phaze.fidelity` it replaces, the schedule's closed forms, the FLOP
conventions, and the rejection of impossible strategies."""

import math

import numpy as np
import pytest

from phaze.arch.presets import load_preset
from phaze.arch.presets import preset_peak_flops as peak_flops
from phaze.config import validate_config
from phaze.errors import PhazeError
from phaze.fidelity.compute import preset_costmodel
from phaze.fidelity.evaluate import build_workload, evaluate_strategy
from phaze.fidelity.memory import BlockShape, block_activation_bytes
from phaze.fidelity.strategy import Strategy as FidelityStrategy
from phaze.network import HierarchicalNetwork
from phaze.step.layers import ChainCost, LayerCost
from phaze.step.model import StepConstants, price
from phaze.step.strategy import PipelineSchedule, Strategy, stages_reason
from phaze.trace.models import ModelSpec
from tests.step_cases import (
    random_chain,
    random_constants,
    random_network,
    reference_price,
)
from tests.test_fidelity_pipeline import simulate_1f1b_makespan


def random_split(rng, blocks, p, v):
    """Random blocks per stage: multiples of v (>= v each when v > 1), middle stages >= 1."""
    if v > 1:
        if blocks % v or blocks // v < p:
            return None
        k = blocks // v
        cuts = np.sort(rng.choice(np.arange(1, k), size=p - 1, replace=False)) if p > 1 else []
        return tuple(int(x) * v for x in np.diff(np.r_[0, cuts, k]))
    cuts = np.sort(rng.integers(0, blocks + 1, size=p - 1))
    return tuple(int(x) for x in np.diff(np.r_[0, cuts, blocks]))


def random_strategy(rng, chain, devices, global_batch):
    """A valid strategy on `chain` (or None), with random uneven stages."""
    t, b, L = chain.tp, chain.microbatch, chain.blocks
    options = []
    for p in range(1, devices // t + 1):
        if (devices // t) % p:
            continue
        d = devices // (t * p)
        if global_batch % (b * d):
            continue
        for v in (1, 2, 3):
            for zero in (False, True):
                options.append((p, d, v, zero))
    rng.shuffle(options)
    for p, d, v, zero in options:
        stages = random_split(rng, L, p, v)
        if stages is None:
            continue
        s_kwargs = {
            "devices": devices,
            "tp": t,
            "pp": p,
            "microbatch": b,
            "global_batch": global_batch,
            "interleave": v,
            "recompute": str(rng.choice(["none", "selective", "full"])),
            "sequence_parallel": chain.sequence_parallel,
            "distributed_optimizer": zero,
            "ddp": str(rng.choice(["overlap", "after"])),
            "stages": stages,
        }
        try:
            s = Strategy(**s_kwargs)
        except PhazeError:
            continue
        if s.layers_reason(L) == "":
            return s
    return None


def draw_case(seed):
    """A random chain, network, constants and a valid strategy (redrawn until one is valid)."""
    rng = np.random.default_rng(1000 + seed)
    while True:
        t = int(rng.choice([1, 2, 4]))
        sp = t > 1 and bool(rng.random() < 0.5)
        chain = random_chain(rng, int(rng.integers(1, 9)), t, int(rng.integers(1, 3)), sp)
        net = random_network(rng)
        consts = random_constants(rng)
        devices = t * int(rng.choice([1, 2, 3, 4, 6, 8]))
        global_batch = chain.microbatch * int(rng.choice([4, 6, 12, 24]))
        s = random_strategy(rng, chain, devices, global_batch)
        if s is not None:
            return chain, net, consts, s


@pytest.mark.parametrize("seed", range(60))
def test_price_equals_the_reference_on_random_chains_and_networks(seed):
    chain, net, consts, s = draw_case(seed)
    got = price(chain, s, net, consts, peak_flops=1.0)
    want, mem = reference_price(chain, s, net, consts)
    assert got["iteration_time_s"] == pytest.approx(want, rel=1e-12)
    assert [x["memory_bytes"] for x in got["per_stage"]] == pytest.approx(mem, rel=1e-12)
    assert got["peak_memory_bytes"] == pytest.approx(max(mem), rel=1e-12)
    assert math.isclose(sum(got["breakdown"].values()), got["iteration_time_s"], rel_tol=1e-12)


AWKWARD = [
    # (devices per node, t, p, d): groups of one stage that sit differently in the nodes
    (6, 4, 2, 2),  # data-parallel groups of tp rank 0 in one node, of tp rank 2 across two
    (6, 2, 3, 2),
    (3, 2, 2, 3),  # tensor-parallel groups across nodes for some replicas only
    (4, 8, 2, 1),
    (6, 4, 3, 3),
]


@pytest.mark.parametrize("layout", AWKWARD, ids=str)
@pytest.mark.parametrize("seed", range(4))
def test_price_equals_the_reference_on_awkward_layouts(layout, seed):
    dpn, t, p, d = layout
    rng = np.random.default_rng(seed)
    chain = random_chain(rng, 6, t, 1, bool(seed % 2))
    net = random_network(rng)
    net = type(net)(dpn, net.intra, net.inter)
    consts = random_constants(rng)
    s = Strategy(
        devices=t * p * d,
        tp=t,
        pp=p,
        microbatch=1,
        global_batch=d * p * 2,
        sequence_parallel=chain.sequence_parallel,
        distributed_optimizer=d > 1 and seed % 3 == 0,
        ddp=("overlap", "after")[seed % 2],
        recompute=("none", "selective", "full")[seed % 3],
        stages=random_split(rng, 6, p, 1),
    )
    got = price(chain, s, net, consts, peak_flops=1.0)
    want, mem = reference_price(chain, s, net, consts)
    assert got["iteration_time_s"] == pytest.approx(want, rel=1e-12)
    assert [x["memory_bytes"] for x in got["per_stage"]] == pytest.approx(mem, rel=1e-12)


def test_the_reference_draws_cover_every_feature():
    """The random cases above exercise what they should (not a vacuous test)."""
    seen = set()
    for seed in range(60):
        chain, net, _, s = draw_case(seed)
        seen |= {f"rc:{s.recompute}", f"ddp:{s.ddp}"}
        seen |= {"sp"} if s.sequence_parallel else set()
        seen |= {"zero"} if s.distributed_optimizer else set()
        seen |= {"interleave"} if s.interleave > 1 else set()
        seen |= {"uneven"} if len(set(s.check_layers(chain.blocks))) > 1 else set()
        seen |= {"tied"} if chain.tied and s.pp > 1 else set()
        if s.pp > 1 and (s.tp * s.dp) % net.devices_per_node and net.devices_per_node > 1:
            seen.add("awkward layout")
    want = {"rc:none", "rc:selective", "rc:full", "ddp:overlap", "ddp:after", "sp", "zero"}
    assert want | {"interleave", "uneven", "tied", "awkward layout"} <= seen


# ---------------------------------------------------------------------------------------------
# the GPU evaluation it replaces (phaze.fidelity.evaluate), on GPU-shaped inputs
# ---------------------------------------------------------------------------------------------
SEQ = 256
CFG = validate_config({})
A100 = load_preset("a100-80gb")
FID = CFG["fidelity"]


def tiny_gpt(layers=8, hidden=256, heads=8, vocab=1024):
    kw = {
        "n_layer": layers,
        "n_embd": hidden,
        "n_head": heads,
        "n_inner": 4 * hidden,
        "vocab_size": vocab,
        "n_positions": SEQ,
    }
    return ModelSpec("tiny-gpt", "gpt2", layers, hidden, heads, 4 * hidden, vocab, SEQ, heads, kw)


def _layer(w, act, attention_act=0.0, input_bytes=0.0, tied=0.0):
    return LayerCost(
        fwd_s=w.fwd_s,
        bwd_s=w.bwd_s,
        params=w.param_bytes / 2,
        activation_bytes=act,
        fwd_collectives=tuple(w.fwd_collectives),
        bwd_collectives=tuple(w.bwd_collectives),
        attention_fwd_s=w.attention_core_fwd_s,
        attention_activation_bytes=attention_act,
        input_bytes=input_bytes,
        tied_params=tied,
        fwd_matmul_flops=w.fwd_flops,
    )


def fidelity_chain(spec, fs, w) -> ChainCost:
    """The fidelity workload as a chain, with its closed-form (Korthikanti) block memory."""
    t, b, sp = fs.tp, fs.microbatch, fs.sequence_parallel
    shape = BlockShape(SEQ, b, spec.hidden, spec.heads, spec.ffn)
    none, sel, full = (
        block_activation_bytes(shape, t, sp, m) for m in ("none", "selective", "full")
    )
    return ChainCost(
        first=_layer(w.embedding, w.embedding_activation_bytes),
        block=_layer(w.block, none, none - sel, full),
        last=_layer(w.head, w.head_activation_bytes, tied=w.word_embedding_params),
        blocks=spec.num_blocks,
        tp=t,
        microbatch=b,
        sequence_parallel=sp,
        boundary_bytes=b * SEQ * spec.hidden * 2,
    )


def a100_constants():
    cm = preset_costmodel(A100, CFG["costmodel"])
    return StepConstants(
        state_bytes_per_param=FID["state_bytes_per_param"],
        optimizer_state_bytes_per_param=12.0,
        grad_bytes_per_param=FID["grad_bytes_per_param"],
        weight_bytes_per_param=2.0,
        optimizer_bytes_per_param=FID["optimizer_bytes_per_param"],
        ddp_bucket_bytes=FID["ddp_bucket_bytes"],
        hbm_bandwidth_Bps=cm["hbm_bandwidth_Bps"],
        scatter_gather=FID["scatter_gather"],
    )


FIDELITY_CASES = [
    {"devices": 16, "tp": 2, "pp": 2, "microbatch": 2, "global_batch": 32, "ddp": "after"},
    {
        "devices": 16,
        "tp": 2,
        "pp": 4,
        "microbatch": 1,
        "global_batch": 32,
        "interleave": 2,
        "recompute": "full",
    },
    {"devices": 32, "tp": 1, "pp": 1, "microbatch": 1, "global_batch": 32, "ddp": "overlap"},
    {
        "devices": 32,
        "tp": 1,
        "pp": 1,
        "microbatch": 4,
        "global_batch": 128,
        "recompute": "full",
        "ddp": "after",
    },
    {
        "devices": 48,
        "tp": 2,
        "pp": 2,
        "microbatch": 1,
        "global_batch": 48,
        "sequence_parallel": True,
        "recompute": "selective",
        "ddp": "overlap",
    },
    {
        "devices": 24,
        "tp": 4,
        "pp": 2,
        "microbatch": 1,
        "global_batch": 24,
        "recompute": "selective",
    },
    {
        "devices": 64,
        "tp": 8,
        "pp": 4,
        "microbatch": 1,
        "global_batch": 64,
        "interleave": 2,
        "ddp": "after",
    },
]


@pytest.mark.parametrize("case", FIDELITY_CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_step_model_equals_todays_gpu_evaluation(case):
    spec = tiny_gpt()
    case = {"ddp": "after", **case}
    fs = FidelityStrategy(**case)
    w = build_workload(spec, fs, SEQ, A100, CFG["costmodel"], FID)
    want = evaluate_strategy(
        spec, fs, A100, seq=SEQ, costmodel=CFG["costmodel"], fidelity=FID, workload=w
    )
    net = HierarchicalNetwork.from_preset(A100["network"])
    got = price(
        fidelity_chain(spec, fs, w),
        Strategy(**case),
        net,
        a100_constants(),
        peak_flops(A100),
        A100["gpu"]["hbm_bytes"],
    )
    assert got["iteration_time_s"] == pytest.approx(want["iteration_time_s"], rel=1e-12)
    for key, value in want["breakdown"].items():
        assert got["breakdown"][key] == pytest.approx(value, rel=1e-12, abs=1e-18)
    assert got["peak_memory_bytes"] == pytest.approx(want["peak_memory_bytes"], rel=1e-12)
    for a, b in zip(got["per_stage"], want["per_stage"]):
        assert a["per_microbatch_s"] == pytest.approx(b["per_microbatch_s"], rel=1e-12)
        assert a["memory_bytes"] == pytest.approx(b["memory_bytes"], rel=1e-12)
    assert got["mfu"] == pytest.approx(want["mfu"], rel=1e-12)
    # the 4-pass count of Narayanan et al.'s Eq. (3) is what runs under full recomputation
    if fs.recompute == "full":
        assert got["hardware_flops"] == pytest.approx(want["model_flops"], rel=1e-12)
    assert got["fits_memory"] is want["fits_memory"]


def test_model_flops_are_three_passes_and_hardware_flops_count_recomputation():
    spec = tiny_gpt()
    fs = FidelityStrategy(devices=16, tp=2, pp=2, microbatch=2, global_batch=32)
    chain = fidelity_chain(spec, fs, build_workload(spec, fs, SEQ, A100, CFG["costmodel"], FID))
    net = HierarchicalNetwork.from_preset(A100["network"])
    out = {}
    for mode in ("none", "selective", "full"):
        s = Strategy(devices=16, tp=2, pp=2, microbatch=2, global_batch=32, recompute=mode)
        out[mode] = price(chain, s, net, a100_constants(), 1e15)
    # GPT: forward matmul FLOPs per sequence = 2·P_matmul·s + 4·s²·h per block, plus the logits
    B, s, L, h, V = 32, SEQ, 8, 256, 1024
    fwd = L * (24 * h * h * s + 4 * s * s * h) + 2 * s * h * V
    assert out["none"]["model_flops"] == pytest.approx(3 * B * fwd, rel=1e-9)
    assert out["none"]["hardware_flops"] == out["none"]["model_flops"]
    assert out["full"]["hardware_flops"] == pytest.approx(
        out["full"]["model_flops"] + B * L * (24 * h * h * s + 4 * s * s * h), rel=1e-9
    )
    for r in out.values():
        assert r["mfu"] == pytest.approx(
            r["model_flops"] / (16 * r["iteration_time_s"] * 1e15), rel=1e-12
        )
        assert r["hfu"] >= r["mfu"]
    assert out["none"]["iteration_time_s"] < out["full"]["iteration_time_s"]


# ---------------------------------------------------------------------------------------------
# the schedule
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p,m", [(1, 1), (2, 2), (2, 5), (4, 4), (4, 9), (3, 7)])
def test_1f1b_matches_an_event_simulation(p, m):
    total, bubble = PipelineSchedule(p, 1, m).iteration_time([3.0] * p)
    assert math.isclose(total, simulate_1f1b_makespan(p, m, 1.0, 2.0))
    assert math.isclose(bubble / (m * 3.0), (p - 1) / m)


def test_schedule_sends_and_inflight():
    s = PipelineSchedule(4, 1, 8)
    assert [s.sends(j) for j in range(4)] == [(1, 0), (1, 1), (1, 1), (0, 1)]
    assert [s.inflight(j) for j in range(4)] == [4, 3, 2, 1]
    v = PipelineSchedule(4, 3, 8)
    assert [v.sends(j) for j in (0, 3)] == [(3, 2), (2, 3)]
    assert math.isclose(v.inflight(0), 4 * (1 + 3 / 12))
    assert PipelineSchedule(1, 1, 5).sends(0) == (0, 0)


# ---------------------------------------------------------------------------------------------
# impossible strategies: one-line errors
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"tp": 1, "sequence_parallel": True}, "sequence parallelism needs tensor parallelism"),
        (
            {"devices": 8, "tp": 4, "pp": 2, "distributed_optimizer": True},
            "distributed optimizer needs",
        ),
        ({"pp": 1, "interleave": 2}, "needs pipeline parallelism"),
        ({"pp": 4, "tp": 2, "global_batch": 24, "interleave": 2}, "divisible by pp"),
        ({"devices": 60, "tp": 8, "pp": 2}, "divisible by tp"),
        ({"microbatch": 3}, "global batch"),
        ({"recompute": "some"}, "recompute must be one of none|selective|full"),
        ({"ddp": "torch"}, "ddp must be one of overlap|after"),
        ({"pp": 2, "stages": (4, 4, 0)}, "3 stage sizes given for pp = 2"),
    ],
)
def test_impossible_strategies_are_rejected_in_one_line(kwargs, message):
    base = {"devices": 64, "tp": 2, "pp": 2, "microbatch": 1, "global_batch": 64}
    with pytest.raises(PhazeError, match=message) as err:
        Strategy(**{**base, **kwargs})
    assert "\n" not in str(err.value)


def test_stage_splits():
    assert stages_reason((4, 4), 8, 1) == ""
    assert stages_reason((0, 8), 8, 1) == ""  # the embedding alone on the first stage
    assert "middle stage 1" in stages_reason((4, 0, 4), 8, 1)
    assert "does not divide the 3 blocks of stage 1" in stages_reason((4, 3, 1), 8, 2)
    assert "does not divide the 0 blocks" in stages_reason((0, 8), 8, 2)
    assert "the model has 8" in stages_reason((4, 5), 8, 1)
    s = Strategy(devices=6, tp=1, pp=3, microbatch=1, global_batch=24, ddp="after")
    with pytest.raises(PhazeError, match="cannot be split evenly over pp = 3"):
        s.check_layers(8)
    assert Strategy(**{**s.__dict__, "stages": (2, 3, 3)}).check_layers(8) == (2, 3, 3)


def test_megatron_arguments_and_layout_string():
    import re

    from phaze.step.megatron_args import megatron_arguments, pipeline_layout

    s = Strategy(
        devices=64,
        tp=8,
        pp=2,
        microbatch=1,
        global_batch=64,
        interleave=2,
        recompute="selective",
        sequence_parallel=True,
        distributed_optimizer=True,
        stages=(4, 8),
    )
    args = megatron_arguments(s, 12)
    assert args[:4] == [
        "--tensor-model-parallel-size 8",
        "--pipeline-model-parallel-size 2",
        "--micro-batch-size 1",
        "--global-batch-size 64",
    ]
    layout = pipeline_layout((4, 8), 2)
    assert f"--pipeline-model-parallel-layout {layout}" in args
    # Megatron's parser: unroll x*n, split on '|'; segment v·pp + j holds rank j's chunk v
    segments = [re.sub(r"(.)\*(\d+)", lambda m: m[1] * int(m[2]), x) for x in layout.split("|")]
    assert segments == ["Ett", "tttt", "tt", "ttttL"]
    assert {"--recompute-granularity selective", "--sequence-parallel"} <= set(args)
    assert {"--use-distributed-optimizer", "--overlap-grad-reduce"} <= set(args)
    even = Strategy(devices=64, tp=8, pp=2, microbatch=1, global_batch=64, interleave=3)
    args = megatron_arguments(even, 12)
    assert "--num-layers-per-virtual-pipeline-stage 2" in args
    assert not any("layout" in a for a in args)
