"""The search's input files: placement and schedule tables listed in a manifest (phaze.io.manifest)
with the round and tier each holds; nothing is read from a file's name."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from phaze.errors import PhazeError
from phaze.io.manifest import read_manifest
from phaze.io.tables import read_table
from phaze.search.dominance import edges_of
from phaze.search.scores import COMPONENT_KEY, TIERS

#: placement tiers (phaze.search.scores): ub = on lower bounds, lo = on list schedules, ilp = on
#: the ILP's makespans, ilp_ub = on the ILP's proven lower bounds, deep / deep_ub = the same on
#: the deeper ILP, certify / certify_ub = on the certify solve (``space``, the space bound, comes
#: in tables of its own: kind "space")
PLACE_TIERS = tuple(t for t in TIERS if t != "space")
#: schedule tiers: bounds (list schedule + lower bound), ilp, deep, certify, blind (the
#: baseline's ILP)
SCHEDULE_TIERS = ("bounds", "ilp", "deep", "certify", "blind")

#: kind -> the keys (and types) of each manifest entry, besides its path
MANIFEST_FIELDS = {
    "state": {},  # the search's final state.json (the summary's)
    "place": {"model": str, "microbatch": int, "round": int, "tier": str},
    "space": {"model": str, "microbatch": int},
    "blind_place": {"model": str, "microbatch": int, "tier": str},
    "blind": {"model": str},
    "schedules": {"model": str, "microbatch": int, "tp": int, "tier": str},
}


def load_manifest(path: str, kinds: tuple[str, ...]) -> dict[str, list[dict]]:
    """The manifest's entries of ``kinds`` (any other kind in it is an error), tiers checked."""
    doc = read_manifest(path, {k: MANIFEST_FIELDS[k] for k in kinds})
    for kind, entries in doc.items():
        allowed = SCHEDULE_TIERS if kind == "schedules" else PLACE_TIERS
        for e in entries:
            if "tier" in e and e["tier"] not in allowed:
                raise PhazeError(
                    f"manifest {path}: {e['path']} has tier {e['tier']!r} (known: {allowed})"
                )
    return doc


def load_place(entries: list[dict]) -> pd.DataFrame:
    """Placement tables with the manifest's ``tier`` and the file as ``source``."""
    frames = []
    for e in entries:
        df = read_table(e["path"], "place")
        frames.append(df.assign(tier=e["tier"], source=e["path"]))
    if not frames:
        return pd.DataFrame(columns=["tier", "source"])
    return pd.concat(frames, ignore_index=True)


def _space_file(e: dict) -> pd.DataFrame:
    df = read_table(e["path"], "bounds")
    bad = (df["model"] != e["model"]) | (df["microbatch"] != e["microbatch"])
    if bad.any():
        raise PhazeError(
            f"{e['path']}: rows of another model or microbatch than the manifest says "
            f"({e['model']}, {e['microbatch']})"
        )
    return df


#: the space bounds' columns a round step keeps (the dominance steps' text goes to the edges)
SPACE_COLUMNS = [*COMPONENT_KEY, "throughput_upper_seq_s"]


def load_space_steps(entries: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(space bounds, dominance steps): the space bounds (``phaze search bounds``) of every
    (model, microbatch) listed without their ``dominated_by`` text, and that text's steps (:func:`phaze.search.dominance.edges_of`) — a file at a time, so the
    text of every component (the same per architecture at every HBM and cluster size) is never
    held at once."""
    frames, steps = [], []
    for e in entries:
        df = _space_file(e)
        steps.append(df[STEP_COLUMNS].drop_duplicates(STEP_COLUMNS[:3]))
        frames.append(df[SPACE_COLUMNS])
        del df
    if not frames:
        return pd.DataFrame(columns=SPACE_COLUMNS), edges_of(pd.DataFrame())
    space = pd.concat(frames, ignore_index=True)
    del frames
    return space, edges_of(pd.concat(steps, ignore_index=True))


STEP_COLUMNS = ["model", "microbatch", "arch", "dominated_by"]


#: peak resident bytes of a round step per component of the space: `search select` on round 0
#: peaks at 1.97 GB for config/paper.yaml's 2,823,744 components (697 B each) and at 4.19 GB for
#: the fine grid's two models, 4,747,384 components (883 B each: fewer components per
#: architecture, so the per-architecture tables weigh more), rounded up; benchmarks/README.md,
#: "Memory of a round step". The step holds every component in one table, so its memory grows
#: with their number
BYTES_PER_COMPONENT = 900
#: a cgroup limit at least this large is "no limit" (cgroup v1 reports 2^63 rounded to a page)
_NO_LIMIT = 2**60


def _cgroup_limit(proc: Path, cgroup_root: Path) -> int | None:
    """This process's cgroup memory limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``)."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":
            candidates = [
                cgroup_root / rel / "memory.max",
                cgroup_root / "unified" / rel / "memory.max",
            ]
        elif "memory" in controllers.split(","):
            candidates = [cgroup_root / "memory" / rel / "memory.limit_in_bytes"]
        else:
            continue
        for f in candidates:
            try:
                text = f.read_text().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < _NO_LIMIT:
                limits.append(int(text))
    return min(limits) if limits else None


def available_memory_bytes(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")):
    """The memory a step may take: the smaller of the machine's MemAvailable and the process's
    cgroup limit (a SLURM job's); None when neither can be read (no check then)."""
    found = []
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    limit = _cgroup_limit(proc, cgroup_root)
    if limit is not None:
        found.append(limit)
    return min(found) if found else None


def check_components(n: int, step: str, available: int | None = None) -> None:
    """Refuse a round step over ``n`` components that would need more memory than there is: one
    line with the count, the need and what is available, instead of the kernel's out-of-memory
    kill halfway."""
    available = available_memory_bytes() if available is None else available
    need = n * BYTES_PER_COMPONENT
    if available is not None and need > available:
        raise PhazeError(
            f"{step}: the space has {n:,} components (architectures x models x microbatches x "
            f"HBM sizes x cluster sizes), about {need / 1e9:.1f} GB at {BYTES_PER_COMPONENT} B "
            f"each for a round step, and {available / 1e9:.1f} GB is available: use a smaller "
            "space or fewer models, microbatches or HBM sizes"
        )


def check_memory(entries: list[dict], step: str, available: int | None = None) -> int:
    """:func:`check_components` on the rows of the space bounds listed (their metadata only,
    before anything is loaded). Returns the count."""
    n = 0
    for e in entries:
        try:
            n += pq.read_metadata(e["path"]).num_rows
        except OSError:
            continue  # read_table names a missing or unreadable file next
    check_components(n, step, available)
    return n
