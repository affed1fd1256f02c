"""Wall time of `python -m phaze validate`, and how its errors move when one modelling choice changes.

    python benchmarks/validate.py [--sensitivity]

1. Runs `python -m phaze validate --json` in a fresh process (imports, 10 traces, cost model,
   evaluation) and prints its wall time and peak RSS (budget: 60 s on 2 cores).
2. With --sensitivity, re-runs the validation in-process with one choice changed at a time and
   prints mean / max |error|, Spearman and the per-row errors, so a reader sees what the
   agreement rests on:
   * the a100-80gb GEMM terms one at a time: NVIDIA's HPL clock (1305/1410) instead of the
     random-data clock, no power-limited clock, no main-loop fraction, output tiles overlapped, no
     kernel launch floor, weight-stationary operand reuse (glb_reuse column_block), the area
     model's 16 B-per-PE local buffer instead of the register file, and the whole previous GPU
     mapping (shared memory as the GLB port, weight-stationary reuse, 16 KiB local buffer);
   * HBM at its nominal bandwidth, or at BabelStream Copy instead of Triad;
   * the NCCL ring constants of the nccl-tests plateau alone (efficiency 0.78, 2 us per step),
     and nominal link bandwidths;
   * no gradient-accumulation pass (fused into the weight-gradient GEMM);
   * no kernel fusion of element-wise chains;
   * GeLU as one kernel each way (HF's gelu_pytorch_tanh, like Megatron's fused bias-GeLU)
     instead of GPT-2's default gelu_new chain;
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

    def variant(name, preset_edit=None, cfg_edit=None, ddp_after=False, activation=None):
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
        real_spec = validate_mod.gpt_spec
        if activation:

            def spec_with_activation(row):
                spec = real_spec(row)
                spec.config_kwargs["activation_function"] = activation
                return spec

            validate_mod.gpt_spec = spec_with_activation
        try:
            if ddp_after:
                text = reference.read_text().replace(",torch,", ",local,")
                tmp = Path("/tmp/phaze_validate_ddp_after.csv")
                tmp.write_text(text)
                reference = tmp
            r = validate_mod.validate(cfg, reference)
        finally:
            presets.load_preset = real_load
            validate_mod.gpt_spec = real_spec
        errs = " ".join(f"{row['error'] * 100:+.0f}" for row in r["rows"])
        print(
            f"{name:<44} mean {r['mean_abs_error'] * 100:5.1f} %  max {r['max_abs_error'] * 100:5.1f} %  "
            f"Spearman {r['spearman']:5.2f}   per-row % [{errs}]"
        )

    def cm_edit(**values):
        def edit(p):
            p["costmodel"].update(values)

        return edit

    def previous_mapping(p):
        p["costmodel"].update(
            glb_bandwidth_Bps=128 * 1.41e9,
            glb_reuse="column_block",
            tc_local_buffer_bytes=None,
            matmul_clock_fraction=1305 / 1410,
        )

    def nccl_plateau_only(p):
        p["network"]["intra_node"].update(efficiency=0.78, latency_s=2e-6)

    def nominal_links(p):
        p["network"]["intra_node"]["efficiency"] = 1.0
        p["network"]["inter_node"]["efficiency"] = 1.0

    variant("as shipped")
    variant("HPL clock (1305/1410) for GEMMs", cm_edit(matmul_clock_fraction=1305 / 1410))
    variant("no power-limited clock (fraction 1)", cm_edit(matmul_clock_fraction=1.0))
    variant("no main-loop fraction (1)", cm_edit(matmul_mainloop_fraction=1.0))
    variant("output tiles overlapped", cm_edit(output_tile_overlapped=True))
    variant("no kernel launch floor", cm_edit(op_issue_s=0.0))
    variant("weight-stationary reuse (column_block)", cm_edit(glb_reuse="column_block"))
    variant("local buffer = 16 B per PE (16 KiB)", cm_edit(tc_local_buffer_bytes=None))
    variant("previous mapping (smem port, WS, 16 KiB, HPL)", previous_mapping)
    variant("nominal HBM bandwidth (efficiency 1)", cm_edit(hbm_efficiency=1.0))
    variant("HBM at BabelStream Copy (1.61 TB/s)", cm_edit(hbm_efficiency=1.61 / 2.039))
    variant("NCCL plateau only (0.78, 2 us per step)", nccl_plateau_only)
    variant("nominal link bandwidths", nominal_links)
    variant(
        "no gradient-accumulation pass",
        cfg_edit=lambda c: c["step"].update(grad_accumulation_bytes_per_param=0),
    )
    variant(
        "no element-wise kernel fusion",
        cfg_edit=lambda c: c["fidelity"].update(fuse_elementwise=False),
    )
    variant("GeLU as one kernel (gelu_pytorch_tanh)", activation="gelu_pytorch_tanh")
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
