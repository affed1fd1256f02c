"""Validation against published training runs: Megatron-LM's Table 1 (Narayanan et al., SC'21).

Each row is a GPT model trained on DGX A100 80 GB nodes with the authors' published strategy
(tensor/pipeline parallelism, microbatch, interleaving, DDP implementation, full recomputation).
The published iteration time is F / (gpus × achieved FLOP/s), with F from their Eq. (3):
F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)). We predict the iteration time with ``evaluate`` on
the ``a100-80gb`` preset and compare. Nothing in the model is fitted to these rows.

A reference table may instead give ``mfu_percent`` (model FLOPs utilisation, Korthikanti et al.
2022: model FLOPs 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) per iteration, no recomputation, over the
GPU's 312 TFLOP/s), and per row ``recompute`` (full, selective, none; default full) and
``sequence_parallel`` (0 or 1; default 0), for runs with the later Megatron-LM features.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from phaze.errors import PhazeError
from phaze.io import checks

REFERENCE = Path(__file__).resolve().parent / "data" / "megatron_narayanan2021_table1.csv"
SEQ = 2048
VOCAB = 51200
PRESET = "a100-80gb"
REQUIRED = (
    "params_billion",
    "attention_heads",
    "hidden_size",
    "layers",
    "tensor_parallel",
    "pipeline_parallel",
    "gpus",
    "global_batch",
    "microbatch",
    "interleave",
    "ddp",
)
#: the published figure: exactly one of these columns (see the module docstring)
METRICS = ("achieved_tflops_per_gpu", "mfu_percent")
#: optional per-run settings and their defaults (Table 1's)
OPTIONAL = {"recompute": "full", "sequence_parallel": "0"}
#: the A100's dense fp16 peak, the denominator of a published MFU (Korthikanti et al. 2022)
PEAK_FLOPS = 312e12


def read_reference(path: Path | str = REFERENCE) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise PhazeError(f"reference table not found: {path}")
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    rows = list(csv.DictReader(lines))
    if not rows:
        raise PhazeError(f"{path}: no data rows")
    missing = [c for c in REQUIRED if c not in rows[0]]
    if missing:
        raise PhazeError(f"{path}: missing columns {missing}")
    metrics = [c for c in METRICS if c in rows[0]]
    if len(metrics) != 1:
        raise PhazeError(f"{path}: needs exactly one of the columns {list(METRICS)}")
    metric = metrics[0]
    numbers = (*REQUIRED, metric)
    out, seen = [], {}
    for i, r in enumerate(rows, 1):
        where = f"{path}: row {i}"
        if None in r or any(r[k] is None for k in numbers):
            raise PhazeError(
                f"{where}: has {len(r) - (None in r)} fields, the header has more or fewer"
            )
        row = {}
        for k in numbers:
            if k == "ddp":
                continue
            try:
                v = float(r[k])
            except ValueError:
                raise PhazeError(f"{where}: {k} must be a number, got {r[k]!r}") from None
            if k == "mfu_percent" and v > 100.0:
                raise PhazeError(f"{where}: mfu_percent must be <= 100, got {r[k]!r}")
            if k in ("params_billion", "achieved_tflops_per_gpu", "mfu_percent"):
                row[k] = checks.number(v, f"{where}: {k}", 0.0, strict=True)
            else:
                row[k] = checks.integer(v, f"{where}: {k}", 1)
        if r["ddp"] not in ("torch", "local"):
            raise PhazeError(f"{where}: ddp must be torch or local, got {r['ddp']!r}")
        row["ddp"] = r["ddp"]
        recompute = (r.get("recompute") or OPTIONAL["recompute"]).strip()
        if recompute not in ("full", "selective", "none"):
            raise PhazeError(
                f"{where}: recompute must be full, selective or none, got {recompute!r}"
            )
        row["recompute"] = recompute
        sp = (r.get("sequence_parallel") or OPTIONAL["sequence_parallel"]).strip()
        if sp not in ("0", "1"):
            raise PhazeError(f"{where}: sequence_parallel must be 0 or 1, got {sp!r}")
        row["sequence_parallel"] = sp == "1"
        run = tuple(row[k] for k in (*REQUIRED, "recompute", "sequence_parallel"))
        if run in seen:
            raise PhazeError(f"{where} repeats the run of row {seen[run]}")
        seen[run] = i
        out.append(row)
    return out


def _gpt_flops(global_batch, seq, layers, hidden, vocab, block_passes: int) -> float:
    """Matmul FLOPs per iteration of a GPT: ``block_passes`` passes over the blocks (one pass of
    one block = 24·B·s·h²·(1 + s/(6h)): the linear layers and attention) and three over the
    logits (2·B·s·h·V each: forward, two backward GEMMs)."""
    b, s, h = global_batch, seq, hidden
    return block_passes * 24.0 * b * s * layers * h**2 * (1 + s / (6 * h)) + 6.0 * b * s * h * vocab


def eq3_flops(global_batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021, Eq. (3): 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per iteration, the
    recomputation pass included (four passes over the blocks)."""
    return _gpt_flops(global_batch, seq, layers, hidden, vocab, block_passes=4)


