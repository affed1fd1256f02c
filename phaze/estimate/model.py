"""Analytic operator cost model (numpy, broadcasting over operators × core configurations).

Tensor-core GEMM ``C[m×n] = A[m×k] · B[k×n]`` (``batch`` independent instances), weight-stationary:

* A core is a ``w × d`` systolic array (``tc_width × tc_depth``). The stationary operand is cut into
  ``⌈k/w⌉·⌈n/d⌉`` tiles (padded edge tiles cost a full tile: the tiling edge effect); rows of the
  streaming operand flow through each tile. Partial sums stay in the core's local buffer
  (``accumulator_fraction`` of it), so the streamed rows are processed in chunks of
  ``m_c = ⌊acc_bytes_available / (d · accumulator_bytes_per_element)⌋`` rows and every weight tile
  is (re)loaded once per chunk. Loading a tile takes ``w`` cycles; with ``weight_load_overlapped``
  (double-buffered weights) it hides behind the previous tile's streaming and consecutive tiles
  pipeline, so a chunk of ``r`` rows costs ``max(r, w)`` cycles and the array's fill/drain skew
  (``w + d − 2`` cycles) is paid once per op per core; without it every tile costs
  ``w + r + w + d − 2`` cycles. Both orientations (``A`` or ``Bᵀ`` stationary) are tried; the
  faster one wins.
* GLB traffic of a core (bytes through its GLB port): weight tiles once per chunk, the streamed
  operand once per column tile (``⌈n/d⌉``), the output once.
* HBM traffic: the GEMM is blocked against the GLB capacity (blocks ``Tm×Tk`` of A, ``Tk×Tn`` of B,
  double-buffered, and an accumulating ``Tm×Tn`` block of C must fit); the block shape minimising
  traffic is chosen from halvings of each dimension. An operand whose block is the whole matrix is
  read once; otherwise A is read ``⌈n/Tn⌉`` times and B ``⌈m/Tm⌉`` times. C is written once.
* latency = max(compute, GLB traffic / GLB port bandwidth, HBM traffic / HBM bandwidth); ``bound``
  names the largest term.
* Intra-operator parallelism over ``n_cores``: the op is split over batch and m by powers of two and
  over n by the remaining ``⌊n_cores / (P_b·P_m)⌋`` cores (splitting k would need a cross-core
  reduction and is not modelled);
  each core runs the ceil-divided sub-GEMM; the split minimising max(compute, GLB) wins. HBM traffic
  is that of the whole op (the GLB is shared). Because splits using fewer cores remain candidates,
  more cores are never slower.

Vector ops: ``⌈elements / (vc_width·n_cores)⌉ · cycles_per_element`` cycles, bounded below by the
bytes they move through the GLB ports and over HBM. Collectives: ring all-reduce
``2(t−1)/t · bytes / link_bandwidth_Bps + 2(t−1) · link_latency_s`` (all-gather/reduce-scatter:
half of that). All times in seconds.
"""

from __future__ import annotations

import numpy as np

from phaze.network import ring_seconds

BOUNDS = np.array(["compute", "glb", "hbm"])
_MAX_SPLIT_LOG2 = 16  # up to 65,536 cores per type


def _f(x):
    return np.asarray(x, dtype=np.float64)


def _cdiv(a, b):
    return np.ceil(_f(a) / _f(b))


# ---------------------------------------------------------------------------------------------
# one core
# ---------------------------------------------------------------------------------------------
def _rows_per_chunk(d, local_buffer_bytes, costmodel):
    acc_bytes = costmodel["accumulator_fraction"] * _f(local_buffer_bytes)
    return np.maximum(
        1.0, np.floor(acc_bytes / (_f(d) * costmodel["accumulator_bytes_per_element"]))
    )


def _one_core_oriented(m, n, k, batch, w, d, lb, costmodel):
    """Cycles and GLB bytes of a (batch×) m×k · k×n GEMM with the k×n operand stationary."""
    m, n, k, batch, w, d = (_f(x) for x in (m, n, k, batch, w, d))
    elem = costmodel["bytes_per_element"]
    tiles = _cdiv(k, w) * _cdiv(n, d)  # padded edge tiles cost a whole tile
    m_c = np.minimum(_rows_per_chunk(d, lb, costmodel), np.maximum(m, 1.0))
    chunks = _cdiv(m, m_c)
    last = m - (chunks - 1.0) * m_c
    if costmodel["weight_load_overlapped"]:
        per_tile = (chunks - 1.0) * np.maximum(m_c, w) + np.maximum(last, w)
        cycles = batch * tiles * per_tile + (w + d - 2.0)
    else:
        cycles = batch * tiles * (m + chunks * (2.0 * w + d - 2.0))
    glb_bytes = elem * batch * (k * n * chunks + m * k * _cdiv(n, d) + m * n)
    cycles = np.where(m * n * k * batch > 0, cycles, 0.0)
    return cycles, glb_bytes


