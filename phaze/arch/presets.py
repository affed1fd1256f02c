"""Named architecture presets: ``config/presets/NAME.yaml``.

A preset file has an ``arch:`` section (the space-table parameters n_tc, n_vc, tc_width, tc_depth,
vc_width, glb_bytes, freq_hz), an optional ``costmodel:`` section (overrides of the config's
costmodel constants for this architecture, e.g. its own ``hbm_bandwidth_Bps``) and ``sources:``
(where each number comes from); ``network:`` and ``gpu:`` are read by place, evaluate and
optimize. Every preset is checked against config/preset_schema.yaml when it is read (types,
units, ranges; no NaN or infinity; no key written twice), whichever stage reads it.
"""

from __future__ import annotations

import copy
from functools import cache

import jsonschema
import yaml
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from phaze.arch.area import peak_flops
from phaze.errors import PhazeError
from phaze.paths import REPO_ROOT
from phaze.schema import check_network_form, first_error, non_finite, read_document

PRESET_DIR = REPO_ROOT / "config" / "presets"
PRESET_SCHEMA = REPO_ROOT / "config" / "preset_schema.yaml"
CONFIG_SCHEMA = REPO_ROOT / "config" / "schema.yaml"
ARCH_KEYS = ("n_tc", "n_vc", "tc_width", "tc_depth", "vc_width", "glb_bytes", "freq_hz")
_INT_KEYS = ARCH_KEYS[:-1]


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


@cache
def _validator() -> jsonschema.protocols.Validator:
    """The preset schema (config/preset_schema.yaml), its costmodel and network sections referring
    to the workflow config's schema (config/schema.yaml)."""
    preset_schema = yaml.safe_load(PRESET_SCHEMA.read_text())
    config_schema = yaml.safe_load(CONFIG_SCHEMA.read_text())
    registry = Registry().with_resource(
        "urn:phaze:config-schema", DRAFT202012.create_resource(config_schema)
    )
    return jsonschema.Draft202012Validator(preset_schema, registry=registry)


def check_preset(data, path) -> dict:
    """``data`` (a preset file's document) checked against the preset schema: a PhazeError with
    one line naming the file and the key, else ``data``."""
    if not isinstance(data, dict):
        raise PhazeError(f"preset {path} must hold a mapping at the top level")
    gpu = data.get("gpu")
    if isinstance(gpu, dict) and "hbm_bytes" in gpu:
        raise PhazeError(f"preset {path}: gpu.hbm_bytes was renamed: write gpu.hbm_capacity_bytes")
    bad = non_finite(data)
    if bad:
        raise PhazeError(
            f"preset {path} invalid at {bad}: NaN and infinite numbers are not allowed"
        )
    check_network_form(data.get("network"), f"preset {path} invalid at network")
    error = first_error(_validator(), data)
    if error:
        raise PhazeError(f"preset {path} invalid at {error}")
    return data


@cache
def _load(name: str) -> dict:
    path = PRESET_DIR / f"{name}.yaml"
    if not path.exists():
        raise PhazeError(f"unknown preset {name!r} (no {path}); known: {list_presets()}")
    data = check_preset(read_document(path, "preset") or {}, path)
    arch = data["arch"]
    data["arch"] = {k: (int(arch[k]) if k in _INT_KEYS else float(arch[k])) for k in ARCH_KEYS}
    data["costmodel"] = data.get("costmodel") or {}
    data.setdefault("sources", {})
    return data


def load_preset(name: str) -> dict:
    """The preset's dict (``arch``, ``costmodel``, ``sources``, and any other sections); a copy."""
    return copy.deepcopy(_load(name))


def preset_peak_flops(preset: dict) -> float:
    """Tensor-core peak FLOP/s of a preset's architecture (phaze.arch.area.peak_flops)."""
    a = preset["arch"]
    return float(peak_flops(a["n_tc"], a["tc_width"], a["tc_depth"], a["freq_hz"]))
