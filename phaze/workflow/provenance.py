"""Helpers the Snakefile uses to make reruns precise.

* ``code_version(*parts)`` hashes the source of the given subpackages/modules. Rules put it in
  ``params:``; Snakemake's default rerun trigger on params then re-runs a job exactly when the code
  it depends on changed (by content, not mtime, so a fresh clone or `git pull` of unchanged code
  does not re-run anything).
* ``config_section(config, *keys)`` is what a rule puts in ``params:`` for the config it reads, so
  an edit to another stage's section does not re-run it.
* ``snapshot_config(config, path)`` writes the validated, merged config once (only if its content
  changed) for stage CLIs to read with ``--config``.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from phaze.io.atomic import write_text_atomic

PACKAGE_ROOT = Path(__file__).resolve().parent
# Code every stage depends on.
_COMMON = ("io", "config.py", "errors.py", "cli.py")


def code_version(*parts: str) -> str:
    h = hashlib.sha256()
    for part in sorted(set(parts) | set(_COMMON)):
        p = PACKAGE_ROOT / part
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            if f.exists():
                h.update(str(f.relative_to(PACKAGE_ROOT)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def config_section(config: dict, *keys: str) -> str:
    return json.dumps({k: config.get(k) for k in keys}, sort_keys=True)


# A JSON string literal, or a number whose mantissa lacks a decimal point (json writes 1e-06).
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|(?<![\w.])(-?\d+)([eE][-+]?\d+)')


def yaml_safe_json(obj) -> str:
    """JSON that YAML 1.1 loaders also read with the same types.

    Stage CLIs read the snapshot with a YAML loader (JSON is YAML), and YAML 1.1 takes json's
    ``1e-06`` for a string; ``1.0e-06`` is a float to both."""
    text = json.dumps(obj, indent=2, sort_keys=True)
    return _JSON_TOKEN.sub(
        lambda m: m.group(0) if m.group(1) is None else f"{m.group(1)}.0{m.group(2)}", text
    )


def snapshot_config(config: dict, path: str | Path) -> str:
    text = yaml_safe_json(config) + "\n"
    path = Path(path)
    if not path.exists() or path.read_text() != text:
        write_text_atomic(path, text)
    return str(path)