def core_time(m, n, k, batch, w, d, local_buffer_bytes, freq_hz, costmodel, n_cores=1):
    """Time on ``n_cores`` tensor cores ignoring HBM: (time_s, compute_s, glb_s), best split.

    Broadcasts over all arguments except ``costmodel``.
    """
    m, n, k, batch, w, d, lb, freq, p = np.broadcast_arrays(
        *(_f(x) for x in (m, n, k, batch, w, d, local_buffer_bytes, freq_hz, n_cores))
    )
    glb_bw = costmodel["glb_bandwidth_Bps"]
    best = np.full(m.shape, np.inf)
    best_c = np.full(m.shape, np.inf)
    best_g = np.full(m.shape, np.inf)
    p = np.maximum(np.floor(p), 1.0)
    log_p = np.floor(np.log2(p) + 1e-9)
    # batch and m are split by powers of two; n takes all remaining cores (any integer, so e.g.
    # 432 cores are all usable). Per-core time never grows with the n factor, and every split of
    # fewer cores stays a candidate, so more cores are never slower.
    cap_b = np.ceil(np.log2(np.maximum(batch, 1.0)) - 1e-9)
    cap_m = np.ceil(np.log2(np.maximum(m, 1.0)) - 1e-9)
    max_s = int(min(_MAX_SPLIT_LOG2, log_p.max(initial=0.0)))
    for sb in range(int(min(max_s, cap_b.max(initial=0.0))) + 1):
        for sm in range(int(min(max_s - sb, cap_m.max(initial=0.0))) + 1):
            ok = (sb + sm) <= log_p
            pn = np.maximum(np.floor(p / 2.0 ** (sb + sm)), 1.0)
            bb, mm, nn = _cdiv(batch, 2.0**sb), _cdiv(m, 2.0**sm), _cdiv(n, pn)
            for a_rows, b_cols in ((mm, nn), (nn, mm)):  # both orientations
                cyc, glb = _one_core_oriented(a_rows, b_cols, k, bb, w, d, lb, costmodel)
                comp_s = cyc / freq
                glb_s = glb / glb_bw
                t = np.maximum(comp_s, glb_s)
                better = ok & (t < best)
                best = np.where(better, t, best)
                best_c = np.where(better, comp_s, best_c)
                best_g = np.where(better, glb_s, best_g)
    return best, best_c, best_g


# ---------------------------------------------------------------------------------------------
# HBM traffic (whole op, GLB-blocked)
# ---------------------------------------------------------------------------------------------
def hbm_traffic_bytes(m, n, k, batch, glb_bytes, costmodel):
    """Least HBM traffic (bytes) of a GEMM blocked against a GLB of ``glb_bytes``; broadcasts."""
    m, n, k, batch, glb = np.broadcast_arrays(*(_f(x) for x in (m, n, k, batch, glb_bytes)))
    elem = costmodel["bytes_per_element"]
    acc = costmodel["accumulator_bytes_per_element"]
    a_bytes, b_bytes, c_bytes = elem * m * k, elem * k * n, elem * m * n
    levels = (
        int(np.ceil(np.log2(max(float(np.max(np.maximum(np.maximum(m, n), k), initial=1.0)), 1.0))))
        + 1
    )
    best = np.full(m.shape, np.inf)
    fallback = np.full(m.shape, np.inf)  # if nothing fits: the smallest blocks
    for i in range(levels):
        tm = _cdiv(m, 2.0**i)
        for j in range(levels):
            tn = _cdiv(n, 2.0**j)
            reread_a = _cdiv(n, tn)
            reread_b = _cdiv(m, tm)
            for q in range(levels):
                tk = _cdiv(k, 2.0**q)
                footprint = 2.0 * elem * tk * (tm + tn) + acc * tm * tn
                a_once = (tm >= m) & (tk >= k)
                b_once = (tn >= n) & (tk >= k)
                traffic = batch * (
                    a_bytes * np.where(a_once, 1.0, reread_a)
                    + b_bytes * np.where(b_once, 1.0, reread_b)
                    + c_bytes
                )
                best = np.where((footprint <= glb) & (traffic < best), traffic, best)
                if i == j == q == levels - 1:
                    fallback = traffic
    best = np.where(np.isfinite(best), best, fallback)
    return np.where(m * n * k * batch > 0, best, 0.0)


