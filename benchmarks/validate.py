"""Wall time of `python -m phaze validate`, and how its errors move when one modelling choice changes.

    python benchmarks/validate.py [--sensitivity]

1. Runs `python -m phaze validate --json` in a fresh process (imports, 10 traces, cost model,
   evaluation) and prints its wall time and peak RSS — the issue's budget is 60 s on 2 cores.
2. With --sensitivity, re-runs the validation in-process with one choice changed at a time and
   prints mean / max |error| and Spearman for each, so a reader sees what the agreement rests on:
   * the GEMM terms of the a100-80gb preset one at a time: no power-limited clock
     (matmul_clock_fraction 1), no main-loop fraction (1), output tiles overlapped, no kernel
     launch floor (op_issue_s 0);
   * the GLB port taken as the L2 (5120 B/clk over 108 SMs) instead of shared memory;
   * a 256 KiB local buffer per SM (its register file) instead of the cost model's 16 B-per-PE rule;
   * one cost-model core per tensor core (432 cores of 16x16, a quarter of an SM's shared-memory
     port each), with the preset's other GEMM terms and without its clock and main-loop fractions;
   * no kernel fusion of element-wise chains;
   * nominal link bandwidths (efficiency 1.0);
   * every row with DDP after backward.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def cold_run() -> None:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "phaze", "validate", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"phaze validate failed:\n{proc.stderr}")
    report = json.loads(proc.stdout)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        f"python -m phaze validate: {wall:.1f} s wall, peak RSS {rss:.0f} MiB; "
        f"mean |error| {report['mean_abs_error'] * 100:.1f} %, max {report['max_abs_error'] * 100:.1f} %, "
        f"Spearman {report['spearman']:.2f}"
    )


def sensitivity() -> None:
    import phaze.fidelity.validate as validate_mod
    from phaze.arch import presets
    from phaze.config import validate_config

    base_cfg = validate_config({})
    real_load = presets.load_preset

    def variant(name, preset_edit=None, cfg_edit=None, ddp_after=False):
        def load(n):
            p = real_load(n)
            if preset_edit:
                preset_edit(p)
            return p

        cfg = copy.deepcopy(base_cfg)
        if cfg_edit:
            cfg_edit(cfg)
        presets.load_preset = load
        reference = validate_mod.REFERENCE
        try:
            if ddp_after:
                text = reference.read_text().replace(",torch,", ",local,")
                tmp = Path("/tmp/phaze_validate_ddp_after.csv")
                tmp.write_text(text)
                reference = tmp
            r = validate_mod.validate(cfg, reference)
        finally:
            presets.load_preset = real_load
        errs = " ".join(f"{row['error'] * 100:+.0f}" for row in r["rows"])
        print(
            f"{name:<44} mean {r['mean_abs_error'] * 100:5.1f} %  max {r['max_abs_error'] * 100:5.1f} %  "
            f"Spearman {r['spearman']:5.2f}   per-row % [{errs}]"
        )

    def cm_edit(**values):
        def edit(p):
            p["costmodel"].update(values)

        return edit

    def l2_port(p):
        p["costmodel"]["glb_bandwidth_Bps"] = 5120 * 1.41e9 / 108

    def rf_local_buffer(p):
        p.setdefault("gpu", {})["tc_local_buffer_bytes"] = 262144

    def per_tensor_core(p):
        p["arch"].update(n_tc=432, tc_width=16, tc_depth=16)
        p["costmodel"]["glb_bandwidth_Bps"] = 128 * 1.41e9 / 4

    def nominal_links(p):
        p["network"]["intra_node"]["efficiency"] = 1.0
        p["network"]["inter_node"]["efficiency"] = 1.0

    variant("as shipped")
    variant("no power-limited clock (fraction 1)", cm_edit(matmul_clock_fraction=1.0))
    variant("no main-loop fraction (1)", cm_edit(matmul_mainloop_fraction=1.0))
    variant("output tiles overlapped", cm_edit(output_tile_overlapped=True))
    variant("no kernel launch floor", cm_edit(op_issue_s=0.0))
    variant("GLB port = L2 share (66.8 GB/s per SM)", l2_port)
    variant("local buffer = 256 KiB register file", rf_local_buffer)
    variant("one core per tensor core (432 x 16x16)", per_tensor_core)

    def per_tensor_core_at_boost(p):
        per_tensor_core(p)
        p["costmodel"].update(matmul_clock_fraction=1.0, matmul_mainloop_fraction=1.0)

    variant("  ... and no clock or main-loop fraction", per_tensor_core_at_boost)
    variant(
        "no element-wise kernel fusion",
        cfg_edit=lambda c: c["fidelity"].update(fuse_elementwise=False),
    )
    variant("nominal link bandwidths", nominal_links)
    variant("DDP after backward on every row", ddp_after=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sensitivity", action="store_true")
    args = parser.parse_args()
    cold_run()
    if args.sensitivity:
        sensitivity()


if __name__ == "__main__":
    main()
