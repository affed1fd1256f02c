"""Config loading shared by `phaze evaluate` and `phaze validate`."""

from __future__ import annotations

import json
from pathlib import Path

from phaze.errors import PhazeError


def load(path: str | None) -> dict:
    """The default config, a YAML file, or the workflow's JSON snapshot (read as JSON: YAML 1.1
    reads JSON numbers such as ``1e-06`` as strings)."""
    from phaze.config import load_config, validate_config

    if path is not None and path.endswith(".json"):
        p = Path(path)
        if not p.is_file():
            raise PhazeError(f"config file not found: {path}")
        try:
            return validate_config(json.loads(p.read_text()))
        except json.JSONDecodeError as exc:
            raise PhazeError(f"config file {path} is not valid JSON: {exc}") from exc
    return load_config(path)
