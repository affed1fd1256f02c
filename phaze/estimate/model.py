"""Analytic operator cost model (numpy, broadcasting over operators × core configurations).

Tensor-core GEMM ``C[m×n] = A[m×k] · B[k×n]`` (``batch`` independent instances) on ``n_cores``
weight-stationary ``w × d`` systolic arrays (``tc_width × tc_depth``):

* **Output tiles.** The output is cut into tiles of ``T_m`` streamed rows × ``T_n`` stationary
  columns (``T_n`` a multiple of ``d``; ``T_m`` at most ``m_c``, the rows whose fp32 partial sums for
  one ``d``-wide column tile fit in the core's accumulator share of its local buffer:
  ``m_c = ⌊accumulator_fraction · local_buffer / (d · accumulator_bytes_per_element)⌋``). The
  tiles (``batch · ⌈m/T_m⌉ · ⌈n/T_n⌉``) are dealt to the cores in waves: the busiest core runs
  ``⌈tiles / n_cores⌉`` of them (wave quantization), and an edge tile costs a whole tile (tile
  quantization). Every ``T_m`` (powers of two up to ``m_c``, or all rows) × ``T_n`` (``d``·2^j)
  and both orientations (``A`` or ``Bᵀ`` stationary) are tried; the fastest wins — as a GEMM library
  picks its tile shape.
* **One tile on one array.** The stationary operand of a tile is ``⌈k/w⌉ · T_n/d`` weight tiles of
  ``w × d``; the tile's rows stream through each. Loading a weight tile takes ``w`` cycles; with
  ``weight_load_overlapped`` (double-buffered weights) it hides behind the previous weight tile's
  streaming, so a weight tile costs ``max(T_m, w)`` cycles and the array's fill/drain skew
  (``w + d − 2``) is paid once per op per core; without it every weight tile costs
  ``T_m + 2w + d − 2``. In steady state the array issues a row every
  ``1 / matmul_mainloop_fraction`` cycles, and under sustained tensor load it runs at
  ``matmul_clock_fraction · freq_hz`` (a power-limited clock).
* **Tile boundaries.** With ``output_tile_overlapped`` (double-buffered accumulators) a finished
  tile drains while the next one streams; without it (a GPU thread block: prologue, main loop,
  epilogue in sequence) every tile also pays writing its ``T_m × T_n`` outputs through the core's
  GLB port.
* **GLB traffic** of a core (bytes through its GLB port, ``glb_bandwidth_Bps`` each): per tile the
  weights once, the streamed rows once per ``d``-wide column tile (``glb_reuse: column_block``, a
  systolic array holding one block of weights at a time) or once per tile (``output_tile``, a GPU
  thread block whose warps all reuse the operand panels it staged in shared memory; then all
  ``T_m × T_n`` accumulators are live at once, so ``T_m · T_n/d ≤ m_c``), the output once.
* **Operand and output bytes**: ``bytes_per_element`` each of A, B and C; a low-precision GEMM
  (``phaze.precision.gemm_core``) sets ``output_bytes_per_element`` for C (BF16 output of FP8
  operands).
* **HBM traffic**: the GEMM is blocked against the GLB capacity (blocks ``Tm×Tk`` of A, ``Tk×Tn`` of
  B, double-buffered, and an accumulating ``Tm×Tn`` block of C must fit); the block shape minimising
  traffic is chosen from halvings of each dimension. An operand whose block is the whole matrix is
  read once; otherwise A is read ``⌈n/Tn⌉`` times and B ``⌈m/Tm⌉`` times. C is written once.
  The whole op's traffic (the GLB is shared).
* **Issue**: an operator takes at least ``op_issue_s`` (a GPU kernel launch; 0 for statically
  scheduled accelerators, whose operators are parts of one compiled program).
* latency = max(compute, GLB traffic / GLB port bandwidth, HBM traffic / achievable HBM
  bandwidth (``hbm_bandwidth_Bps · hbm_efficiency``), issue);
  ``bound`` names the largest term (``compute``, ``glb``, ``hbm`` or ``issue``). Splitting k over
  cores would need a cross-core reduction and is not modelled. More cores are never slower (the
  busiest core's tile count never grows).

Vector ops: ``⌈elements / (vc_width·n_cores)⌉ · cycles_per_element`` cycles, bounded below by the
bytes they move through the GLB ports and over HBM, and by ``op_issue_s``. Collectives: ring
all-reduce ``2(t−1)/t · bytes / link_bandwidth_Bps + 2(t−1) · link_latency_s`` (all-gather /
reduce-scatter: half of that). All times in seconds.
"""

