"""The step model (phaze/step): against an independent reference on random chains and networks
and on the GPU chains `phaze evaluate` prices, the schedule's closed forms and an event
simulation, the FLOP conventions, and the rejection of impossible strategies."""

import itertools
import math

import numpy as np
import pytest

from phaze.arch.presets import load_preset
from phaze.arch.presets import preset_peak_flops as peak_flops
from phaze.config import validate_config
from phaze.errors import PhazeError
from phaze.fidelity.evaluate import evaluate_strategy, gpu_chains, step_constants
from phaze.network import HierarchicalNetwork
from phaze.step.model import price
from phaze.step.simulate import simulate_1f1b
from phaze.step.strategy import PipelineSchedule, Strategy, schedule_reason, stages_reason
from tests.step_cases import (
    TINY_SEQ,
    random_chain,
    random_constants,
    random_network,
    random_torus,
    reference_price,
    tiny_gpt,
)


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


@pytest.mark.parametrize("seed", range(30))
def test_price_equals_the_reference_on_a_torus(seed):
    """On a 3D torus (TPU v4's ICI) the layout's ring form of every collective and its sends
    equal the torus's own collectives and sends over the explicit rank lists."""
    chain, _, consts, s = draw_case(seed)
    net = random_torus(np.random.default_rng(seed), s.devices)
    got = price(chain, s, net, consts, peak_flops=1.0)
    want, mem = reference_price(chain, s, net, consts)
    assert got["iteration_time_s"] == pytest.approx(want, rel=1e-12)
    assert [x["memory_bytes"] for x in got["per_stage"]] == pytest.approx(mem, rel=1e-12)
    assert math.isclose(sum(got["breakdown"].values()), got["iteration_time_s"], rel_tol=1e-12)


