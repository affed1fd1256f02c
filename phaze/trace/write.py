"""Write a trace's three tables (atomically, schema-checked) and a provenance file."""

from __future__ import annotations

import platform
from pathlib import Path

from phaze.io import write_json_atomic, write_table
from phaze.io.atomic import ensure_dir
from phaze.trace.models import ModelSpec


def write_trace(trace, out_dir: Path, spec: ModelSpec) -> None:
    import torch  # deferred: torch
    import transformers  # deferred: transformers

    ensure_dir(out_dir)
    write_table(trace.ops, out_dir / "ops.parquet", "ops")
    write_table(trace.edges, out_dir / "edges.parquet", "edges")
    # layers last: a reader that finds it finds the others complete
    write_table(trace.layers, out_dir / "layers.parquet", "layers")
    first = trace.layers.iloc[0]
    write_json_atomic(
        out_dir / "trace.json",
        {
            "model": spec.name,
            "family": spec.family,
            "num_blocks": spec.num_blocks,
            "hidden": spec.hidden,
            "heads": spec.heads,
            "ffn": spec.ffn,
            "vocab": spec.vocab,
            "kv_heads": spec.kv_heads,
            "moe": trace.moe,
            "microbatch": int(first["microbatch"]),
            "seq_len": int(first["seq_len"]),
            "tp": int(first["tp"]),
            "config_path": spec.config_path,
            "recorded_ops": trace.recorded_ops,
            "collapsed_views": trace.collapsed_views,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
    )