from __future__ import annotations

import numpy as np

from phaze.network import ring_seconds

BOUNDS = np.array(["compute", "glb", "hbm", "issue"])


def _f(x):
    return np.asarray(x, dtype=np.float64)


def _cdiv(a, b):
    return np.ceil(_f(a) / _f(b))


def _log2_ceil(x) -> int:
    """⌈log2(max(x))⌉ over an array (≥ 0): how many doublings reach its largest element."""
    top = float(np.max(_f(x), initial=1.0))
    return int(np.ceil(np.log2(max(top, 1.0)) - 1e-9))


def achievable_hbm_Bps(costmodel):
    """HBM bandwidth a streaming kernel reaches: ``hbm_bandwidth_Bps · hbm_efficiency``."""
    return _f(costmodel["hbm_bandwidth_Bps"]) * costmodel["hbm_efficiency"]


def combine_terms(compute_s, glb_s, hbm_s, issue_s):
    """(latency_s, bound): the largest of the four terms and its name (``BOUNDS``); broadcasts."""
    terms = np.stack(np.broadcast_arrays(_f(compute_s), _f(glb_s), _f(hbm_s), _f(issue_s)))
    return terms.max(axis=0), BOUNDS[terms.argmax(axis=0)]


def cost_terms(compute_s, glb_s, hbm_s, issue_s) -> dict:
    """An operator's four cost terms with their latency and bound (`combine_terms`)."""
    latency, bound = combine_terms(compute_s, glb_s, hbm_s, issue_s)
    return {
        "compute_s": compute_s,
        "glb_s": glb_s,
        "hbm_s": hbm_s,
        "issue_s": issue_s,
        "latency_s": latency,
        "bound": bound,
    }


# ---------------------------------------------------------------------------------------------
# one core
# ---------------------------------------------------------------------------------------------
def rows_per_chunk(d, local_buffer_bytes, costmodel):
    """``m_c``: streamed rows whose partial sums for one ``d``-wide column tile fit the accumulators."""
    acc_bytes = costmodel["accumulator_fraction"] * _f(local_buffer_bytes)
    return np.maximum(
        1.0, np.floor(acc_bytes / (_f(d) * costmodel["accumulator_bytes_per_element"]))
    )


def tile_cost(rows, cols, k, w, d, tile_rows, tile_cols, costmodel):
    """Cycles and GLB bytes of ONE output tile on one array, and its write-back bytes.

    The tile is ``tile_rows`` streamed rows × ``tile_cols`` stationary columns (a multiple of
    ``d``) of a GEMM with ``rows`` × ``cols`` output and reduction depth ``k``; an edge tile
    costs a whole tile. Returns (stream_cycles, glb_bytes, out_bytes); the per-op fill/drain skew
    is not included. Broadcasts.
    """
    rows, cols, k, w, d, tm, tn = (_f(x) for x in (rows, cols, k, w, d, tile_rows, tile_cols))
    elem = costmodel["bytes_per_element"]
    out_elem = costmodel.get("output_bytes_per_element", elem)
    col_tiles = _cdiv(tn, d)
    weight_tiles = _cdiv(k, w) * col_tiles
    if costmodel["weight_load_overlapped"]:
        cycles = weight_tiles * np.maximum(tm, w)
    else:
        cycles = weight_tiles * (tm + 2.0 * w + d - 2.0)
    true_cols = np.minimum(tn, cols)  # bytes move only for real columns
    out_bytes = out_elem * tm * true_cols
    # the streamed rows cross the port once per d-wide column block (a systolic array holding one
    # block of weights at a time) or once per tile (a GPU thread block reusing its staged panels)
    streamed_passes = 1.0 if costmodel["glb_reuse"] == "output_tile" else col_tiles
    glb_bytes = elem * (k * true_cols + tm * k * streamed_passes) + out_bytes
    return cycles, glb_bytes, out_bytes