AWKWARD = [
    # (devices per node, t, p, d): groups of one stage that sit differently in the nodes
    (6, 4, 2, 2),  # data-parallel groups of tp rank 0 in one node, of tp rank 2 across two
    (6, 2, 3, 2),
    (3, 2, 2, 3),  # tensor-parallel groups across nodes for some replicas only
    (4, 8, 2, 1),
    (6, 4, 3, 3),
    (3, 2, 3, 1),  # a stage hand-off with one pair inside a node and one across (the slower counts)
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
# expert parallelism
# ---------------------------------------------------------------------------------------------
def draw_moe_case(seed, torus=False, etp1=False):
    """A random mixture-of-experts chain at a random ep, a network (two-level, or a torus of
    the job's size) and a valid strategy: ep dividing dp and the experts, SP with tp > 1. With
    `etp1`, tp 2 or 4 with the experts' tensor parallelism off (etp = 1): ep dividing tp·dp."""
    rng = np.random.default_rng(5000 + seed + (1000 if etp1 else 0))
    while True:
        t = int(rng.choice([2, 4] if etp1 else [1, 2]))
        experts = int(rng.choice([2, 4, 8]))
        p = int(rng.choice([1, 2, 3]))
        d = int(rng.choice([1, 2, 3, 4] if etp1 else [2, 4, 6, 8]))
        width = t * d if etp1 else d
        eps = [e for e in (1, 2, 4, 8) if experts % e == 0 and width % e == 0]
        ep = int(rng.choice(eps))
        etp = 1 if etp1 else None
        chain = random_chain(rng, int(rng.integers(p, 9)), t, 1, t > 1, ep, experts, etp)
        net = random_torus(rng, t * p * d) if torus else random_network(rng)
        stages = random_split(rng, chain.blocks, p, 1)
        kw = {
            "devices": t * p * d,
            "tp": t,
            "pp": p,
            "microbatch": 1,
            "global_batch": d * 4,
            "ep": ep,
            "etp": etp,
            "sequence_parallel": t > 1,
            "distributed_optimizer": bool(rng.random() < 0.5),
            "ddp": str(rng.choice(["overlap", "after"])),
            "recompute": str(rng.choice(["none", "selective", "full"])),
            "stages": stages,
        }
        try:
            s = Strategy(**kw)
        except PhazeError:
            continue
        if s.layers_reason(chain.blocks) == "":
            return chain, net, random_constants(rng), s


@pytest.mark.parametrize("etp1", [False, True], ids=["split", "whole"])
@pytest.mark.parametrize("torus", [False, True], ids=["two-level", "torus"])
@pytest.mark.parametrize("seed", range(30))
def test_expert_parallel_price_equals_the_reference(seed, torus, etp1):
    """ep > 1: the all-to-alls on the slowest expert-parallel group, the experts' gradients and
    optimizer state on the expert data-parallel groups (explicit rank lists of Megatron's expert
    generator in the reference). Whole experts (etp = 1, Megatron's parallel folding):
    expert-parallel groups of ep consecutive ranks, expert data-parallel groups of tp·dp/ep
    ranks ep apart."""
    chain, net, consts, s = draw_moe_case(seed, torus, etp1)
    got = price(chain, s, net, consts, peak_flops=1.0)
    want, mem = reference_price(chain, s, net, consts)
    assert got["iteration_time_s"] == pytest.approx(want, rel=1e-12)
    assert [x["memory_bytes"] for x in got["per_stage"]] == pytest.approx(mem, rel=1e-12)
    assert math.isclose(sum(got["breakdown"].values()), got["iteration_time_s"], rel_tol=1e-12)


def test_expert_tensor_parallelism_off_draws_cover_the_cases():
    seen = set()
    for seed in range(30):
        _, net, _, s = draw_moe_case(seed, etp1=True)
        seen |= {f"ep{s.ep}", f"tp{s.tp}"}
        seen |= {"ep > dp"} if s.ep > s.dp else set()
        seen |= {"edp1"} if s.ep > 1 and s.edp == 1 else set()
        seen |= {"edp>1"} if s.ep > 1 and s.edp > 1 else set()
        seen |= {"ep across nodes"} if s.ep > net.devices_per_node else set()
    assert {"ep2", "ep4", "ep8", "tp2", "tp4", "ep > dp", "edp1", "edp>1"} <= seen
    assert "ep across nodes" in seen


def test_expert_parallel_draws_cover_the_cases():
    seen = set()
    for seed in range(30):
        _, net, _, s = draw_moe_case(seed)
        seen |= {f"ep{s.ep}", "zero" if s.distributed_optimizer else "", f"ddp:{s.ddp}"}
        seen |= {"edp1"} if s.ep > 1 and s.edp == 1 else set()
        seen |= {"edp>1"} if s.ep > 1 and s.edp > 1 else set()
        seen |= {"tp2"} if s.tp > 1 and s.ep > 1 else set()
        seen |= {"ep across nodes"} if s.ep * s.tp > net.devices_per_node and s.ep > 1 else set()
        seen |= {"empty end stage"} if s.pp > 1 and 0 in (s.stages[0], s.stages[-1]) else set()
    assert {"ep2", "ep4", "ep8", "zero", "ddp:overlap", "ddp:after", "edp1", "edp>1"} <= seen
    assert {"tp2", "ep across nodes", "empty end stage"} <= seen


def test_expert_parallelism_divides_expert_memory_and_adds_all_to_all():
    """Closed forms on a flat link: expert weights and their state divided by ep (state sharded
    by dp/ep under the distributed optimizer), the dispatch/combine all-to-alls at
    (g−1)/g·S/B + (g−1)·L each, and the experts' gradients all-reduced over dp/ep ranks."""
    from dataclasses import replace

    from phaze.network import LinkLevel
    from phaze.step.layers import ChainCost, LayerCost
    from phaze.step.model import StepConstants

    B_, L_ = 2.0, 0.01
    net = HierarchicalNetwork.flat(LinkLevel(B_, L_), 64)
    consts = StepConstants(16, 12, 2, 2, 0, 0, 1e9, 1.0, True)
    dense, experts_all, S = 3.0, 40.0, 5.0
    zero = LayerCost(0.0, 0.0, 0.0, 0.0)

    def chain(ep):
        block = LayerCost(
            fwd_s=1.0,
            bwd_s=2.0,
            params=dense + experts_all / ep,
            activation_bytes=0.0,
            expert_params=experts_all / ep,
            fwd_collectives=(("all_to_all", S), ("all_to_all", S)),
            bwd_collectives=(("all_to_all", S), ("all_to_all", S)),
        )
        return ChainCost(zero, block, zero, 4, 1, 1, False, 0.0, ep=ep, experts=8)

    out = {}
    for ep in (1, 2, 4, 8):
        for zero_opt in (False, True):
            s = Strategy(
                devices=8,
                tp=1,
                pp=1,
                microbatch=1,
                global_batch=8,
                ep=ep,
                distributed_optimizer=zero_opt,
                ddp="after",
            )
            out[ep, zero_opt] = price(chain(ep), s, net, consts, 1.0)
    for ep in (1, 2, 4, 8):
        edp = 8 // ep
        mem = out[ep, False]["peak_memory_bytes"]
        assert mem == pytest.approx(4 * 16 * (dense + experts_all / ep))
        sharded = out[ep, True]["peak_memory_bytes"]
        want = 4 * (dense * (4 + 12 / 8) + experts_all / ep * (4 + 12 / edp))
        assert sharded == pytest.approx(want)
        a2a = 4 * ((ep - 1) / ep * S / B_ + (ep - 1) * L_) if ep > 1 else 0.0
        assert out[ep, False]["breakdown"]["expert_parallel_comm_s"] == pytest.approx(
            4 * a2a
        )  # 4 blocks, m = 1
        # full recomputation runs the forward's dispatch and combine again
        s = Strategy(devices=8, tp=1, pp=1, microbatch=1, global_batch=8, ep=ep, recompute="full")
        full = price(chain(ep), s, net, consts, 1.0)["breakdown"]["expert_parallel_comm_s"]
        assert full == pytest.approx(4 * a2a * 6 / 4)
        ar = lambda size, g: 2 * ((g - 1) / g * size / B_ + (g - 1) * L_) if g > 1 else 0.0
        want_dp = ar(2 * 4 * dense, 8) + ar(2 * 4 * experts_all / ep, edp)
        assert out[ep, False]["breakdown"]["data_parallel_comm_s"] == pytest.approx(want_dp)
    # a dense chain cannot take ep > 1; ep must divide the experts and dp
    with pytest.raises(PhazeError, match="needs a mixture-of-experts model"):
        s = Strategy(devices=8, tp=1, pp=1, microbatch=1, global_batch=8, ep=2)
        price(
            replace(chain(1), experts=0, block=replace(chain(1).block, expert_params=0)),
            Strategy(devices=8, tp=1, pp=1, microbatch=1, global_batch=8, ep=2),
            net,
            consts,
            1,
        )
    with pytest.raises(PhazeError, match="must divide the 6 experts"):
        Strategy(devices=8, tp=1, pp=1, microbatch=1, global_batch=8, ep=4).check_experts(6)
    with pytest.raises(PhazeError, match=r"must divide the data-parallel size dp \(4\)"):
        Strategy(devices=8, tp=2, pp=1, microbatch=1, global_batch=8, ep=8)
    with pytest.raises(PhazeError, match="needs sequence parallelism"):
        Strategy(devices=8, tp=2, pp=1, microbatch=1, global_batch=8, ep=2).check_experts(8)


# ---------------------------------------------------------------------------------------------
# the GPU evaluation (phaze.fidelity.evaluate) is this model on kernel-sum layer times
# ---------------------------------------------------------------------------------------------
SEQ = TINY_SEQ
CFG = validate_config({})
A100 = load_preset("a100-80gb")


def tiny_gpt_tanh():
    return tiny_gpt(activation="gelu_pytorch_tanh")


GPU_CASES = [
    {"devices": 16, "tp": 2, "pp": 2, "microbatch": 2, "global_batch": 32, "ddp": "after"},
    {"devices": 16, "tp": 2, "pp": 4, "microbatch": 1, "global_batch": 32, "interleave": 2},
    {"devices": 32, "tp": 1, "pp": 1, "microbatch": 4, "global_batch": 128, "recompute": "full"},
    {
        "devices": 48,
        "tp": 2,
        "pp": 2,
        "microbatch": 1,
        "global_batch": 48,
        "sequence_parallel": True,
        "recompute": "selective",
        "distributed_optimizer": True,
    },
    {"devices": 24, "tp": 4, "pp": 2, "microbatch": 1, "global_batch": 24, "stages": (3, 5)},
    {"devices": 64, "tp": 8, "pp": 4, "microbatch": 1, "global_batch": 64, "interleave": 2},
]


@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_gpu_evaluation_equals_the_reference_on_its_chains(case):
    """`phaze evaluate`'s numbers are the model's on the GPU chains (kernel sums, trace memory):
    checked against the independent reference, on the preset's DGX network."""
    spec = tiny_gpt_tanh()
    s = Strategy(**case)
    got = evaluate_strategy(spec, s, A100, seq=SEQ, config=CFG)
    chain = gpu_chains(spec, s.tp, s.microbatch, SEQ, A100, CFG)[s.sequence_parallel]
    net = HierarchicalNetwork.from_preset(A100["network"])
    want, mem = reference_price(chain, s, net, step_constants(A100, CFG))
    assert got["iteration_time_s"] == pytest.approx(want, rel=1e-12)
    assert got["peak_memory_bytes"] == pytest.approx(max(mem), rel=1e-12)
    assert got["fits_memory"] is True


def test_tpuv4_evaluation_runs_on_its_ici_torus():
    """`phaze evaluate --arch tpuv4`: the step model on the slice of the ICI torus the job gets
    (64 chips = one 4x4x4 cube with wraparound), checked against the reference on that torus,
    and slower than on an ideal network would be."""
    from phaze.network import TorusNetwork

    tpu = load_preset("tpuv4")
    spec = tiny_gpt_tanh()
    s = Strategy(devices=64, tp=4, pp=2, microbatch=1, global_batch=64, interleave=2)
    got = evaluate_strategy(spec, s, tpu, seq=SEQ, config=CFG, name="tpuv4")
    net = TorusNetwork.for_devices(tpu["network"], 64, "tpuv4")
    assert net.dims == (4, 4, 4) and all(net.wraps)
    chain = gpu_chains(spec, s.tp, s.microbatch, SEQ, tpu, CFG)[False]
    want, mem = reference_price(chain, s, net, step_constants(tpu, CFG))
    assert got["iteration_time_s"] == pytest.approx(want, rel=1e-12)
    assert got["peak_memory_bytes"] == pytest.approx(max(mem), rel=1e-12)
    assert got["breakdown"]["tensor_parallel_comm_s"] > 0


def test_model_flops_are_three_passes_and_hardware_flops_count_recomputation():
    spec = tiny_gpt_tanh()
    out = {}
    for mode in ("none", "selective", "full"):
        s = Strategy(devices=16, tp=2, pp=2, microbatch=2, global_batch=32, recompute=mode)
        out[mode] = evaluate_strategy(spec, s, A100, seq=SEQ, config=CFG)
    # GPT: forward matmul FLOPs per sequence = 2·P_matmul·s + 4·s²·h per block, plus the logits
    B, s, L, h, V = 32, SEQ, 8, 256, 1024
    fwd = L * (24 * h * h * s + 4 * s * s * h) + 2 * s * h * V
    assert out["none"]["model_flops"] == pytest.approx(3 * B * fwd, rel=1e-9)
    assert out["none"]["hardware_flops"] == out["none"]["model_flops"]
    assert out["selective"]["hardware_flops"] == pytest.approx(
        out["selective"]["model_flops"] + B * L * 4 * s * s * h, rel=1e-9
    )  # QKᵀ and ×V again
    assert out["full"]["hardware_flops"] == pytest.approx(
        out["full"]["model_flops"] + B * L * (24 * h * h * s + 4 * s * s * h), rel=1e-9
    )
    peak = peak_flops(A100)
    for r in out.values():
        assert r["mfu"] == pytest.approx(
            r["model_flops"] / (16 * r["iteration_time_s"] * peak), rel=1e-12
        )
        assert r["hfu"] >= r["mfu"]
    assert out["none"]["iteration_time_s"] < out["full"]["iteration_time_s"]


# ---------------------------------------------------------------------------------------------
# the schedule
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p,m", [(1, 1), (2, 2), (2, 5), (4, 4), (4, 9), (3, 7)])
def test_1f1b_matches_an_event_simulation(p, m):
    total, bubble = PipelineSchedule(p, 1, m).iteration_time([3.0] * p)
    assert math.isclose(total, simulate_1f1b([1.0] * p, [2.0] * p, m))
    assert math.isclose(bubble / (m * 3.0), (p - 1) / m)


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 8), (8, 2, 16)])
def test_interleaved_bubble_and_first_rank_memory_closed_forms(p, v, m):
    _, bubble = PipelineSchedule(p, v, m).iteration_time([3.0] * p)
    assert math.isclose(bubble / (m * 3.0), (p - 1) / (v * m))
    assert math.isclose(PipelineSchedule(p, v, m).inflight(0), p * (1 + (p - 1) / (p * v)))


