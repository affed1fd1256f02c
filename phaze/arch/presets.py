"""Named architecture presets: ``config/presets/NAME.yaml``.

A preset file has an ``arch:`` section (the space-table parameters n_tc, n_vc, tc_width, tc_depth,
vc_width, glb_bytes, freq_hz), an optional ``costmodel:`` section (overrides of the config's
costmodel constants for this architecture, e.g. its own ``hbm_bandwidth_Bps``) and ``sources:``
(where each number comes from). Other top-level sections are for other stages and are ignored here.
"""

from __future__ import annotations

import copy
from functools import cache

import yaml

from phaze.arch.area import peak_flops
from phaze.errors import PhazeError
from phaze.paths import REPO_ROOT

PRESET_DIR = REPO_ROOT / "config" / "presets"
ARCH_KEYS = ("n_tc", "n_vc", "tc_width", "tc_depth", "vc_width", "glb_bytes", "freq_hz")
_INT_KEYS = ARCH_KEYS[:-1]


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


@cache
def _load(name: str) -> dict:
    path = PRESET_DIR / f"{name}.yaml"
    if not path.exists():
        raise PhazeError(f"unknown preset {name!r} (no {path}); known: {list_presets()}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise PhazeError(f"preset {path} is not valid YAML: {exc}") from exc
    arch = data.get("arch")
    if not isinstance(arch, dict):
        raise PhazeError(f"preset {path} needs an `arch:` mapping")
    missing = [k for k in ARCH_KEYS if k not in arch]
    if missing:
        raise PhazeError(f"preset {path} arch section is missing {missing}")
    for key in ARCH_KEYS:
        value = arch[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise PhazeError(f"preset {path}: arch.{key} must be a positive number, got {value!r}")
        if key in _INT_KEYS and int(value) != value:
            raise PhazeError(f"preset {path}: arch.{key} must be an integer, got {value!r}")
    gpu = data.get("gpu")
    if isinstance(gpu, dict) and "hbm_bytes" in gpu:
        raise PhazeError(f"preset {path}: gpu.hbm_bytes was renamed: write gpu.hbm_capacity_bytes")
    costmodel = data.get("costmodel") or {}
    if not isinstance(costmodel, dict):
        raise PhazeError(f"preset {path}: `costmodel:` must be a mapping")
    data["arch"] = {k: (int(arch[k]) if k in _INT_KEYS else float(arch[k])) for k in ARCH_KEYS}
    data["costmodel"] = costmodel
    data.setdefault("sources", {})
    return data


def load_preset(name: str) -> dict:
    """The preset's dict (``arch``, ``costmodel``, ``sources``, and any other sections); a copy."""
    return copy.deepcopy(_load(name))


def preset_peak_flops(preset: dict) -> float:
    """Tensor-core peak FLOP/s of a preset's architecture (phaze.arch.area.peak_flops)."""
    a = preset["arch"]
    return float(peak_flops(a["n_tc"], a["tc_width"], a["tc_depth"], a["freq_hz"]))
