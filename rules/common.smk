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


def model_tmps(model):
    """Tensor-parallel widths traced for a model: config trace.tmp that the model admits."""
    valid = _get_model_spec(MODEL_ARG[model]).valid_tmp
    return [t for t in config["trace"]["tmp"] if t in valid]


def model_seq(model):
    return config["trace"]["seq"].get(MODEL_ARG[model]) or _get_model_spec(MODEL_ARG[model]).seq


def tag(model, mbs, tmp):
    return f"b{mbs}_s{model_seq(model)}_t{tmp}"


def trace_dir(model, mbs, tmp):
    return f"{RESULTS}/trace/{model}/{tag(model, mbs, tmp)}"


def gib_str(h):
    return f"{h:g}"


wildcard_constraints:
    model=r"[^/]+",
    mbs=r"\d+",
    tmp=r"\d+",
    seq=r"\d+",
    chunk=r"\d+",
    round=r"\d+",
    hbm=r"[0-9.]+",
    rec=r"on|off",
    tier=r"ub|lo|ilp",
