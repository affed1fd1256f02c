"""Fit the area-model constants to upstream's anchor areas: `python -m phaze.arch.calibrate`.

The anchors are the per-component areas upstream's Accelergy + CACTI (22 nm) flow produced, as
recorded in docs/design.md. The model (``phaze/arch/area.py``) is linear in the four area
constants once the SRAM exponent is fixed. The fit is an exact minimax on RELATIVE error:

1. for a fixed exponent, the smallest achievable worst relative error over all anchors is a
   linear programme (minimise t subject to ``|model_i / anchor_i - 1| <= t``, constants >= 0, no
   negative periphery cost), solved by SCIP (SoPlex: exact simplex vertices, no BLAS, so the
   answer does not depend on the CPU);
2. the exponent minimises that worst error: a scan of ``EXPONENT_RANGE`` in steps of
   ``EXPONENT_STEP``, refined by golden-section search to ``EXPONENT_TOL`` around the best step;
3. the minimax alone can leave constants free (anchors not at the worst error may move without
   changing it: the tensor-core PE area does at the optimum), so the constants are the
   LEXICOGRAPHIC minimax at that exponent: the worst error is minimised, the anchors that must
   sit at it are pinned there, the worst error of the others is minimised next, and so on. That
   solution is unique (the design matrix has full column rank), so the fit is well defined.

The result is what config/schema.yaml carries as defaults (rounded to 6 significant digits);
tests check every anchor within 5 %, the objective against a brute-force exponent scan and the
defaults against a refit up to a stated tolerance.
"""

from __future__ import annotations

import math

import numpy as np

from phaze.arch import area as am
from phaze.arch.area import MiB, local_buffer_bytes

# (component, size) -> area_mm2, from upstream's 22 nm Accelergy/CACTI runs (docs/design.md).
TENSOR_CORE_ANCHORS_MM2 = {2: 0.0092, 16: 0.207, 64: 3.23, 128: 12.90, 256: 51.4}  # square arrays
VECTOR_CORE_ANCHORS_MM2 = {2: 0.0077, 16: 0.0183, 64: 0.0548, 128: 0.1055, 256: 0.2071}
GLB_ANCHORS_MM2 = {2: 3.35, 4: 6.09, 8: 12.0, 16: 23.8, 32: 46.8, 64: 88.6, 128: 175.4}  # MiB
TPUV4_ANCHOR_MM2 = 278.8  # 8 TC 128x128, 2 VC 128, 128 MiB GLB

LOCAL_BUFFER = {"local_buffer_bytes_per_pe": 16, "local_buffer_min_bytes": 1024}
_FITTED = ("tc_pe_area_mm2", "vc_lane_area_mm2", "sram_macro_area_mm2", "sram_area_coeff_mm2")

# SRAM exponents considered: sub-linear to slightly super-linear growth of array area with
# capacity brackets every CACTI curve; the scan step is coarse, golden section does the rest.
EXPONENT_RANGE = (0.80, 1.10)
EXPONENT_STEP = 0.01
EXPONENT_TOL = 1e-9
# SCIP's primal/dual feasibility tolerance: the rows are relative errors of order 1, and the
# columns are scaled to order 1, so 1e-9 is far below any difference the fit cares about.
_FEASTOL = 1e-9
# an anchor whose error cannot be pushed more than this below the current level is pinned at it
_PIN_TOL = 1e-8


def _design_matrix(exponent: float, lb_cfg: dict) -> tuple[np.ndarray, np.ndarray]:
    rows, target = [], []
    for w, area in TENSOR_CORE_ANCHORS_MM2.items():
        rows.append([w * w, 0, 1, (float(local_buffer_bytes(w, w, lb_cfg)) / MiB) ** exponent])
        target.append(area)
    for w, area in VECTOR_CORE_ANCHORS_MM2.items():
        rows.append([0, w, 1, (float(local_buffer_bytes(w, 1, lb_cfg)) / MiB) ** exponent])
        target.append(area)
    for mib, area in GLB_ANCHORS_MM2.items():
        rows.append([0, 0, 1, mib**exponent])
        target.append(area)
    # the whole TPUv4-like point (it sets the area budget A_max, so it is fitted too)
    tc = rows[list(TENSOR_CORE_ANCHORS_MM2).index(128)]
    vc = rows[len(TENSOR_CORE_ANCHORS_MM2) + list(VECTOR_CORE_ANCHORS_MM2).index(128)]
    glb = rows[-1]  # 128 MiB, the last GLB anchor
    rows.append([8 * a + 2 * b + c for a, b, c in zip(tc, vc, glb)])
    target.append(TPUV4_ANCHOR_MM2)
    return np.array(rows, dtype=float), np.array(target)


def relative_rows(exponent: float, lb_cfg: dict = LOCAL_BUFFER) -> np.ndarray:
    """Row i times the constants = model area / anchor area of anchor i (1 is a perfect fit)."""
    a, y = _design_matrix(exponent, lb_cfg)
    return a / y[:, None]


