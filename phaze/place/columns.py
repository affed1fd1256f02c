"""The columns of a placement row that both objectives fill: the result of a placement (its
throughput, time, MFU, parallel degrees, axes, stages and their memory), with a prefix (``""``
for the searched placement, ``expert_`` for the expert placement)."""

from __future__ import annotations

import math

#: the placement axes of a row, with the value a model without that axis has
AXIS_DEFAULTS = {
    "interleave": 1,
    "recompute": "none",
    "sequence_parallel": False,
    "distributed_optimizer": False,
    "ddp": "after",
}


def empty_columns(prefix: str) -> dict:
    """The columns of no placement (nothing fits, or not configured)."""
    return {
        f"{prefix}throughput_seq_s": math.nan,
        f"{prefix}time_per_batch_s": math.nan,
        f"{prefix}mfu": math.nan,
        f"{prefix}pp": 0,
        f"{prefix}tp": 0,
        f"{prefix}dp": 0,
        f"{prefix}ep": 0,
        f"{prefix}etp": 0,
        **{f"{prefix}{k}": v for k, v in AXIS_DEFAULTS.items()},
        f"{prefix}stages": "[]",
        f"{prefix}stage_mem_bytes": "[]",
        f"{prefix}devices_used": 0,
        f"{prefix}max_stage_load_s": math.nan,
        f"{prefix}allreduce_s": math.nan,
        f"{prefix}optimizer_s": math.nan,
    }