# ---------------------------------------------------------------------------------------------
# public entry points
# ---------------------------------------------------------------------------------------------
def _core_param(core: dict, key: str, default=None):
    if key in core and core[key] is not None:
        return core[key]
    if default is not None:
        return default
    raise KeyError(f"core parameters need {key!r}")


def tc_local_buffer_bytes(core: dict):
    """The core's local buffer; upstream's sizing (16 B per PE, ≥ 1 KiB) when not given."""
    if core.get("tc_local_buffer_bytes") is not None:
        return core["tc_local_buffer_bytes"]
    return np.maximum(_f(core["tc_width"]) * _f(core["tc_depth"]) * 16.0, 1024.0)


def matmul_cost(m, n, k, batch, core: dict, costmodel: dict, n_cores=1) -> dict:
    """All terms of a GEMM's cost: compute_s, glb_s, hbm_s, hbm_bytes, latency_s, bound."""
    _t_core, comp_s, glb_s = core_time(
        m,
        n,
        k,
        batch,
        core["tc_width"],
        core["tc_depth"],
        tc_local_buffer_bytes(core),
        core["freq_hz"],
        costmodel,
        n_cores,
    )
    hbm_bytes = hbm_traffic_bytes(m, n, k, batch, core["glb_bytes"], costmodel)
    hbm_s = hbm_bytes / _f(costmodel["hbm_bandwidth_Bps"])
    terms = np.stack(np.broadcast_arrays(comp_s, glb_s, hbm_s))
    return {
        "compute_s": terms[0],
        "glb_s": terms[1],
        "hbm_s": terms[2],
        "hbm_bytes": hbm_bytes,
        "latency_s": terms.max(axis=0),
        "bound": BOUNDS[terms.argmax(axis=0)],
    }


def matmul_latency(m, n, k, batch, core: dict, costmodel: dict, n_cores=1):
    """(seconds, bound) of a (batched) GEMM on ``n_cores`` tensor cores; broadcasts over arrays.

    ``core`` needs ``tc_width, tc_depth, glb_bytes, freq_hz`` (optionally ``tc_local_buffer_bytes``).
    """
    cost = matmul_cost(m, n, k, batch, core, costmodel, n_cores)
    return cost["latency_s"], cost["bound"]


def vector_cost(
    elements, bytes_moved, cycles_per_element, core: dict, costmodel: dict, n_cores=1
) -> dict:
    elements, bytes_moved, cpe, width, freq, p = np.broadcast_arrays(
        *(
            _f(x)
            for x in (
                elements,
                bytes_moved,
                cycles_per_element,
                core["vc_width"],
                core["freq_hz"],
                n_cores,
            )
        )
    )
    comp_s = np.ceil(elements / (width * p)) * cpe / freq
    glb_s = bytes_moved / (costmodel["glb_bandwidth_Bps"] * p)
    hbm_s = bytes_moved / _f(costmodel["hbm_bandwidth_Bps"])
    terms = np.stack([comp_s, glb_s, hbm_s])
    return {
        "compute_s": comp_s,
        "glb_s": glb_s,
        "hbm_s": hbm_s,
        "latency_s": terms.max(axis=0),
        "bound": BOUNDS[terms.argmax(axis=0)],
    }


def vector_latency(
    elements, bytes_moved, cycles_per_element, core: dict, costmodel: dict, n_cores=1
):
    """(seconds, bound) of an element-wise/reduction op on ``n_cores`` vector cores.

    ``core`` needs ``vc_width, freq_hz``; ``bytes_moved`` = bytes read + written.
    """
    cost = vector_cost(elements, bytes_moved, cycles_per_element, core, costmodel, n_cores)
    return cost["latency_s"], cost["bound"]


def collective_latency(bytes_, group_size, costmodel: dict, kind="all_reduce"):
    """Seconds of a ring collective of ``bytes_`` (the full tensor) over ``group_size`` devices on
    the flat link ``costmodel.link_*`` (phaze.network.ring_seconds):

    all_reduce: 2(t−1)/t·bytes/link_bw + 2(t−1)·link_latency; all_gather / reduce_scatter: half.
    t ≤ 1 costs nothing.
    """
    return ring_seconds(
        kind, bytes_, group_size, costmodel["link_bandwidth_Bps"], costmodel["link_latency_s"]
    )
