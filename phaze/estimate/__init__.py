"""Operator cost model and the ``estimate`` stage (``python -m phaze estimate``).

Public API (numpy; every argument broadcasts, so one call covers operators × configurations):

``matmul_latency(m, n, k, batch, core, costmodel, n_cores=1) -> (seconds, bound)``
    A (batched) GEMM ``[batch×] (m×k)·(k×n)`` on ``n_cores`` weight-stationary systolic tensor
    cores. ``core`` is a mapping with ``tc_width``, ``tc_depth`` (array rows × columns),
    ``glb_bytes`` (shared global buffer), ``freq_hz`` and optionally ``tc_local_buffer_bytes``
    (default: 16 B per PE, at least 1 KiB). ``bound`` is ``compute``, ``glb``, ``hbm`` or ``issue``.
``matmul_cost(...)`` -> dict with ``compute_s, glb_s, hbm_s, issue_s, hbm_traffic_bytes, latency_s,
    bound`` and the tiling chosen (``tile_m, tile_n, tiles, tiles_per_core, b_stationary``).
``core_cost(m, n, k, batch, w, d, local_buffer_bytes, freq_hz, costmodel, n_cores=1)``
    The best output tiling on the cores, ignoring HBM (``core_time`` = its three times).
``vector_latency(elements, bytes_moved, cycles_per_element, core, costmodel, n_cores=1)``
    An element-wise/reduction op on ``n_cores`` vector cores (``core``: ``vc_width, freq_hz``).
``vector_cost(...)`` -> dict with ``compute_s, glb_s, hbm_s, issue_s, latency_s, bound``.
``phaze.estimate.stage.cycles_per_element(aten_names, costmodel)``
    The per-element cycle counts the stage uses (config table ``vector_cycles_per_element``).
``phaze.estimate.matmul.matmul_report(m, n, k, batch, preset, config)``
    One GEMM on a preset as ``estimate --matmul`` prints it.
``collective_latency(bytes_, group_size, costmodel, kind="all_reduce") -> seconds``
    Ring collective over ``group_size`` devices on links of ``link_bandwidth_Bps`` /
    ``link_latency_s``.
``hbm_traffic_bytes(m, n, k, batch, glb_bytes, costmodel)``
    The least HBM traffic of a GEMM blocked against the GLB.
``default_costmodel()`` -> the schema's default ``costmodel`` section (a fresh dict).

``costmodel`` is the config's ``costmodel:`` section (keys carry units: ``hbm_bandwidth_Bps``,
``glb_bandwidth_Bps`` = bandwidth of EACH core's GLB port, ``link_bandwidth_Bps``,
``link_latency_s``, ``op_issue_s``, ``bytes_per_element``, ``accumulator_bytes_per_element``,
``accumulator_fraction``, ``weight_load_overlapped``, ``output_tile_overlapped``,
``matmul_mainloop_fraction``, ``matmul_clock_fraction``, ``vector_cycles_per_element``).
The model itself is described in ``phaze/estimate/model.py``. Example: an A100 as 108 cores (its
SMs) of 32×32 at 1.41 GHz with a 40 MB L2 as GLB::

    a100 = {"tc_width": 32, "tc_depth": 32, "glb_bytes": 40e6, "freq_hz": 1.41e9}
    seconds, bound = matmul_latency(4096, 4096, 4096, 1, a100, costmodel, n_cores=108)
"""

from phaze.config import schema_defaults
from phaze.estimate.model import (  # noqa: F401
    collective_latency,
    core_cost,
    core_time,
    hbm_traffic_bytes,
    matmul_cost,
    matmul_latency,
    vector_cost,
    vector_latency,
)


def default_costmodel() -> dict:
    """The schema's costmodel constants (config/schema.yaml)."""
    return schema_defaults()["costmodel"]
