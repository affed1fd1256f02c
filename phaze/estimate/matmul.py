"""One GEMM on one preset (``python -m phaze estimate --matmul M N K --arch PRESET``).

The same model and constants as the estimate stage: the config's ``costmodel`` with the preset's
own ``costmodel:`` applied, the local buffer as the space table has it (the preset's
``costmodel.tc_local_buffer_bytes`` or the area model's sizing rule), all of the preset's tensor
cores.
"""

from __future__ import annotations

from phaze.arch.area import tc_local_buffer_bytes
from phaze.arch.presets import load_preset
from phaze.errors import PhazeError
from phaze.estimate.model import matmul_cost
from phaze.estimate.stage import with_overrides


def preset_core(preset: str, config: dict) -> tuple[dict, dict]:
    """(core, costmodel) of a preset as the estimate stage costs it: the arch section with the
    area model's local buffer, and the config's costmodel with the preset's overrides."""
    p = load_preset(preset)
    arch = p["arch"]
    cm = with_overrides(config["costmodel"], p["costmodel"], f"preset {preset!r}")
    lb = tc_local_buffer_bytes(arch["tc_width"], arch["tc_depth"], config["arch"]["area"], cm)
    return {**arch, "tc_local_buffer_bytes": float(lb)}, cm


def peak_flops_per_s(core: dict) -> float:
    return 2.0 * core["n_tc"] * core["tc_width"] * core["tc_depth"] * core["freq_hz"]


def matmul_report(m: int, n: int, k: int, batch: int, preset: str, config: dict) -> dict:
    """Latency, FLOP/s and every term of ``[batch×] (m×k)·(k×n)`` on ``preset`` (a JSON-able dict)."""
    for name, value in (("M", m), ("N", n), ("K", k), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PhazeError(f"--matmul needs positive integers; {name} = {value!r}")
    core, cm = preset_core(preset, config)
    cost = matmul_cost(m, n, k, batch, core, cm, core["n_tc"])
    flops = 2.0 * m * n * k * batch
    peak = peak_flops_per_s(core)
    latency = float(cost["latency_s"])
    report = {
        "arch": preset,
        "m": m,
        "n": n,
        "k": k,
        "batch": batch,
        "n_cores": core["n_tc"],
        "flops": flops,
        "latency_s": latency,
        "flops_per_s": flops / latency,
        "peak_flops_per_s": peak,
        "utilization": flops / latency / peak,
        "bound": str(cost["bound"]),
    }
    for key in ("compute_s", "glb_s", "hbm_s", "issue_s", "hbm_traffic_bytes"):
        report[key] = float(cost[key])
    for key in ("tile_m", "tile_n", "tiles", "tiles_per_core"):
        report[key] = int(cost[key])
    report["stationary"] = "B" if bool(cost["b_stationary"]) else "A"
    return report
