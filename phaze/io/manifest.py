"""Manifests: JSON files that list a job's input files together with what each one holds.

A job that reads many files of several kinds (the search's prune, state and summary steps) gets
one manifest instead of a list of paths, so it never has to recover a file's model, microbatch,
tensor-parallel width, round or tier from its name::

    {"place": [{"path": "results/place/m/h32_b1_roff/r0_ub.parquet", "model": "m",
                "microbatch": 1, "round": 0, "tier": "ub"}, ...],
     "schedules": [...], ...}

``read_manifest(path, fields)`` checks the document against ``fields`` (kind -> the keys every
entry of that kind must carry, with their types); an unknown kind, a missing or mistyped key, or
an entry whose file does not exist is an error that names the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from phaze.errors import PhazeError
from phaze.io.atomic import write_text_atomic


def write_manifest(path: str | os.PathLike, doc: dict[str, list[dict]]) -> str:
    """Write ``doc`` (kind -> entries, each with a ``path``) atomically; returns the path."""
    write_text_atomic(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return str(path)


def read_manifest(
    path: str | os.PathLike, fields: dict[str, dict[str, type]]
) -> dict[str, list[dict]]:
    """The manifest at ``path``, every kind of ``fields`` present (absent kinds are empty)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise PhazeError(f"manifest not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise PhazeError(f"manifest {path} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise PhazeError(f"manifest {path} must hold a mapping of kind -> entries")
    unknown = sorted(set(doc) - set(fields))
    if unknown:
        raise PhazeError(f"manifest {path}: unknown kinds {unknown} (known: {sorted(fields)})")
    out = {}
    for kind, keys in fields.items():
        entries = doc.get(kind, [])
        if not isinstance(entries, list):
            raise PhazeError(f"manifest {path}: {kind!r} must be a list of entries")
        for e in entries:
            _check_entry(path, kind, e, {"path": str, **keys})
        out[kind] = entries
    return out


def _check_entry(manifest: Path, kind: str, entry, keys: dict[str, type]) -> None:
    if not isinstance(entry, dict):
        raise PhazeError(f"manifest {manifest}: a {kind!r} entry is not a mapping: {entry!r}")
    name = entry.get("path", entry)
    missing = [k for k in keys if k not in entry]
    extra = sorted(set(entry) - set(keys))
    if missing or extra:
        raise PhazeError(
            f"manifest {manifest}: {kind} entry {name}: "
            + (f"lacks {missing}" if missing else f"has unknown keys {extra}")
        )
    for k, t in keys.items():
        v = entry[k]
        if not isinstance(v, t) or (t is int and isinstance(v, bool)):
            raise PhazeError(
                f"manifest {manifest}: {kind} entry {name}: {k} must be {t.__name__}, got {v!r}"
            )
    if not Path(entry["path"]).is_file():
        raise PhazeError(f"manifest {manifest}: {kind} file not found: {entry['path']}")