def model_flops(global_batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Korthikanti et al. 2022: model FLOPs 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) per iteration
    (three passes over the blocks, no recomputation)."""
    return _gpt_flops(global_batch, seq, layers, hidden, vocab, block_passes=3)


def gpt_spec(row: dict):
    from phaze.trace.models import ModelSpec

    h, a, l = row["hidden_size"], row["attention_heads"], row["layers"]
    kwargs = {
        "n_layer": l,
        "n_embd": h,
        "n_head": a,
        "n_inner": 4 * h,
        "vocab_size": VOCAB,
        "n_positions": SEQ,
    }
    return ModelSpec(
        f"gpt-{row['params_billion']:g}b", "gpt2", l, h, a, 4 * h, VOCAB, SEQ, a, kwargs
    )


def published_strategy(row: dict):
    """The strategy a reference row was trained with: its tp, pp, microbatch and interleaving on
    every GPU, its recomputation and sequence parallelism (Table 1: full, none), and the gradient
    reduction of its DDP implementation (PyTorch's overlaps it with backward, Megatron's own runs
    after it)."""
    from phaze.step.strategy import Strategy

    return Strategy(
        devices=row["gpus"],
        tp=row["tensor_parallel"],
        pp=row["pipeline_parallel"],
        microbatch=row["microbatch"],
        global_batch=row["global_batch"],
        interleave=row["interleave"],
        recompute=row["recompute"],
        sequence_parallel=row["sequence_parallel"],
        ddp="overlap" if row["ddp"] == "torch" else "after",
    )


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r

    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    vy = math.sqrt(sum((b - my) ** 2 for b in ry))
    if vx == 0 or vy == 0:
        return float("nan")
    return cov / (vx * vy)


def validate(config: dict, reference: Path | str = REFERENCE) -> dict:
    from phaze.arch.presets import load_preset
    from phaze.fidelity.evaluate import evaluate_strategy

    preset = load_preset(PRESET)
    rows = []
    for ref in read_reference(reference):
        spec = gpt_spec(ref)
        strategy = published_strategy(ref)
        result = evaluate_strategy(spec, strategy, preset, seq=SEQ, config=config, name=PRESET)
        shape = (ref["global_batch"], SEQ, ref["layers"], ref["hidden_size"], VOCAB)
        if "mfu_percent" in ref:
            flops = model_flops(*shape)
            published_tflops = ref["mfu_percent"] / 100.0 * PEAK_FLOPS / 1e12
        else:
            flops = eq3_flops(*shape)
            published_tflops = ref["achieved_tflops_per_gpu"]
        published_s = flops / (ref["gpus"] * published_tflops * 1e12)
        predicted_s = result["iteration_time_s"]
        rows.append(
            {
                "params_billion": ref["params_billion"],
                "tp": ref["tensor_parallel"],
                "pp": ref["pipeline_parallel"],
                "dp": strategy.dp,
                "gpus": ref["gpus"],
                "microbatch": ref["microbatch"],
                "interleave": ref["interleave"],
                "ddp": ref["ddp"],
                "recompute": ref["recompute"],
                "sequence_parallel": ref["sequence_parallel"],
                "published_time_s": published_s,
                "predicted_time_s": predicted_s,
                "error": predicted_s / published_s - 1.0,
                "published_tflops_per_gpu": published_tflops,
                "predicted_tflops_per_gpu": flops / (ref["gpus"] * predicted_s) / 1e12,
                "breakdown": result["breakdown"],
                "peak_memory_bytes": result["peak_memory_bytes"],
                "fits_memory": result["fits_memory"],
            }
        )
    errors = [abs(r["error"]) for r in rows]
    return {
        "preset": PRESET,
        "rows": rows,
        "mean_abs_error": sum(errors) / len(errors),
        "max_abs_error": max(errors),
        "spearman": spearman(
            [r["predicted_tflops_per_gpu"] for r in rows],
            [r["published_tflops_per_gpu"] for r in rows],
        ),
    }


def format_table(report: dict) -> str:
    head = (
        f"{'model':>7} {'t':>2} {'p':>3} {'d':>3} {'gpus':>5} {'b':>3} {'V':>2} {'ddp':>5} "
        f"{'recompute':>12} "
        f"{'published_s':>11} {'predicted_s':>11} {'error':>7} {'pub_TF':>6} {'pred_TF':>7}  "
        f"largest non-compute terms (s)"
    )
    lines = [head]
    for r in report["rows"]:
        bd = {k: v for k, v in r["breakdown"].items() if k not in ("compute_s", "recompute_s")}
        top = sorted(bd.items(), key=lambda kv: -kv[1])[:2]
        terms = ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in top)
        lines.append(
            f"{r['params_billion']:>6g}B {r['tp']:>2} {r['pp']:>3} {r['dp']:>3} {r['gpus']:>5} "
            f"{r['microbatch']:>3} {r['interleave']:>2} {r['ddp']:>5} "
            f"{r['recompute'] + ('+sp' if r['sequence_parallel'] else ''):>12} "
            f"{r['published_time_s']:>11.3f} {r['predicted_time_s']:>11.3f} "
            f"{r['error'] * 100:>+6.1f}% {r['published_tflops_per_gpu']:>6.0f} "
            f"{r['predicted_tflops_per_gpu']:>7.1f}  {terms}"
        )
    lines.append(
        f"mean |error| {report['mean_abs_error'] * 100:.1f} %   max |error| "
        f"{report['max_abs_error'] * 100:.1f} %   Spearman (TFLOP/s per GPU) "
        f"{report['spearman']:.2f}"
    )
    return "\n".join(lines)
