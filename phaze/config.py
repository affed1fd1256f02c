"""Load a workflow config (YAML) and validate it against config/schema.yaml.

The same schema is used by the Snakefile (``snakemake.utils.validate``) and by every
``python -m phaze <stage> --config FILE``, so a stage run alone sees exactly the defaults a
workflow run sees.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import yaml

from phaze.errors import PhazeError

REPO_ROOT = Path(__file__).resolve().parents[1]
SCHEMA_PATH = REPO_ROOT / "config" / "schema.yaml"
DEFAULT_CONFIG = REPO_ROOT / "config" / "config.yaml"


def _extend_with_default(validator_class):
    """A validator that also fills in ``default`` values (as Snakemake's validate does)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, subschema in properties.items():
                if "default" in subschema and prop not in instance:
                    instance[prop] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_Validator = _extend_with_default(jsonschema.Draft7Validator)


def load_schema() -> dict:
    with open(SCHEMA_PATH) as fh:
        return yaml.safe_load(fh)


def validate_config(config: dict) -> dict:
    """Validate in place (filling defaults) and return the config."""
    errors = sorted(_Validator(load_schema()).iter_errors(config), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.path) or "<top>"
        raise PhazeError(f"config invalid at {where}: {e.message}")
    return config


def load_config(path: str | Path | None = None) -> dict:
    """Read and validate a config file; ``None`` means the default config/config.yaml."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    if not path.exists():
        raise PhazeError(f"config file not found: {path}")
    try:
        with open(path) as fh:
            # JSON through json: YAML 1.1 reads `1e-06` (no dot) as a string.
            config = (json.load(fh) if path.suffix == ".json" else yaml.safe_load(fh)) or {}
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise PhazeError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(config, dict):
        raise PhazeError(f"config file {path} must hold a mapping at the top level")
    return validate_config(config)
