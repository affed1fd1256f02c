"""Property tests of the cost model over random GEMM shapes and core configurations (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from phaze.estimate import default_costmodel, hbm_traffic_bytes, matmul_cost, vector_latency

CM = default_costmodel()
MiB = 2**20

dims = st.integers(min_value=1, max_value=20_000)
pow2 = st.sampled_from([2, 4, 8, 16, 32, 64, 128, 256])
glb = st.sampled_from([2, 4, 8, 16, 32, 64, 128]).map(lambda m: m * MiB)
gemm = st.tuples(dims, dims, dims, st.integers(1, 64))
core = st.fixed_dictionaries(
    {
        "tc_width": pow2,
        "tc_depth": pow2,
        "glb_bytes": glb,
        "freq_hz": st.sampled_from([0.5e9, 1.05e9, 2e9]),
    }
)
SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(gemm, core, st.integers(1, 4096), st.integers(1, 4096))
def test_more_cores_never_slower(shape, c, p1, p2):
    lo, hi = sorted((p1, p2))
    t_lo = matmul_cost(*shape, c, CM, lo)["latency_s"]
    t_hi = matmul_cost(*shape, c, CM, hi)["latency_s"]
    assert t_hi <= t_lo * (1 + 1e-12)


@SETTINGS
@given(gemm, core, st.integers(1, 4096))
def test_speedup_is_at_most_linear_and_roofline_holds(shape, c, p):
    one = matmul_cost(*shape, c, CM, 1)
    many = matmul_cost(*shape, c, CM, p)
    assert (
        many["latency_s"] * p >= one["compute_s"] * (1 - 1e-9) or many["latency_s"] >= one["hbm_s"]
    )
    m, n, k, b = shape
    peak = 2.0 * p * c["tc_width"] * c["tc_depth"] * c["freq_hz"]
    assert many["latency_s"] >= 2.0 * m * n * k * b / peak * (1 - 1e-9)
    compulsory = CM["bytes_per_element"] * b * (m * k + k * n + m * n)
    assert many["hbm_traffic_bytes"] >= compulsory
    assert many["latency_s"] >= compulsory / CM["hbm_bandwidth_Bps"] * (1 - 1e-9)


@SETTINGS
@given(gemm, glb, glb)
def test_larger_glb_never_more_hbm_traffic(shape, g1, g2):
    small, large = sorted((g1, g2))
    assert hbm_traffic_bytes(*shape, large, CM) <= hbm_traffic_bytes(*shape, small, CM)


@SETTINGS
@given(gemm, core, st.integers(1, 512), st.floats(1.5, 10))
def test_more_hbm_bandwidth_never_slower(shape, c, p, factor):
    fast = {**CM, "hbm_bandwidth_Bps": CM["hbm_bandwidth_Bps"] * factor}
    assert (
        matmul_cost(*shape, c, fast, p)["latency_s"] <= matmul_cost(*shape, c, CM, p)["latency_s"]
    )


@SETTINGS
@given(gemm, core, st.integers(1, 64))
def test_vectorised_call_equals_scalar_calls(shape, c, p):
    m, n, k, b = shape
    ms = np.array([m, n, k, 1])
    batched = matmul_cost(ms, n, k, b, c, CM, p)["latency_s"]
    for i, mi in enumerate(ms):
        assert batched[i] == matmul_cost(int(mi), n, k, b, c, CM, p)["latency_s"]


@SETTINGS
@given(
    st.integers(1, 10**8),
    st.integers(0, 10**9),
    st.sampled_from([1, 2, 5]),
    pow2,
    st.integers(1, 4096),
    st.integers(1, 4096),
)
def test_vector_ops_more_cores_never_slower(elements, nbytes, cpe, width, p1, p2):
    c = {"vc_width": width, "freq_hz": 1.05e9}
    lo, hi = sorted((p1, p2))
    assert (
        vector_latency(elements, nbytes, cpe, c, CM, hi)[0]
        <= vector_latency(elements, nbytes, cpe, c, CM, lo)[0]
    )


# --- the tiling terms ----------------------------------------------------------------------
SERIAL = {**CM, "output_tile_overlapped": False, "op_issue_s": 2e-6}
THROTTLED = {**CM, "matmul_clock_fraction": 0.8, "matmul_mainloop_fraction": 0.9}
small_dims = st.integers(min_value=1, max_value=300)
FEW = settings(max_examples=25, deadline=None)


@FEW
@given(gemm, core, st.integers(1, 4096), st.integers(1, 4096), st.sampled_from([SERIAL, THROTTLED]))
def test_more_cores_never_slower_with_serial_tiles_and_throttling(shape, c, p1, p2, cm):
    lo, hi = sorted((p1, p2))
    assert matmul_cost(*shape, c, cm, hi)["latency_s"] <= matmul_cost(*shape, c, cm, lo)[
        "latency_s"
    ] * (1 + 1e-12)


@FEW
@given(gemm, core, st.integers(1, 512), st.floats(0.1, 1.0))
def test_clock_fraction_scales_the_core_terms_exactly(shape, c, p, fraction):
    slow = {**SERIAL, "matmul_clock_fraction": fraction}
    fast = matmul_cost(*shape, c, SERIAL, p)
    throttled = matmul_cost(*shape, c, slow, p)
    for term in ("compute_s", "glb_s"):
        assert throttled[term] * fraction == np.float64(fast[term]) or np.isclose(
            throttled[term] * fraction, fast[term], rtol=1e-12
        )
    assert throttled["hbm_s"] == fast["hbm_s"]  # HBM is not on the SM clock


@FEW
@given(gemm, core, st.integers(1, 512))
def test_serial_tiles_and_throttling_are_never_faster(shape, c, p):
    base = matmul_cost(*shape, c, CM, p)
    for cm in (SERIAL, THROTTLED):
        other = matmul_cost(*shape, c, cm, p)
        assert other["latency_s"] >= base["latency_s"] * (1 - 1e-12)
    m, n, k, b = shape
    peak = 2.0 * p * c["tc_width"] * c["tc_depth"] * c["freq_hz"]
    t = matmul_cost(*shape, c, THROTTLED, p)["latency_s"]
    assert t >= 2.0 * m * n * k * b / (peak * 0.8 * 0.9) * (1 - 1e-9)
    assert matmul_cost(*shape, c, SERIAL, p)["latency_s"] >= SERIAL["op_issue_s"]


def _simulate_chosen_tiling(m, n, k, batch, w, d, p, cost):
    """Deal the reported tiling's tiles to p cores one by one and add up each core's cycles."""
    rows, cols = (m, n) if cost["b_stationary"] else (n, m)
    tm, tn = (
        (cost["tile_m"], cost["tile_n"])
        if cost["b_stationary"]
        else (
            cost["tile_n"],
            cost["tile_m"],
        )
    )
    tm, tn = int(tm), int(tn)
    tiles = [
        (b, r, c) for b in range(batch) for r in range(0, rows, tm) for c in range(0, cols, tn)
    ]
    busy = [0] * p
    for i, _tile in enumerate(tiles):  # every tile costs a whole tile
        busy[i % p] += -(-k // w) * (tn // d) * max(tm, w)
    return len(tiles), max(busy) + (w + d - 2)


@settings(max_examples=80, deadline=None)
@given(small_dims, small_dims, small_dims, st.integers(1, 4), pow2, pow2, st.integers(1, 40))
def test_reported_tiling_reproduces_its_cycles(m, n, k, batch, w, d, p):
    c = {"tc_width": w, "tc_depth": d, "glb_bytes": 8 * MiB, "freq_hz": 1e9}
    cost = matmul_cost(m, n, k, batch, c, CM, p)
    tiles, cycles = _simulate_chosen_tiling(m, n, k, batch, w, d, p, cost)
    assert tiles == cost["tiles"] and -(-tiles // p) == cost["tiles_per_core"]
    assert np.isclose(cost["compute_s"] * 1e9, cycles, rtol=1e-12)
