"""Operator cost model and the estimate stage (issue 3)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from phaze.arch.presets import load_preset
from phaze.cli import main
from phaze.estimate import (
    collective_latency,
    core_time,
    default_costmodel,
    hbm_traffic_bytes,
    matmul_cost,
    matmul_latency,
    vector_latency,
)
from phaze.estimate.model import core_cost, tile_cost
from phaze.estimate.stage import estimate, op_base_name
from phaze.io.tables import read_table, write_table

DATA = Path(__file__).parent / "data"
MiB = 2**20


@pytest.fixture(scope="module")
def cm():
    return default_costmodel()


@pytest.fixture(scope="module")
def tpu():
    a = load_preset("tpuv4")["arch"]
    return {**a, "peak_flops": 2.0 * a["n_tc"] * a["tc_width"] * a["tc_depth"] * a["freq_hz"]}


def fixture_ops() -> pd.DataFrame:
    ops = pd.read_csv(DATA / "estimate_ops.csv")
    ops["collective"] = ops["collective"].fillna("")
    # the trace's core-attention / replicated-region flags (not read by the estimate)
    for flag in ("attention", "replicated"):
        if flag not in ops.columns:
            ops[flag] = False
    return ops


def small_space() -> pd.DataFrame:
    rows = [
        {
            "arch": "a",
            "n_tc": 8,
            "n_vc": 2,
            "tc_width": 128,
            "tc_depth": 128,
            "vc_width": 128,
            "glb_bytes": 128 * MiB,
            "freq_hz": 1.05e9,
        },
        {
            "arch": "b",
            "n_tc": 64,
            "n_vc": 16,
            "tc_width": 16,
            "tc_depth": 32,
            "vc_width": 16,
            "glb_bytes": 2 * MiB,
            "freq_hz": 1.05e9,
        },
        {
            "arch": "c",
            "n_tc": 1,
            "n_vc": 1,
            "tc_width": 4,
            "tc_depth": 2,
            "vc_width": 4,
            "glb_bytes": 8 * MiB,
            "freq_hz": 2.0e9,
        },
    ]
    df = pd.DataFrame(rows)
    df["area_mm2"] = 1.0
    df["peak_flops"] = 2.0 * df.n_tc * df.tc_width * df.tc_depth * df.freq_hz
    df["tc_local_buffer_bytes"] = np.maximum(df.tc_width * df.tc_depth * 16, 1024)
    df["costmodel_overrides"] = ""
    return df


# --- the GEMM and core figures the cost model must reach -----------------------------------------
def test_large_gemm_on_tpuv4_reaches_85_percent_of_peak(tpu, cm):
    t, bound = matmul_latency(8192, 8192, 8192, 1, tpu, cm, n_cores=tpu["n_tc"])
    utilisation = 2 * 8192**3 / t / tpu["peak_flops"]
    assert utilisation >= 0.85 and bound == "compute"


def test_skinny_gemm_is_hbm_bound(tpu, cm):
    t, bound = matmul_latency(1, 8192, 8192, 1, tpu, cm, n_cores=tpu["n_tc"])
    assert bound == "hbm"
    # it reads the whole 8192x8192 bf16 weight once, no more
    assert t == pytest.approx(8192 * 8192 * 2 / cm["hbm_bandwidth_Bps"], rel=1e-3)
    # on ONE core the same op is limited by loading 4096 weight tiles (128 cycles each)
    one = matmul_cost(1, 8192, 8192, 1, tpu, cm, 1)
    assert one["bound"] == "compute"
    assert one["compute_s"] == pytest.approx((64 * 64 * 128 + 254) / 1.05e9)


# --- exact small cases ------------------------------------------------------------------------
def test_one_tile_cycle_count_by_hand(cm):
    # a 5-row x 4-column tile (2 column tiles of d = 2) of 5x3 · 3x3 on a 2x2 array:
    # ceil(3/2) * 2 = 4 weight tiles of max(5 rows, 2 load) = 5 cycles
    cyc, glb, out = tile_cost(5, 3, 3, 2, 2, 5, 4, cm)
    assert cyc == 20
    # weights once (3x3: the padded 4th column moves nothing), the rows once per column tile,
    # the output once
    assert out == 2 * 5 * 3 and glb == 2 * (3 * 3 + 5 * 3 * 2) + out
    # without weight double-buffering every weight tile pays load + rows + skew: 4 * (5 + 4 + 0)
    no_overlap = {**cm, "weight_load_overlapped": False}
    assert tile_cost(5, 3, 3, 2, 2, 5, 4, no_overlap)[0] == 4 * (5 + 2 * 2 + 2 - 2)
    # fewer rows than the array is wide: the weight load (w cycles) is not hidden
    assert tile_cost(1, 3, 3, 2, 2, 1, 4, cm)[0] == 4 * 2
    # a 3-column tile on a d = 2 array still takes 2 column tiles
    assert tile_cost(5, 3, 3, 2, 2, 5, 3, cm)[0] == 20


def test_best_tiling_by_hand(cm):
    # 5x3 · 3x3 on ONE 2x2 core: B stationary = one 5x4 tile (20 cycles) + skew 2 = 22;
    # A stationary = one 3-row x 6-column tile: ceil(3/2) * 3 weight tiles of 3 rows = 18 + 2 = 20
    c = core_cost(5, 3, 3, 1, 2, 2, 1024, 1e9, cm, 1)
    assert c["compute_s"] == pytest.approx(20e-9)
    assert not c["b_stationary"] and (c["tile_m"], c["tile_n"], c["tiles"]) == (6, 3, 1)
    _, compute_s, _ = core_time(5, 3, 3, 1, 2, 2, 1024, 1e9, cm, 1)
    assert compute_s == pytest.approx(20e-9)
    # without weight double-buffering: B stationary 4 * (5 + 4) = 36 cycles and no separate
    # skew (each weight tile pays its own); A stationary 6 * (3 + 4) = 42
    no_overlap = {**cm, "weight_load_overlapped": False}
    assert core_time(5, 3, 3, 1, 2, 2, 1024, 1e9, no_overlap, 1)[1] == pytest.approx(36e-9)


def test_tile_edges_cost_whole_tiles(cm):
    # 3x2 · 2x3 on one 2x2 core: 3 stationary columns pad to 4 in either orientation:
    # 2 weight tiles of 3 rows = 6 cycles + skew 2, where 3*3*2 MACs / 4 PEs would be 4.5 + 2
    assert core_time(3, 3, 2, 1, 2, 2, 1024, 1e9, cm, 1)[1] == pytest.approx(8e-9)


def test_wave_quantization_by_hand(cm):
    # 2x20 · 20x6 on 2x2 cores: 3 tiles of 2x2 outputs, each ceil(20/2) = 10 weight tiles of
    # 2 rows = 20 cycles. 3 cores: one wave, 20 + 2. 2 cores: two waves (or larger tiles of
    # the same total), 40 + 2 — not 2/3 of the way from 3 cores' time to one core's.
    def cycles(p):
        return core_time(2, 6, 20, 1, 2, 2, 1024, 1e9, cm, p)[1] * 1e9

    assert cycles(3) == pytest.approx(22)
    assert cycles(2) == pytest.approx(42)
    assert cycles(1) == pytest.approx(62)
    # a batch of 3 such GEMMs is 9 tiles: 3 waves on 3 cores, 5 on 2 (ceil(9/2))
    assert core_time(2, 6, 20, 3, 2, 2, 1024, 1e9, cm, 3)[1] * 1e9 == pytest.approx(62)
    assert core_time(2, 6, 20, 3, 2, 2, 1024, 1e9, cm, 2)[1] * 1e9 == pytest.approx(102)


def test_partial_sum_chunking_limits_the_tile_rows(cm):
    # local buffer 1 KiB, half for fp32 sums of 2 columns -> at most 64 rows per tile. 200x2 · 2x2
    # on one 2x2 core: 64-row tiles need 4 tiles (256 rows of work); 8-row tiles 25 (200 rows),
    # each reloading the 2x2 weight tile: 200 + skew 2 cycles
    c = core_cost(200, 2, 2, 1, 2, 2, 1024, 1e9, cm, 1)
    assert c["compute_s"] == pytest.approx(202e-9)
    assert c["b_stationary"] and (c["tile_m"], c["tiles"]) == (8, 25)
    # bytes: per tile weights 2x2, 8 rows x 2, outputs 8x2 -> 25 * 36 elements of 2 bytes
    assert c["glb_s"] == pytest.approx(25 * 36 * 2 / cm["glb_bandwidth_Bps"])


def test_output_tile_reuse_and_its_accumulators_by_hand(cm):
    # 4x2 · 2x4 on one 2x2 core, a GLB port of 1 MB/s (GLB-bound). Weight-stationary reuse: the 4
    # streamed rows cross the port once per 2-wide column block, so any tiling moves 80 B (e.g.
    # two 4x2 tiles: 2 x (2·2 weights + 4·2 rows + 4·2 outputs) x 2 B)
    slow = {**cm, "glb_bandwidth_Bps": 1e6}
    column = core_cost(4, 4, 2, 1, 2, 2, 1024, 1e9, {**slow, "glb_reuse": "column_block"}, 1)
    assert column["glb_s"] == pytest.approx(80e-6)
    # a GPU thread block reuses its staged panels: one 4x4 tile reads each operand once,
    # (2·4 + 4·2 + 4·4) x 2 B = 64 B
    tile = core_cost(4, 4, 2, 1, 2, 2, 1024, 1e9, {**slow, "glb_reuse": "output_tile"}, 1)
    assert tile["glb_s"] == pytest.approx(64e-6)
    assert (tile["tile_m"], tile["tile_n"], tile["tiles"]) == (4, 4, 1)
    # ...but all of a tile's fp32 sums are live at once: a 32 B local buffer (half for sums) holds
    # 4 of them, so the tiles are 2x2 (4 tiles of (2·2 + 2·2 + 2·2) x 2 B = 96 B)
    small = core_cost(4, 4, 2, 1, 2, 2, 32, 1e9, {**slow, "glb_reuse": "output_tile"}, 1)
    assert small["glb_s"] == pytest.approx(96e-6)
    assert small["tile_m"] * small["tile_n"] <= 4 and small["tiles"] == 4


def test_hbm_efficiency_scales_every_hbm_term(cm, tpu):
    half = {**cm, "hbm_efficiency": 0.5}
    # an HBM-bound element-wise op and an HBM-bound GEMM (m = 1) take twice as long
    full_v, bound = vector_latency(1e6, 4e9, 1, tpu, cm, 2)
    assert bound == "hbm" and vector_latency(1e6, 4e9, 1, tpu, half, 2)[0] == pytest.approx(
        2 * full_v
    )
    full_mm = matmul_cost(1, 8192, 8192, 1, tpu, cm, 8)
    slow_mm = matmul_cost(1, 8192, 8192, 1, tpu, half, 8)
    assert full_mm["bound"] == "hbm" and slow_mm["hbm_s"] == pytest.approx(2 * full_mm["hbm_s"])
    assert slow_mm["latency_s"] == pytest.approx(2 * full_mm["latency_s"])


def test_a_presets_local_buffer_is_the_same_in_every_stage():
    # a100-80gb sets its SMs' register file as the local buffer (costmodel.tc_local_buffer_bytes);
    # the space table, `estimate --matmul` and `evaluate` all cost its GEMMs with it
    from phaze.arch.space import build_space
    from phaze.config import validate_config
    from phaze.estimate.matmul import matmul_report
    from phaze.fidelity.compute import gpu_core, preset_costmodel

    config = validate_config({"arch": {"presets": ["a100-80gb", "tpuv4"]}})
    space, _ = build_space(config)
    lb = space.set_index("preset")["tc_local_buffer_bytes"]
    assert lb["a100-80gb"] == 262144 and lb["tpuv4"] == 128 * 128 * 16
    a100 = load_preset("a100-80gb")
    cm = preset_costmodel(a100, config["costmodel"])
    core = gpu_core(a100, cm)
    assert core["tc_local_buffer_bytes"] == 262144
    direct = matmul_cost(4096, 4096, 4096, 1, core, cm, 108)
    report = matmul_report(4096, 4096, 4096, 1, "a100-80gb", config)
    assert report["latency_s"] == pytest.approx(float(direct["latency_s"]), rel=1e-12)


def test_tile_write_back_clock_and_mainloop_by_hand(cm):
    # one 2x2 tile of 2x20 · 20x2 on a 2x2 core at 1 GHz: 10 weight tiles of 2 rows + skew = 22
    base = {**cm, "glb_bandwidth_Bps": 1e10}
    assert core_time(2, 2, 20, 1, 2, 2, 1024, 1e9, base, 1)[1] == pytest.approx(22e-9)
    # not overlapped: + its 2x2 bf16 outputs (8 B) through the 10 GB/s port = 0.8 ns
    serial = {**base, "output_tile_overlapped": False}
    assert core_time(2, 2, 20, 1, 2, 2, 1024, 1e9, serial, 1)[1] == pytest.approx(22.8e-9)
    # 2x20 · 20x6 on 2 cores (42 cycles, see the wave case): the busiest core writes back 16 B,
    # as two 2x2 tiles or one 2x4 / 4x2 tile
    assert core_time(2, 6, 20, 1, 2, 2, 1024, 1e9, serial, 2)[1] == pytest.approx(43.6e-9)
    # a row every 2 cycles (mainloop 0.5) at half the clock: (20 / 0.5 + 2) / 0.5 GHz = 84 ns;
    # the GLB port runs at the same (halved) clock
    slow = {**base, "matmul_mainloop_fraction": 0.5, "matmul_clock_fraction": 0.5}
    _, compute_s, glb_s = core_time(2, 2, 20, 1, 2, 2, 1024, 1e9, slow, 1)
    assert compute_s == pytest.approx(84e-9)
    glb_bytes = 2 * (20 * 2 + 2 * 20 + 2 * 2)
    assert glb_s == pytest.approx(glb_bytes / 0.5e10)


def test_issue_time_is_a_floor(cm, tpu):
    launch = {**cm, "op_issue_s": 1e-5}
    c = matmul_cost(64, 64, 64, 1, tpu, launch, 8)
    assert c["latency_s"] == 1e-5 and c["bound"] == "issue" and c["compute_s"] < 1e-5
    big = matmul_cost(8192, 8192, 8192, 1, tpu, launch, 8)
    assert big["latency_s"] == big["compute_s"] and big["bound"] == "compute"
    # an empty GEMM is not launched
    assert matmul_cost(0, 64, 64, 1, tpu, launch, 8)["latency_s"] == 0
    v, bound = vector_latency(10, 40, 1, tpu, launch, 2)
    assert v == 1e-5 and bound == "issue"
    assert vector_latency(0, 0, 1, tpu, launch, 2)[0] == 0


def test_an_empty_gemm_moves_nothing_and_divides_nothing_by_zero(cm):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a 0/0 block count would be a NaN the result hides
        got = hbm_traffic_bytes(np.array([0, 64, 64]), np.array([64, 0, 64]), 0, 1, MiB, cm)
    assert list(got) == [0, 0, 0]


def test_hbm_traffic_compulsory_when_it_fits_and_more_when_it_does_not(cm):
    m, n, k = 1024, 1024, 1024
    compulsory = 2 * (m * k + k * n + m * n)
    assert hbm_traffic_bytes(m, n, k, 1, 128 * MiB, cm) == compulsory
    small = hbm_traffic_bytes(m, n, k, 1, 1 * MiB, cm)
    assert small > compulsory
    # brute force over every power-of-two blocking that fits: nothing beats the model's choice
    best = np.inf
    for tm in 2 ** np.arange(11):
        for tn in 2 ** np.arange(11):
            for tk in 2 ** np.arange(11):
                if 2 * 2 * tk * (tm + tn) + 4 * tm * tn > 1 * MiB:
                    continue
                a = 1 if (tm == m and tk == k) else n // tn
                b = 1 if (tn == n and tk == k) else m // tm
                best = min(best, 2 * (m * k * a + k * n * b + m * n))
    assert small == best


def test_vector_and_collective_formulas(cm, tpu):
    t, _bound = vector_latency(1e6, 4e6, 3, tpu, cm, n_cores=2)
    compute = np.ceil(1e6 / (tpu["vc_width"] * 2)) * 3 / 1.05e9
    assert t == pytest.approx(
        max(compute, 4e6 / cm["hbm_bandwidth_Bps"], 4e6 / (2 * cm["glb_bandwidth_Bps"]))
    )
    b, tp = 4 * MiB, 4
    expect = 2 * (tp - 1) / tp * b / cm["link_bandwidth_Bps"] + 2 * (tp - 1) * cm["link_latency_s"]
    assert collective_latency(b, tp, cm) == pytest.approx(expect)
    assert collective_latency(b, 1, cm) == 0
    assert collective_latency(b, tp, cm, "all_gather") == pytest.approx(expect / 2)
    with pytest.raises(ValueError):
        collective_latency(b, tp, cm, "broadcast")


def test_non_power_of_two_core_counts_use_all_cores(cm):
    # 108 cores of 32x32 (an A100's SMs): 4096^3 in 64x32 tiles is 8192 tiles, 76 per core
    sm = {"tc_width": 32, "tc_depth": 32, "glb_bytes": 40e6, "freq_hz": 1.41e9}
    t, _ = matmul_latency(4096, 4096, 4096, 1, sm, cm, n_cores=108)
    peak = 2 * 108 * 1024 * 1.41e9
    assert 2 * 4096**3 / t / peak > 0.99


def test_op_base_name():
    assert op_base_name("aten._softmax.default") == "_softmax"
    assert op_base_name("aten::gelu") == "gelu"
    assert op_base_name("native_layer_norm") == "native_layer_norm"


# --- the stage -----------------------------------------------------------------------------
def test_stage_matches_the_public_api(cm):
    ops, space = fixture_ops(), small_space()
    out = estimate(ops, space, cm)
    assert len(out) == len(ops) * len(space)
    assert list(out.arch.unique()) == ["a", "b", "c"]
    for _, arch in space.iterrows():
        core = arch.to_dict()
        rows = out[out.arch == arch.arch].reset_index(drop=True)
        for i, op in ops.iterrows():
            row = rows.iloc[i]
            assert (row.signature, row["pass"], row.op) == (op.signature, op["pass"], op.op)
            if op.kind == "matmul":
                want_all, b_all = matmul_latency(op.m, op.n, op.k, op.batch, core, cm, arch.n_tc)
                want_one, _ = matmul_latency(op.m, op.n, op.k, op.batch, core, cm, 1)
                fused = ops[
                    (ops.signature == op.signature)
                    & (ops["pass"] == op["pass"])
                    & (ops.fused_into == op.op)
                ]
                for _, f in fused.iterrows():  # the matmul pays its fused consumers' compute
                    cpe = cm["vector_cycles_per_element"].get(op_base_name(f.aten), 1)
                    want_all += (
                        np.ceil(f.elements / (arch.vc_width * arch.n_vc)) * cpe / arch.freq_hz
                    )
                    want_one += np.ceil(f.elements / arch.vc_width) * cpe / arch.freq_hz
                assert row.latency_allcores_s == pytest.approx(want_all, rel=1e-12)
                assert row.latency_1core_s == pytest.approx(want_one, rel=1e-12)
                assert row.bound == b_all
            elif op.fused_into >= 0:
                assert row.latency_allcores_s == 0 and row.bound == "fused"
            elif op.kind == "vector":
                cpe = cm["vector_cycles_per_element"].get(op_base_name(op.aten), 1)
                want, _ = vector_latency(
                    op.elements, op.bytes_in + op.bytes_out, cpe, core, cm, arch.n_vc
                )
                assert row.latency_allcores_s == pytest.approx(want, rel=1e-12)
            elif op.kind == "collective":
                assert (
                    row.latency_allcores_s
                    == pytest.approx(collective_latency(op.bytes_in, op.group_size, cm))
                    and row.bound == "link"
                )
            else:
                assert row.latency_allcores_s == 0 and row.bound == "none"
    assert (out.latency_allcores_s <= out.latency_1core_s * (1 + 1e-12)).all()


def _collective_seconds(presets, cm, place):
    """(the fixture's first collective: bytes, group; its seconds per arch) on a space whose
    first archs carry the given preset names (and the presets' own costmodel overrides)."""
    ops = fixture_ops()
    coll = ops[ops.kind == "collective"].iloc[0]
    space = small_space().iloc[: len(presets)].copy()
    space["preset"] = presets
    space["costmodel_overrides"] = [
        json.dumps(load_preset(p)["costmodel"], sort_keys=True) if p else "" for p in presets
    ]
    out = estimate(ops, space, cm, place)
    sel = (out.signature == coll.signature) & (out["pass"] == coll["pass"]) & (out.op == coll.op)
    seconds = out.loc[sel].set_index("arch")["latency_allcores_s"]
    return float(coll.bytes_in), int(coll.group_size), seconds


def test_tensor_parallel_collectives_run_on_the_architectures_network(cm):
    # one pricing of a collective (phaze.network): a preset with a `network:` section on its
    # intra-node level (efficiency and per-step latency included), a grid point on the flat
    # costmodel link unless place.network is set; place.preset_networks false drops the former
    from phaze.config import schema_defaults
    from phaze.network import HierarchicalNetwork, ring_seconds

    a100 = load_preset("a100-80gb")
    place = schema_defaults()["place"]
    size, group, t = _collective_seconds(["a100-80gb", ""], cm, place)
    own = HierarchicalNetwork.from_preset(a100["network"]).all_reduce(size, range(group))
    level = a100["network"]["intra_node"]
    by_hand = (
        2 * (group - 1) / group * size / (level["bandwidth_Bps"] * level["efficiency"])
        + 2 * (group - 1) * level["latency_s"]
    )

    def flat_ring(link_cm):
        return float(
            ring_seconds(
                "all_reduce", size, group, link_cm["link_bandwidth_Bps"], link_cm["link_latency_s"]
            )
        )

    assert t["a"] == pytest.approx(own) == pytest.approx(by_hand)
    assert t["b"] == pytest.approx(flat_ring(cm))
    slow = {
        "devices_per_node": 8,
        "intra_node": {"bandwidth_Bps": 1e9, "latency_s": 1e-5, "efficiency": 0.5},
        "inter_node": {"bandwidth_Bps": 1e8, "latency_s": 1e-5},
    }
    _, _, t = _collective_seconds(["a100-80gb", ""], cm, {**place, "network": slow})
    assert t["a"] == pytest.approx(own)
    assert t["b"] == pytest.approx(2 * (group - 1) / group * size / 0.5e9 + 2 * (group - 1) * 1e-5)
    _, _, t = _collective_seconds(["a100-80gb", ""], cm, {**place, "preset_networks": False})
    assert t["a"] == pytest.approx(flat_ring(a100["costmodel"]))
    assert t["b"] == pytest.approx(flat_ring(cm))


def test_tpuv4_collectives_run_on_its_ici_torus(cm):
    # the tpuv4 preset's network is a 3D torus: a tensor-parallel group of t consecutive chips
    # lies along x of the slice the largest place.devices gets (1024 chips: 8 x 8 x 16)
    from phaze.config import schema_defaults
    from phaze.network import TorusNetwork

    size, group, t = _collective_seconds(["tpuv4"], cm, schema_defaults()["place"])
    ici = TorusNetwork.for_devices(load_preset("tpuv4")["network"], 1024, "tpuv4")
    assert ici.dims == (8, 8, 16)
    want = ici.all_reduce(size, range(group))
    assert t["a"] == pytest.approx(want)
    # group 2 on x is one link used both ways: 2 x (S/2 / 45 GB/s + 1 us)
    assert want == pytest.approx(2 * (size / 2 / 45e9 + 1e-6))


def test_stage_applies_preset_costmodel_overrides(cm):
    ops, space = fixture_ops(), small_space()
    space.loc[0, "costmodel_overrides"] = '{"hbm_bandwidth_Bps": 1e9}'
    out = estimate(ops, space, cm)
    slow, base = out[out.arch == "a"], estimate(ops, small_space(), cm)
    base = base[base.arch == "a"]
    assert (slow.latency_allcores_s.to_numpy() >= base.latency_allcores_s.to_numpy()).all()
    assert slow.latency_allcores_s.sum() > 10 * base.latency_allcores_s.sum()
    # the other architectures are untouched
    other = out[out.arch != "a"].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        other, estimate(ops, small_space(), cm).query("arch != 'a'").reset_index(drop=True)
    )


def test_cli_end_to_end_and_errors(tmp_path, capsys):
    trace = tmp_path / "trace"
    trace.mkdir()
    fixture_ops().to_parquet(trace / "ops.parquet")
    space = small_space()
    write_table(space, tmp_path / "space.parquet", "space")
    chunks = pd.DataFrame({"arch": ["a", "b", "c"], "chunk": [0, 0, 1]})
    chunks.to_parquet(tmp_path / "chunks.parquet")
    out = tmp_path / "lat.parquet"
    rc = main(
        [
            "estimate",
            "--trace",
            str(trace),
            "--space",
            str(tmp_path / "space.parquet"),
            "--chunks",
            str(tmp_path / "chunks.parquet"),
            "--chunk",
            "0",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    lat = read_table(out, "latency")
    assert set(lat.arch) == {"a", "b"} and len(lat) == 2 * len(fixture_ops())

    broken = fixture_ops().drop(columns=["fused_into"])
    broken.to_parquet(trace / "ops.parquet")
    rc = main(
        [
            "estimate",
            "--trace",
            str(trace),
            "--space",
            str(tmp_path / "space.parquet"),
            "--out",
            str(out),
        ]
    )
    assert rc == 2 and "missing columns ['fused_into']" in capsys.readouterr().err
    bad = fixture_ops()
    bad.loc[1, "m"] = np.nan
    bad.to_parquet(trace / "ops.parquet")
    rc = main(
        [
            "estimate",
            "--trace",
            str(trace),
            "--space",
            str(tmp_path / "space.parquet"),
            "--out",
            str(out),
        ]
    )
    assert rc == 2 and "matmul ops need" in capsys.readouterr().err
    bad = fixture_ops()
    bad.loc[1, "batch"] = 0
    bad.to_parquet(trace / "ops.parquet")
    rc = main(
        [
            "estimate",
            "--trace",
            str(trace),
            "--space",
            str(tmp_path / "space.parquet"),
            "--out",
            str(out),
        ]
    )
    assert rc == 2 and "batch >= 1" in capsys.readouterr().err
    rc = main(
        [
            "estimate",
            "--trace",
            str(tmp_path / "nope"),
            "--space",
            str(tmp_path / "space.parquet"),
            "--out",
            str(out),
        ]
    )
    assert rc == 2 and "trace directory not found" in capsys.readouterr().err


# --- one GEMM on a preset: estimate --matmul ------------------------------------------------
def matmul_json(capsys, *argv):
    assert main(["estimate", "--matmul", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "preset,mnk,measured",
    [("a100-80gb", (6912, 2048, 16384), 267.9e12), ("h100-sxm", (6144, 2816, 17920), 792.1e12)],
)
def test_matmul_cli_reaches_the_measured_ceilings(capsys, preset, mnk, measured):
    # the largest matmul throughput measured (Bekman, MAMF table, bf16, CUDA 12.1), within 5 %.
    # The finder that measured both rows (compute/accelerator/benchmarks/mamaf-finder.py, Aug 2024)
    # ran torch.mm(A[M x N], B[N x K]) and printed MxNxK, so the middle number is the reduction:
    # 6912x16384x2048 is a 6912 x 2048 output with k = 16384
    m, n, k = mnk
    r = matmul_json(capsys, str(m), str(n), str(k), "--arch", preset)
    assert r["flops_per_s"] == pytest.approx(measured, rel=0.05)
    assert r["bound"] == "compute" and r["latency_s"] == pytest.approx(
        r["flops"] / r["flops_per_s"]
    )


def test_matmul_cli_small_gemm_and_terms(capsys):
    r = matmul_json(capsys, "512", "512", "512", "--arch", "a100-80gb")
    assert r["utilization"] <= 0.40 and r["bound"] == "issue"
    for key in ("latency_s", "flops_per_s", "bound", "compute_s", "glb_s", "hbm_s", "issue_s"):
        assert key in r
    # 64x64 thread-block tiles (at k = 512 larger ones would leave more SMs idle, smaller ones
    # would be L2-bound): 64 tiles, one wave over 108 SMs
    assert (r["tiles"], r["tiles_per_core"], r["tile_m"], r["tile_n"]) == (64, 1, 64, 64)
    batched = matmul_json(capsys, "512", "512", "512", "--arch", "a100-80gb", "--batch", "4")
    # every instance is cut into whole tiles, dealt over the 108 SMs in waves
    assert batched["flops"] == 4 * r["flops"] and batched["tiles"] % 4 == 0
    assert batched["tiles_per_core"] == -(-batched["tiles"] // 108)
    tpu = matmul_json(capsys, "8192", "8192", "8192", "--arch", "tpuv4")
    assert tpu["utilization"] == pytest.approx(1.0, abs=0.01) and tpu["issue_s"] == 0


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--matmul", "5", "5", "--arch", "tpuv4"], "three integers"),
        (["--matmul", "5", "x", "5", "--arch", "tpuv4"], "positive integers"),
        (["--matmul", "5", "5", "0", "--arch", "tpuv4"], "K = 0"),
        (["--matmul", "5", "5", "5", "--arch", "tpuv4", "--batch", "0"], "batch = 0"),
        (["--matmul", "5", "5", "5"], "needs --arch"),
        (["--matmul", "5", "5", "5", "--arch", "nope"], "unknown preset 'nope'"),
        (["--matmul", "5", "5", "5", "--arch", "tpuv4", "--out", "x"], "takes no ['--out']"),
        (["--arch", "tpuv4"], "belong to --matmul"),
        (["--trace", "x"], "needs ['--space', '--out']"),
    ],
)
def test_matmul_cli_errors_exit_2_with_one_line(argv, needle, capsys):
    assert main(["estimate", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("phaze estimate: error:") and needle in err[0]


def test_expert_parallel_all_to_all_runs_on_ranks_tp_apart(cm):
    """An all-to-all of group ep in a trace at tensor-parallel width t (the width its all-reduces
    have) on the block's replicated tokens (the experts split over tp) runs on ranks 0, t, 2t,
    ... (Megatron's tp-cp-ep-dp-pp order) and is priced at the larger of what a rank sends and
    receives; on a two-level network of 4 devices per node, ep 4 at t 2 spans two nodes where 4
    consecutive ranks would not. One on the rank's own shard (etp = 1: not replicated) runs on
    ep consecutive ranks (Megatron's expert generator with etp = 1)."""
    from phaze.config import schema_defaults
    from phaze.estimate.stage import tensor_parallel_width
    from phaze.network import HierarchicalNetwork, LinkLevel

    ops = fixture_ops()
    coll = ops[ops.kind == "collective"].iloc[0]
    t = int(coll.group_size)
    assert tensor_parallel_width(ops) == t > 1
    a2a = coll.copy()
    a2a["op"] = int(ops["op"].max()) + 1
    a2a["collective"], a2a["group_size"] = "all_to_all", 4
    a2a["bytes_in"], a2a["bytes_out"] = 1.0e6, 1.5e6
    a2a["replicated"] = True
    shard = a2a.copy()
    shard["op"], shard["replicated"] = a2a["op"] + 1, False
    ops = pd.concat(
        [ops, a2a.to_frame().T.astype(ops.dtypes), shard.to_frame().T.astype(ops.dtypes)],
        ignore_index=True,
    )
    assert tensor_parallel_width(ops) == t  # an all-to-all is not a tensor-parallel collective
    net = {
        "devices_per_node": 4,
        "intra_node": {"bandwidth_Bps": 1e11, "latency_s": 1e-6},
        "inter_node": {"bandwidth_Bps": 1e9, "latency_s": 1e-5},
    }
    place = {**schema_defaults()["place"], "network": net}
    out = estimate(ops, small_space().iloc[:1], cm, place)
    got = float(out.loc[out.op == a2a.op, "latency_allcores_s"].iloc[0])
    two = HierarchicalNetwork(4, LinkLevel(1e11, 1e-6), LinkLevel(1e9, 1e-5))
    assert got == pytest.approx(two.all_to_all(1.5e6, range(0, 4 * t, t)))
    assert got > 2 * two.all_to_all(1.5e6, range(4))  # consecutive ranks: one node, NVLink-like
    own = float(out.loc[out.op == shard.op, "latency_allcores_s"].iloc[0])
    assert own == pytest.approx(two.all_to_all(1.5e6, range(4)))