def test_unequal_stages_are_set_by_the_slowest():
    total, bubble = PipelineSchedule(3, 1, 10).iteration_time([1.0, 2.0, 1.5])
    assert math.isclose(total, 10 * 2.0 + 2.5) and math.isclose(bubble, 2.5)


def test_megatrons_rank_layout():
    s = Strategy(devices=64, tp=8, pp=2, microbatch=2, global_batch=64)
    assert (s.dp, s.microbatches) == (4, 8)
    assert s.tp_group(0, 1) == list(range(32, 40))
    assert s.dp_group(3, 0) == [3, 11, 19, 27]


def test_schedule_sends_and_inflight():
    s = PipelineSchedule(4, 1, 8)
    assert [s.sends(j) for j in range(4)] == [(1, 0), (1, 1), (1, 1), (0, 1)]
    assert [s.inflight(j) for j in range(4)] == [4, 3, 2, 1]
    v = PipelineSchedule(4, 3, 8)
    assert [v.sends(j) for j in (0, 3)] == [(3, 2), (2, 3)]
    assert math.isclose(v.inflight(0), 4 * (1 + 3 / 12))
    assert PipelineSchedule(1, 1, 5).sends(0) == (0, 0)
    # fewer microbatches than stages: only m are ever in flight; interleaved with m == p,
    # Megatron runs every chunk's forward first (all m·V chunk forwards in flight)
    assert PipelineSchedule(4, 1, 2).inflight(0) == 2
    assert PipelineSchedule(4, 3, 4).inflight(0) == 4


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


def test_a_schedules_per_rank_arrays_are_its_per_rank_methods():
    """sends_all / inflight_all (what StageTerms reads) against sends / inflight rank by rank."""
    n = 0
    for p, v, m in itertools.product(range(1, 9), range(1, 5), range(1, 40)):
        if schedule_reason(p, v, m):
            continue
        s = PipelineSchedule(p, v, m)
        sends = np.array([s.sends(j) for j in range(p)], dtype=float)
        inflight = np.array([s.inflight(j) for j in range(p)], dtype=float)
        assert np.array_equal(s.sends_all(), sends) and np.array_equal(s.inflight_all(), inflight)
        n += 1
    assert n > 300
