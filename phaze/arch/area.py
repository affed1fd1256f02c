"""Parametric silicon-area model of an accelerator (needs nothing beyond numpy).

An accelerator is ``n_tc`` tensor cores + ``n_vc`` vector cores + ONE shared global buffer (GLB):

* tensor core  = ``tc_width·tc_depth`` MAC processing elements (PE, each with its pipeline
  registers) + its local buffer SRAM (``local_buffer_bytes``);
* vector core  = ``vc_width`` lanes (a 1-deep array) + its local buffer SRAM;
* SRAM macro of B bytes = ``sram_macro_area_mm2 + sram_area_coeff_mm2 · (B / MiB) ** sram_area_exponent``:
  near-affine in capacity with a fixed periphery cost, so area per MiB falls as capacity grows
  (what CACTI reports for upstream's 22 nm buffers).

All constants come from the ``arch.area`` config section; ``phaze/arch/calibrate.py`` fits them to
the anchor areas upstream's Accelergy/CACTI flow produced (docs/design.md) and says how well they fit.
Every function broadcasts over numpy arrays.
"""

from __future__ import annotations

import numpy as np

MiB = 2**20


def local_buffer_bytes(width, depth, area_cfg: dict):
    """Per-core local buffer: ``local_buffer_bytes_per_pe`` per PE, at least ``local_buffer_min_bytes``.

    Upstream sized it width·depth/64 KiB (i.e. 16 B per PE) with a 1 KiB floor; a vector core is a
    ``depth = 1`` array.
    """
    per_pe = area_cfg["local_buffer_bytes_per_pe"]
    floor = area_cfg["local_buffer_min_bytes"]
    return np.maximum(
        np.asarray(width, dtype=np.int64) * np.asarray(depth, dtype=np.int64) * per_pe, floor
    )


def tc_local_buffer_bytes(width, depth, area_cfg: dict, costmodel: dict):
    """A tensor core's local buffer as the cost model sees it: ``costmodel.tc_local_buffer_bytes``
    when an architecture sets it (a documented buffer), else the sizing rule above."""
    if costmodel.get("tc_local_buffer_bytes") is not None:
        return np.broadcast_to(
            np.float64(costmodel["tc_local_buffer_bytes"]), np.shape(width)
        ).astype(np.float64)
    return local_buffer_bytes(width, depth, area_cfg).astype(np.float64)


def sram_area_mm2(capacity_bytes, area_cfg: dict):
    mib = np.asarray(capacity_bytes, dtype=np.float64) / MiB
    return (
        area_cfg["sram_macro_area_mm2"]
        + area_cfg["sram_area_coeff_mm2"] * mib ** area_cfg["sram_area_exponent"]
    )


def tensor_core_area_mm2(width, depth, area_cfg: dict):
    pes = np.asarray(width, dtype=np.float64) * np.asarray(depth, dtype=np.float64)
    return pes * area_cfg["tc_pe_area_mm2"] + sram_area_mm2(
        local_buffer_bytes(width, depth, area_cfg), area_cfg
    )


def vector_core_area_mm2(width, area_cfg: dict):
    lanes = np.asarray(width, dtype=np.float64)
    return lanes * area_cfg["vc_lane_area_mm2"] + sram_area_mm2(
        local_buffer_bytes(width, 1, area_cfg), area_cfg
    )


def glb_area_mm2(glb_bytes, area_cfg: dict):
    return sram_area_mm2(glb_bytes, area_cfg)


def accelerator_area_mm2(n_tc, n_vc, tc_width, tc_depth, vc_width, glb_bytes, area_cfg: dict):
    """Total die area (mm²) of the compute and on-chip memory; HBM is off-die and not counted."""
    return (
        np.asarray(n_tc) * tensor_core_area_mm2(tc_width, tc_depth, area_cfg)
        + np.asarray(n_vc) * vector_core_area_mm2(vc_width, area_cfg)
        + glb_area_mm2(glb_bytes, area_cfg)
    )


def peak_flops(n_tc, tc_width, tc_depth, freq_hz):
    """Tensor-core peak: one multiply-add (2 FLOPs) per PE per cycle."""
    return (
        2.0
        * np.asarray(n_tc)
        * np.asarray(tc_width)
        * np.asarray(tc_depth)
        * np.asarray(freq_hz, dtype=np.float64)
    )