def min_max_error(c: np.ndarray, worst, caps: dict | None = None) -> tuple[float, np.ndarray]:
    """Minimise t s.t. ``|c_i·x - 1| <= t`` (i in ``worst``), ``<= caps[i]`` (i in caps), x >= 0.

    Returns (t, x). Anchors in neither set are unconstrained. SCIP solves the LP; columns are
    scaled by their largest entry so every coefficient is O(1).
    """
    from pyscipopt import Model  # deferred: pyscipopt (SCIP), only for the fit

    caps = caps or {}
    scale = np.abs(c).max(axis=0)
    scale[scale == 0] = 1.0
    m = Model()
    m.hideOutput()
    m.setParam("numerics/feastol", _FEASTOL)
    m.setParam("numerics/dualfeastol", _FEASTOL)
    m.setParam("randomization/randomseedshift", 0)
    z = [m.addVar(lb=0.0, name=f"z{k}") for k in range(c.shape[1])]
    t = m.addVar(lb=0.0, name="t")
    for i in list(worst) + list(caps):
        r = sum(float(c[i, k] / scale[k]) * z[k] for k in range(c.shape[1]) if c[i, k] != 0)
        bound = t if i in worst else float(caps[i])
        m.addCons(r - 1.0 <= bound)
        m.addCons(1.0 - r <= bound)
    m.setObjective(t, "minimize")
    m.optimize()
    if m.getStatus() != "optimal":
        raise RuntimeError(f"area-fit LP ended {m.getStatus()!r}")
    x = np.array([m.getVal(v) for v in z]) / scale
    return float(m.getVal(t)), x


def lexicographic_minimax(c: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """Constants whose sorted error vector is lexicographically smallest; (x, pinned levels)."""
    n = c.shape[0]
    caps: dict[int, float] = {}
    levels: list[float] = []
    while True:
        free = [i for i in range(n) if i not in caps]
        level, x = min_max_error(c, free, caps)
        levels.append(level)
        err = np.abs(c @ x - 1.0)
        pinned = []
        for i in free:
            if err[i] < level - _PIN_TOL:
                continue  # already below the level in this solution: not pinned
            others = {**caps, **{j: level for j in free if j != i}}
            low, _ = min_max_error(c, [i], others)
            if low > level - _PIN_TOL:
                pinned.append(i)
        if not pinned:  # impossible for an optimal LP (averaging would lower the level)
            raise RuntimeError("lexicographic minimax: no anchor pinned at the level")
        caps.update({i: level for i in pinned})
        if len(caps) == n:
            return x, levels


def best_exponent(lb_cfg: dict = LOCAL_BUFFER) -> tuple[float, float]:
    """The exponent minimising the worst relative error, and that error."""

    def worst(e: float) -> float:
        c = relative_rows(e, lb_cfg)
        return min_max_error(c, range(c.shape[0]))[0]

    lo_e, hi_e = EXPONENT_RANGE
    steps = round((hi_e - lo_e) / EXPONENT_STEP)
    grid = [lo_e + k * EXPONENT_STEP for k in range(steps + 1)]
    values = [worst(e) for e in grid]
    k = int(np.argmin(values))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, steps)]
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = worst(a), worst(b)
    while hi - lo > EXPONENT_TOL:
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = worst(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = worst(b)
    e = (lo + hi) / 2.0
    return e, worst(e)


def fit(lb_cfg: dict = LOCAL_BUFFER) -> dict:
    exponent, max_err = best_exponent(lb_cfg)
    x, _ = lexicographic_minimax(relative_rows(exponent, lb_cfg))
    out = dict(zip(_FITTED, (float(v) for v in x)))
    out["sram_area_exponent"] = float(exponent)
    out.update(lb_cfg)
    out["max_relative_error"] = float(max_err)
    return out


def anchor_errors(area_cfg: dict) -> list[tuple[str, float, float]]:
    """(anchor name, model area, anchor area) for every anchor, using ``area_cfg``."""
    out = []
    for w, a in TENSOR_CORE_ANCHORS_MM2.items():
        out.append((f"tensor core {w}x{w}", float(am.tensor_core_area_mm2(w, w, area_cfg)), a))
    for w, a in VECTOR_CORE_ANCHORS_MM2.items():
        out.append((f"vector core {w}", float(am.vector_core_area_mm2(w, area_cfg)), a))
    for mib, a in GLB_ANCHORS_MM2.items():
        out.append((f"GLB {mib} MiB", float(am.glb_area_mm2(mib * MiB, area_cfg)), a))
    out.append(
        (
            "tpuv4 point",
            float(am.accelerator_area_mm2(8, 2, 128, 128, 128, 128 * MiB, area_cfg)),
            TPUV4_ANCHOR_MM2,
        )
    )
    return out


if __name__ == "__main__":
    fitted = fit()
    for key, value in fitted.items():
        print(f"{key}: {value:.6g}")
    for name, model, anchor in anchor_errors(fitted):
        print(
            f"{name:>20}: model {model:9.4f} mm2  anchor {anchor:9.4f}  err {model / anchor - 1:+.2%}"
        )
