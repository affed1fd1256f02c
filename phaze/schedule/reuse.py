"""Solutions kept across jobs and runs: what one schedule job solved, looked up by the next.

A schedule job keeps, per job, a cache of the instances it solved (whole layer instances and
the segments they decompose into), keyed by ``Instance.cache_key`` (structure, core counts,
latencies up to a common scale). ``write_solutions`` stores that cache beside the job's table as
``<table>.solutions.parquet``: one row per key with the solution (op start times, intra-op
choices), its proven lower bound and its status. A later job given earlier runs' results
(config ``schedule.reuse``) loads the rows solved in the same *context* (tier, solver limits,
the scheduler's code) and takes a solution for an instance equal to one of them as a cache hit:
re-timed on its own latencies and re-verified, exactly as an in-job hit is. So an overlay that
changes what a schedule does not read (say the network: only the layers' collectives change)
re-solves only the instances that differ.

Each reused answer is a verified schedule of the instance and a lower bound proven for it, so
certificates stay valid; the answer is the one the earlier run found, which with seeds from
neighbouring architectures may differ (within the gap) from what this run would have found on
its own. A run without ``schedule.reuse`` reads nothing of the kind and depends on its config
alone.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from phaze.errors import PhazeError
from phaze.io.atomic import atomic_path
from phaze.schedule.listsched import Schedule
from phaze.schedule.solve import Result

SUFFIX = ".solutions.parquet"
_SCHEDULER_CODE = Path(__file__).resolve().parent

_SCHEMA = pa.schema(
    [
        ("context", pa.string()),
        ("key", pa.string()),
        ("scale", pa.float64()),
        ("makespan_s", pa.float64()),
        ("lower_bound_s", pa.float64()),
        ("upper_bound_s", pa.float64()),
        ("status", pa.string()),
        ("method", pa.string()),
        ("start", pa.list_(pa.float64())),
        ("y", pa.list_(pa.int8())),
    ]
)


def code_digest() -> str:
    """SHA-256 of the scheduler's source (phaze/schedule/*.py): a solution is reused only by the
    code that would have found it."""
    h = hashlib.sha256()
    for f in sorted(_SCHEDULER_CODE.glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def context_of(opts) -> str:
    """16 hex digits naming what a solution depends on besides its instance: the tier, every
    solver setting of ``opts`` (phaze.schedule.solve.Options) and the scheduler's code."""
    fields = {k: v for k, v in sorted(vars(opts).items())}
    text = json.dumps(fields, sort_keys=True, default=str) + code_digest()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_solutions(path: str | Path, cache: dict, context: str) -> int:
    """Write a Scheduler's cache (key -> (Result, scale)) to ``path`` atomically; rows sorted by
    key (the file does not depend on the order of solving). Returns the number of rows."""
    keys = sorted(cache)
    cols: dict[str, list] = {f.name: [] for f in _SCHEMA}
    for k in keys:
        res, scale = cache[k]
        cols["context"].append(context)
        cols["key"].append(k)
        cols["scale"].append(float(scale))
        cols["makespan_s"].append(float(res.makespan_s))
        cols["lower_bound_s"].append(float(res.lower_bound_s))
        cols["upper_bound_s"].append(float(res.upper_bound_s))
        cols["status"].append(res.status)
        cols["method"].append(res.method)
        cols["start"].append([float(t) for t in res.schedule.start])
        cols["y"].append([int(v) for v in res.schedule.y])
    table = pa.table(cols, schema=_SCHEMA)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return len(keys)


def solution_files(roots: list[str], trace_dir: str | Path, out: str | Path) -> list[Path]:
    """The solution files of the same trace (``schedule/<model>/<tag>/``, every tier) under each
    earlier run's results directory of ``roots``. A root that is not a directory, or that holds
    ``out`` (this run's own results: its answers would depend on which of its jobs ran first),
    is an error."""
    trace_dir = Path(trace_dir)
    rel = Path(trace_dir.parent.name) / trace_dir.name
    own = Path(out).resolve()
    files: list[Path] = []
    for root in roots:
        r = Path(root)
        if not r.is_dir():
            raise PhazeError(
                f"schedule.reuse: {root} is not a directory (an earlier run's results)"
            )
        if own.is_relative_to(r.resolve()):
            raise PhazeError(
                f"schedule.reuse: {root} holds this job's own output {out}; name earlier runs' "
                "results only"
            )
        files += sorted((r / "schedule" / rel).rglob(f"*{SUFFIX}"))
    return files


def load_solutions(files: list[Path], context: str) -> dict:
    """key -> (Result, scale) of the rows of ``files`` solved in ``context`` (the first file
    that has a key wins, in the order given). A file that cannot be read is an error."""
    found: dict = {}
    for f in files:
        try:
            df = pq.read_table(f, filters=[("context", "==", context)]).to_pandas()
        except (pa.ArrowInvalid, OSError, KeyError) as exc:
            raise PhazeError(f"schedule.reuse: cannot read {f}: {exc}") from exc
        for row in df.itertuples(index=False):
            if row.key in found:
                continue
            sched = Schedule(
                [float(t) for t in np.asarray(row.start)], [int(v) for v in np.asarray(row.y)]
            )
            res = Result(
                row.makespan_s,
                row.lower_bound_s,
                row.upper_bound_s,
                row.status,
                row.method,
                0.0,
                sched,
            )
            found[row.key] = (res, float(row.scale))
    return found


def read_solutions(path: str | Path) -> pd.DataFrame:
    """A solutions file as a frame (for inspection and tests)."""
    return pq.read_table(path).to_pandas()