def core_cost(m, n, k, batch, w, d, local_buffer_bytes, freq_hz, costmodel, n_cores=1) -> dict:
    """The best tiling on ``n_cores`` tensor cores, ignoring HBM; broadcasts (not ``costmodel``).

    Keys: ``time_s`` = max(compute_s, glb_s), ``compute_s``, ``glb_s``, and the tiling chosen:
    ``tile_m × tile_n`` output tiles (in the GEMM's own m, n), ``tiles``, ``tiles_per_core`` (the
    busiest core's count: waves), ``b_stationary`` (True: B is the stationary operand).
    """
    m, n, k, batch, w, d, lb, freq, p = np.broadcast_arrays(
        *(_f(x) for x in (m, n, k, batch, w, d, local_buffer_bytes, freq_hz, n_cores))
    )
    p = np.maximum(np.floor(p), 1.0)
    clock = freq * costmodel["matmul_clock_fraction"]
    issue_cycles = 1.0 / costmodel["matmul_mainloop_fraction"]
    glb_bw = costmodel["glb_bandwidth_Bps"] * costmodel["matmul_clock_fraction"]
    skew = (w + d - 2.0) if costmodel["weight_load_overlapped"] else np.zeros_like(w)
    m_c = rows_per_chunk(d, lb, costmodel)
    whole_tile_live = costmodel["glb_reuse"] == "output_tile"
    keys = ("time_s", "compute_s", "glb_s", "tile_m", "tile_n", "tiles", "tiles_per_core")
    best = {key: np.full(m.shape, np.inf) for key in keys}
    best["b_stationary"] = np.ones(m.shape, dtype=bool)
    for b_stationary, rows, cols in ((True, m, n), (False, n, m)):
        col_blocks = _cdiv(cols, d)  # d-wide column tiles of the whole output
        for i in range(_log2_ceil(np.minimum(m_c, rows)) + 1):
            # T_m: 2^i rows, at most m_c, at most all rows (then one row tile, no padding)
            tm = np.minimum(np.minimum(2.0**i, m_c), np.maximum(rows, 1.0))
            row_tiles = _cdiv(rows, tm)
            for j in range(_log2_ceil(col_blocks) + 1):
                # d-wide column tiles per output tile (one for an empty GEMM)
                blocks = np.minimum(2.0**j, np.maximum(col_blocks, 1.0))
                tn = d * blocks
                if whole_tile_live:
                    # all T_m × T_n accumulators live at once: T_m · blocks ≤ m_c
                    tm_j = np.minimum(tm, np.maximum(np.floor(m_c / blocks), 1.0))
                    row_tiles_j = _cdiv(rows, tm_j)
                else:
                    tm_j, row_tiles_j = tm, row_tiles
                tiles = batch * row_tiles_j * _cdiv(col_blocks, blocks)
                per_core = _cdiv(tiles, p)  # the busiest core's tiles (waves)
                cyc, glb, out = tile_cost(rows, cols, k, w, d, tm_j, tn, costmodel)
                comp_s = (per_core * cyc * issue_cycles + skew) / clock
                if not costmodel["output_tile_overlapped"]:
                    comp_s = comp_s + per_core * out / glb_bw
                glb_s = per_core * glb / glb_bw
                t = np.maximum(comp_s, glb_s)
                # the fastest; among equally fast tilings the one moving the fewest GLB bytes
                better = (t < best["time_s"]) | ((t == best["time_s"]) & (glb_s < best["glb_s"]))
                for key, value in zip(
                    keys,
                    (
                        t,
                        comp_s,
                        glb_s,
                        tm_j if b_stationary else tn,
                        tn if b_stationary else tm_j,
                        tiles,
                        per_core,
                    ),
                ):
                    best[key] = np.where(better, value, best[key])
                best["b_stationary"] = np.where(better, b_stationary, best["b_stationary"])
    empty = m * n * k * batch <= 0
    for key in ("time_s", "compute_s", "glb_s"):
        best[key] = np.where(empty, 0.0, best[key])
    return best


