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
    assert many["hbm_bytes"] >= compulsory
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
