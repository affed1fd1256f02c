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

A table with a ``model`` column is a table of **runs** of registry models (any family, dense or
mixture-of-experts) on a GPU ``preset``, each with its measured ``iteration_time_s`` and every
setting it ran with (:data:`RUN_COLUMNS`, ``expert_parallel`` included; optionally
``context_parallel`` and ``precision``, :data:`RUN_OPTIONAL` — a precision the step model does not
price, or a model the registry does not know, is refused with one line); its TFLOP/s per GPU are
phaze's model FLOPs of the run (the trace's matmuls) over the published and the predicted time,
so the two are comparable whatever FLOP count the source used. An optional ``precision`` column
(bf16 or fp8, ``phaze.precision``) gives each run's training precision; without it a run takes
config ``fidelity.precision`` (``validate --precision``); likewise ``attention`` (eager or fused,
config ``fidelity.attention``, ``validate --attention``): how the run's core attention ran. An
optional ``pipeline_layout`` column gives an uneven pipeline split in Megatron-LM's
``--pipeline-model-parallel-layout`` syntax (one ``|``-separated segment per model chunk,
``phaze.step.megatron_args.parse_pipeline_layout``); empty: Megatron's even split. An optional
``expert_tensor_parallel`` column (1 or the run's tensor-parallel size; empty: the latter) is
Megatron-LM's ``--expert-tensor-parallel-size``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from phaze.arch.presets import load_preset
from phaze.errors import PhazeError
from phaze.fidelity.compute import ATTENTION_MODES
from phaze.fidelity.evaluate import evaluate_strategy
from phaze.io import checks
from phaze.precision import PRECISIONS
from phaze.step.megatron_args import parse_pipeline_layout
from phaze.step.strategy import Strategy
from phaze.trace.models import ModelSpec, get_model_spec

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


#: the integer columns of a table of runs (one row per measured training run of a registry model)
_RUN_INTEGERS = (
    "gpus",
    "seq",
    "global_batch",
    "microbatch",
    "tensor_parallel",
    "pipeline_parallel",
    "interleave",
    "expert_parallel",
)
#: optional columns of a table of runs and their defaults: the context-parallel size, the
#: training precision (empty: config ``fidelity.precision``; one the step model does not price is
#: refused, `read_runs`) and how core attention runs (eager or fused; empty: config
#: ``fidelity.attention``)
RUN_OPTIONAL = {
    "context_parallel": "1",
    "precision": "",
    "attention": "",
    "pipeline_layout": "",
    "expert_tensor_parallel": "",
}
#: every column of a table of runs
RUN_COLUMNS = (
    "model",
    "preset",
    *_RUN_INTEGERS,
    "recompute",
    "sequence_parallel",
    "distributed_optimizer",
    "ddp",
    "iteration_time_s",
)


def _csv_rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise PhazeError(f"reference table not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PhazeError(f"reference table {path} is not a text file (not UTF-8)") from None
    except OSError as exc:
        raise PhazeError(f"cannot read the reference table {path}: {exc.strerror}") from exc
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    try:
        rows = list(csv.DictReader(lines))
    except csv.Error as exc:
        raise PhazeError(f"reference table {path} is not a CSV table: {exc}") from None
    if not rows:
        raise PhazeError(f"{path}: no data rows")
    return rows


def read_runs(path: Path | str) -> list[dict]:
    """A table of runs (see the module docstring), checked: every column present, numbers
    numbers, the flags 0 or 1, a known recompute and DDP mode, no run twice."""
    path = Path(path)
    rows = _csv_rows(path)
    missing = [c for c in RUN_COLUMNS if c not in rows[0]]
    if missing:
        raise PhazeError(f"{path}: a table of runs needs the columns {missing}")
    out, seen = [], {}
    for i, r in enumerate(rows, 1):
        where = f"{path}: row {i}"
        if None in r or any(r[k] is None for k in RUN_COLUMNS):
            raise PhazeError(f"{where}: has more or fewer fields than the header")
        row = {"model": r["model"].strip(), "preset": r["preset"].strip()}
        for k in _RUN_INTEGERS:
            try:
                v = float(r[k])
            except ValueError:
                raise PhazeError(f"{where}: {k} must be a number, got {r[k]!r}") from None
            row[k] = checks.integer(v, f"{where}: {k}", 1)
        try:
            t = float(r["iteration_time_s"])
        except ValueError:
            raise PhazeError(
                f"{where}: iteration_time_s must be a number, got {r['iteration_time_s']!r}"
            ) from None
        row["iteration_time_s"] = checks.number(t, f"{where}: iteration_time_s", 0.0, strict=True)
        for k in ("sequence_parallel", "distributed_optimizer"):
            if r[k].strip() not in ("0", "1"):
                raise PhazeError(f"{where}: {k} must be 0 or 1, got {r[k]!r}")
            row[k] = r[k].strip() == "1"
        if r["recompute"].strip() not in ("full", "selective", "none"):
            raise PhazeError(
                f"{where}: recompute must be full, selective or none, got {r['recompute']!r}"
            )
        row["recompute"] = r["recompute"].strip()
        if r["ddp"].strip() not in ("overlap", "after"):
            raise PhazeError(f"{where}: ddp must be overlap or after, got {r['ddp']!r}")
        row["ddp"] = r["ddp"].strip()
        row["source"] = (r.get("source") or "").strip()
        cp = (r.get("context_parallel") or RUN_OPTIONAL["context_parallel"]).strip()
        try:
            row["context_parallel"] = checks.integer(float(cp), f"{where}: context_parallel", 1)
        except ValueError:
            raise PhazeError(f"{where}: context_parallel must be a number, got {cp!r}") from None
        precision = (r.get("precision") or "").strip().lower()
        if precision and precision not in PRECISIONS:
            raise PhazeError(
                f"{where}: precision must be one of {', '.join(PRECISIONS)} (precision "
                f"{precision} is not modelled; this run cannot be validated yet)"
            )
        row["precision"] = precision or None
        attention = (r.get("attention") or "").strip().lower()
        if attention and attention not in ATTENTION_MODES:
            raise PhazeError(
                f"{where}: attention must be one of {', '.join(ATTENTION_MODES)}, got "
                f"{r['attention']!r}"
            )
        row["attention"] = attention or None
        etp = (r.get("expert_tensor_parallel") or "").strip()
        if etp not in ("", "1", str(row["tensor_parallel"])):
            raise PhazeError(
                f"{where}: expert_tensor_parallel must be 1 or the tensor-parallel size "
                f"({row['tensor_parallel']}), got {etp!r}"
            )
        row["etp"] = int(etp) if etp else None
        spec = get_model_spec(row["model"])  # an unknown model: one line naming the registry's
        layout = (r.get("pipeline_layout") or "").strip()
        row["chunks"] = None
        if layout:
            try:
                row["chunks"] = parse_pipeline_layout(
                    layout,
                    row["pipeline_parallel"],
                    row["interleave"],
                    spec.repeated_blocks,
                    spec.dense_blocks,
                )
            except PhazeError as exc:
                raise PhazeError(f"{where}: {exc}") from None
        run = tuple(v for k, v in row.items() if k not in ("iteration_time_s", "source"))
        if run in seen:
            raise PhazeError(f"{where} repeats the run of row {seen[run]}")
        seen[run] = i
        out.append(row)
    return out


def is_runs_table(path: Path | str) -> bool:
    """Whether a reference CSV is a table of runs (it has a ``model`` column)."""
    return "model" in _csv_rows(Path(path))[0]


def read_reference(path: Path | str = REFERENCE) -> list[dict]:
    path = Path(path)
    rows = _csv_rows(path)
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
    return _strategy(row, ddp="overlap" if row["ddp"] == "torch" else "after")


def _strategy(row: dict, **settings):
    """A reference row's strategy on every GPU: its parallel sizes, microbatch, interleaving,
    recomputation and sequence parallelism, plus ``settings``."""
    return Strategy(
        devices=row["gpus"],
        tp=row["tensor_parallel"],
        pp=row["pipeline_parallel"],
        microbatch=row["microbatch"],
        global_batch=row["global_batch"],
        interleave=row["interleave"],
        recompute=row["recompute"],
        sequence_parallel=row["sequence_parallel"],
        **settings,
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


def run_strategy(row: dict):
    """The strategy a run of a table of runs was trained with (every device used)."""
    return _strategy(
        row,
        distributed_optimizer=row["distributed_optimizer"],
        ddp=row["ddp"],
        ep=row["expert_parallel"],
        cp=row.get("context_parallel", 1),
        chunks=row.get("chunks"),
        etp=row.get("etp"),
    )


def validate_runs(config: dict, reference: Path | str) -> dict:
    """Predicted vs measured iteration times of a table of runs."""
    rows = []
    for ref in read_runs(reference):
        spec = get_model_spec(ref["model"])
        preset = load_preset(ref["preset"])
        strategy = run_strategy(ref)
        settings = {k: ref[k] for k in ("precision", "attention") if ref[k] is not None}
        run_config = {**config, "fidelity": {**config["fidelity"], **settings}}
        result = evaluate_strategy(
            spec, strategy, preset, seq=ref["seq"], config=run_config, name=ref["preset"]
        )
        published_s = ref["iteration_time_s"]
        rows.append(
            _report_row(
                ref,
                strategy,
                result,
                published_s,
                result["model_flops"] / ref["gpus"],
                model=ref["model"],
                preset=ref["preset"],
                ep=strategy.ep,
                precision=run_config["fidelity"]["precision"],
                attention=run_config["fidelity"].get("attention", "eager"),
                cp=strategy.cp,
                source=ref["source"],
            )
        )
    return _summary(sorted({r["preset"] for r in rows}), rows)


def _report_row(ref, strategy, result, published_s, flops_per_gpu, **label) -> dict:
    """One validated run: ``label`` (what names it), its strategy, the published and predicted
    times and TFLOP/s per GPU (``flops_per_gpu`` over each time), the prediction's breakdown."""
    predicted_s = result["iteration_time_s"]
    return {
        **label,
        "tp": strategy.tp,
        "pp": strategy.pp,
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
        "published_tflops_per_gpu": flops_per_gpu / published_s / 1e12,
        "predicted_tflops_per_gpu": flops_per_gpu / predicted_s / 1e12,
        "breakdown": result["breakdown"],
        "peak_memory_bytes": result["peak_memory_bytes"],
        "fits_memory": result["fits_memory"],
    }


def _summary(presets, rows: list[dict]) -> dict:
    errors = [abs(r["error"]) for r in rows]
    return {
        "preset": ",".join(presets),
        "rows": rows,
        "mean_abs_error": sum(errors) / len(errors),
        "max_abs_error": max(errors),
        "spearman": spearman(
            [r["predicted_tflops_per_gpu"] for r in rows],
            [r["published_tflops_per_gpu"] for r in rows],
        ),
    }


def validate(config: dict, reference: Path | str = REFERENCE) -> dict:
    if is_runs_table(reference):
        return validate_runs(config, reference)
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
        rows.append(
            _report_row(
                ref,
                strategy,
                result,
                published_s,
                flops / ref["gpus"],
                params_billion=ref["params_billion"],
            )
        )
    return _summary([PRESET], rows)


def format_table(report: dict) -> str:
    named = any("model" in r for r in report["rows"])
    ctx = any(r.get("cp", 1) > 1 for r in report["rows"])  # a context-parallel column
    width = max([7] + [len(r.get("model", "")) for r in report["rows"]])
    head = (
        f"{'model':>{width}} {'t':>2} {'p':>3} {'d':>3} {'gpus':>5} {'b':>3} {'V':>2} "
        + (f"{'e':>2} " if named else "")
        + (f"{'c':>2} " if ctx else "")
        + f"{'ddp':>7} "
        + (f"{'prec':>4} {'attention':>9} " if named else "")
        + f"{'recompute':>12} "
        f"{'published_s':>11} {'predicted_s':>11} {'error':>7} {'pub_TF':>6} {'pred_TF':>7}  "
        f"largest non-compute terms (s)"
    )
    lines = [head]
    for r in report["rows"]:
        bd = {k: v for k, v in r["breakdown"].items() if k not in ("compute_s", "recompute_s")}
        top = sorted(bd.items(), key=lambda kv: -kv[1])[:2]
        terms = ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in top)
        label = r["model"] if "model" in r else f"{r['params_billion']:g}B"
        lines.append(
            f"{label:>{width}} {r['tp']:>2} {r['pp']:>3} {r['dp']:>3} {r['gpus']:>5} "
            f"{r['microbatch']:>3} {r['interleave']:>2} "
            + (f"{r['ep']:>2} " if named else "")
            + (f"{r.get('cp', 1):>2} " if ctx else "")
            + f"{r['ddp']:>7} "
            + (f"{r.get('precision', ''):>4} {r.get('attention', ''):>9} " if named else "")
            + f"{r['recompute'] + ('+sp' if r['sequence_parallel'] else ''):>12} "
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