def core_time(m, n, k, batch, w, d, local_buffer_bytes, freq_hz, costmodel, n_cores=1):
    """Time on ``n_cores`` tensor cores ignoring HBM: (time_s, compute_s, glb_s), best tiling.

    Broadcasts over all arguments except ``costmodel``.
    """
    c = core_cost(m, n, k, batch, w, d, local_buffer_bytes, freq_hz, costmodel, n_cores)
    return c["time_s"], c["compute_s"], c["glb_s"]


# ---------------------------------------------------------------------------------------------
# HBM traffic (whole op, GLB-blocked)
# ---------------------------------------------------------------------------------------------
def hbm_traffic_bytes(m, n, k, batch, glb_bytes, costmodel):
    """Least HBM traffic (bytes) of a GEMM blocked against a GLB of ``glb_bytes``; broadcasts."""
    m, n, k, batch, glb = np.broadcast_arrays(*(_f(x) for x in (m, n, k, batch, glb_bytes)))
    elem = costmodel["bytes_per_element"]
    acc = costmodel["accumulator_bytes_per_element"]
    out_elem = costmodel.get("output_bytes_per_element", elem)
    a_bytes, b_bytes, c_bytes = elem * m * k, elem * k * n, out_elem * m * n
    levels = (
        int(np.ceil(np.log2(max(float(np.max(np.maximum(np.maximum(m, n), k), initial=1.0)), 1.0))))
        + 1
    )
    best = np.full(m.shape, np.inf)
    fallback = np.full(m.shape, np.inf)  # if nothing fits: the smallest blocks
    # a block holds at least one row, column and step of k (an empty GEMM's 0 is set at the end)
    for i in range(levels):
        tm = np.maximum(_cdiv(m, 2.0**i), 1.0)
        for j in range(levels):
            tn = np.maximum(_cdiv(n, 2.0**j), 1.0)
            reread_a = _cdiv(n, tn)
            reread_b = _cdiv(m, tm)
            for q in range(levels):
                tk = np.maximum(_cdiv(k, 2.0**q), 1.0)
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
def tc_local_buffer_bytes(core: dict):
    """The core's local buffer; upstream's sizing (16 B per PE, ≥ 1 KiB) when not given."""
    if core.get("tc_local_buffer_bytes") is not None:
        return core["tc_local_buffer_bytes"]
    return np.maximum(_f(core["tc_width"]) * _f(core["tc_depth"]) * 16.0, 1024.0)


def matmul_cost(m, n, k, batch, core: dict, costmodel: dict, n_cores=1) -> dict:
    """All terms of a GEMM's cost: compute_s, glb_s, hbm_s, issue_s, hbm_traffic_bytes, latency_s, bound,
    and the tiling (``core_cost``'s tile_m, tile_n, tiles, tiles_per_core, b_stationary)."""
    tiling = core_cost(
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
    traffic = hbm_traffic_bytes(m, n, k, batch, core["glb_bytes"], costmodel)
    hbm_s = traffic / achievable_hbm_Bps(costmodel)
    comp_s, glb_s, hbm_s = np.broadcast_arrays(tiling["compute_s"], tiling["glb_s"], hbm_s)
    issue_s = np.where(traffic > 0, costmodel["op_issue_s"], 0.0) + np.zeros(comp_s.shape)
    return {
        **cost_terms(comp_s, glb_s, hbm_s, issue_s),
        "hbm_traffic_bytes": traffic,
        **{key: tiling[key] for key in ("tile_m", "tile_n", "tiles", "tiles_per_core")},
        "b_stationary": tiling["b_stationary"],
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
    hbm_s = bytes_moved / achievable_hbm_Bps(costmodel)
    issue_s = np.where(elements > 0, costmodel["op_issue_s"], 0.0)
    return cost_terms(comp_s, glb_s, hbm_s, issue_s)


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
