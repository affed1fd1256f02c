"""What the rules put in ``params:`` so that reruns are precise, and the config snapshot.

* ``code_version(*parts)`` hashes the source of the given subpackages/modules. Rules put it in
  ``params:``; Snakemake's default rerun trigger on params then re-runs a job exactly when the code
  it depends on changed (by content, not mtime, so a fresh clone or `git pull` of unchanged code
  does not re-run anything).
* ``config_section(config, *keys)`` is what a rule puts in ``params:`` for the config it reads, so
  an edit to another stage's section does not re-run it.
* ``snapshot_path(config, results)`` / ``snapshot_config(config, path)``: the validated, merged
  config as JSON under a name made of its content's hash, ``results/.config/<hash>.json``, written
  once and never rewritten. Every job reads the snapshot of the run that started it (the Snakefile
  exports its path as ``$PHAZE_CONFIG``), so a dry run or another invocation with another config
  next to a running workflow writes its own file and cannot change that run's results.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from phaze.io.atomic import write_text_atomic

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
# Code every stage depends on.
_COMMON = ("io", "config.py", "paths.py", "errors.py", "cli.py")


def code_version(*parts: str) -> str:
    """16 hex digits of the SHA-256 of the named parts of the package (subpackage directories or
    module files, relative to phaze/) and of the code every stage uses."""
    h = hashlib.sha256()
    for part in sorted(set(parts) | set(_COMMON)):
        p = PACKAGE_ROOT / part
        if not p.exists():
            raise FileNotFoundError(f"code_version: phaze/{part} does not exist")
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(PACKAGE_ROOT)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


#: config keys that change how a job computes, not what its answer means: no rerun trigger
#: (``schedule.reuse``: where earlier solutions are looked up)
NOT_TRIGGERS = ("schedule.reuse",)


def config_section(config: dict, *keys: str) -> str:
    """The config sections a rule reads (``section`` or ``section.key``), as one canonical JSON
    string, without the keys of NOT_TRIGGERS."""

    def value(key: str):
        node = config
        for part in key.split("."):
            node = node[part]
        if isinstance(node, dict):
            drop = {k.removeprefix(f"{key}.") for k in NOT_TRIGGERS if k.startswith(f"{key}.")}
            node = {k: v for k, v in node.items() if k not in drop}
        return node

    return json.dumps({k: value(k) for k in keys}, sort_keys=True)


def _snapshot_text(config: dict) -> str:
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def snapshot_path(config: dict, results: str | Path) -> str:
    """Where the snapshot of ``config`` lives: results/.config/<16 hex digits of its SHA-256>.json."""
    digest = hashlib.sha256(_snapshot_text(config).encode()).hexdigest()[:16]
    return str(Path(results) / ".config" / f"{digest}.json")


def snapshot_config(config: dict, path: str | Path) -> str:
    """Write the snapshot to ``path`` unless a file with exactly this content is there; a file
    there with other content (a snapshot is never rewritten) is an internal error."""
    text = _snapshot_text(config)
    path = Path(path)
    if path.exists():
        if path.read_text() != text:
            raise RuntimeError(f"config snapshot {path} exists with other content")
        return str(path)
    write_text_atomic(path, text)
    return str(path)
