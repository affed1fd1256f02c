# Shared helpers for the rule files: the sweep's axes and the paths every rule agrees on.
# Rules stay thin: each calls `python -m phaze <stage>`.
import json as _json

from phaze.trace.models import get_model_spec as _get_model_spec

SEARCH = config["search"]
# Model key (used in paths and tables) -> the --model argument (registry name or config.json path)
MODEL_ARG = {_get_model_spec(m).name: m for m in config["models"]}
MODELS = list(MODEL_ARG)
MICROBATCHES = list(config["trace"]["microbatch"])
HBM_GIB = list(config["place"]["hbm_gib"])
RECOMPUTE = ["on" if r else "off" for r in config["place"]["recompute"]]
PAIRS = [(m, b) for m in MODELS for b in MICROBATCHES]


def model_tps(model):
    """Tensor-parallel widths traced for a model: config trace.tp that the model admits."""
    valid = _get_model_spec(MODEL_ARG[model]).valid_tp
    return [t for t in config["trace"]["tp"] if t in valid]


def model_seq(model):
    return config["trace"]["seq"].get(MODEL_ARG[model]) or _get_model_spec(MODEL_ARG[model]).seq


def tag(model, mbs, tp):
    return f"b{mbs}_s{model_seq(model)}_tp{tp}"


def trace_dir(model, mbs, tp):
    return f"{RESULTS}/trace/{model}/{tag(model, mbs, tp)}"


def gib_str(h):
    return f"{h:g}"


wildcard_constraints:
    model=r"[^/]+",
    mbs=r"\d+",
    tp=r"\d+",
    seq=r"\d+",
    chunk=r"\d+",
    round=r"\d+",
    hbm=r"[0-9.]+",
    rec=r"on|off",
    tier=r"ub|lo|ilp",
