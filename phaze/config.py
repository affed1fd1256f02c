"""The one config loader: read a workflow config and validate it against config/schema.yaml.

``load_config(path)`` is what every ``python -m phaze <stage> --config FILE`` calls, and the
Snakefile validates its merged config with the same ``validate_config``, so a stage run alone sees
exactly the values a workflow run sees:

* ``path=None`` means ``config/config.yaml``, the config ``snakemake`` runs without
  ``--configfile``;
* a ``.json`` file (the workflow's snapshot, ``results/.config/<hash>.json``) is read with ``json``,
  anything else as YAML;
* absent keys take the schema's ``default`` values (JSON Schema 2020-12, validated with
  ``Draft202012Validator`` extended to fill defaults, as Snakemake's ``validate`` does). Code reads
  the validated mapping and repeats no default; ``schema_defaults()`` is the schema's defaults
  alone, for library functions called without a config.

Beyond the schema: no number may be NaN or infinite, every microbatch size must divide the global
batch and every preset named must exist (``_check_consistency``), so the Snakefile's validation
stops a dry run on them. The tensor-parallel width was once called ``tmp``; a config that still
uses that key is rejected with an error naming ``tp``. Likewise for keys that moved to another
section (the step accounting now in ``step``) and for the old on/off form of ``place.recompute``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import jsonschema
import yaml

from phaze.arch.presets import list_presets, load_preset
from phaze.errors import PhazeError
from phaze.paths import REPO_ROOT
from phaze.schema import check_network_form, non_finite, read_document

SCHEMA_PATH = REPO_ROOT / "config" / "schema.yaml"
DEFAULT_CONFIG = REPO_ROOT / "config" / "config.yaml"
# keys that were renamed: old name -> new name (reported, never silently accepted)
RENAMED_KEYS = {"tmp": "tp"}
# keys that moved to another section: old path -> new path
MOVED_KEYS = {
    **{
        f"fidelity.{k}": f"step.{k}"
        for k in (
            "state_bytes_per_param",
            "grad_bytes_per_param",
            "optimizer_bytes_per_param",
            "ddp_bucket_bytes",
            "scatter_gather",
        )
    },
    "place.scatter_gather": "step.scatter_gather",
}
# keys renamed in their section (docs/design.md, Glossary): old path -> new path
RENAMED_PATHS = {"schedule.gap": "schedule.mip_gap"}


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


_Validator = _extend_with_default(jsonschema.Draft202012Validator)


@functools.lru_cache(maxsize=1)
def _schema() -> dict:
    with open(SCHEMA_PATH) as fh:
        return yaml.safe_load(fh)


def load_schema() -> dict:
    return copy.deepcopy(_schema())


def _renamed_key(node, where: str = "") -> str | None:
    """The first renamed key in a nested mapping, as ``a.b.key``; None if there is none."""
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if key in RENAMED_KEYS:
                return path
            found = _renamed_key(value, path)
            if found:
                return found
    return None


def _check_consistency(config: dict) -> None:
    """What the schema cannot say: the global batch splits into every microbatch size, an expert
    placement's etp is its tp or 1, and every preset named exists (checked when the config is read, so a dry run fails, not a job later)."""
    batch = config["place"]["global_batch"]
    for mbs in config["trace"]["microbatch"]:
        if mbs > batch or batch % mbs:
            raise PhazeError(
                f"config invalid: place.global_batch {batch} is not a multiple of "
                f"trace.microbatch {mbs} (every microbatch size must divide the global batch)"
            )
    for model, e in config["place"]["expert"].items():
        if e.get("etp", e["tp"]) not in (1, e["tp"]):
            raise PhazeError(
                f"config invalid at place.expert.{model}: etp {e['etp']} must be its tp "
                f"({e['tp']}) or 1"
            )
    check_grid_size(config["arch"])
    named = [("arch.presets", p) for p in config["arch"]["presets"]] + [
        ("arch.area_budget.reference_preset", config["arch"]["area_budget"]["reference_preset"]),
        ("search.baseline_preset", config["search"]["baseline_preset"]),
    ]
    known = list_presets()
    for where, name in named:
        if name not in known:
            raise PhazeError(f"config invalid at {where}: unknown preset {name!r}; known: {known}")
        load_preset(name)  # checked against config/preset_schema.yaml: a dry run stops on it


#: peak memory of `phaze arch` per grid point, bytes: 242 MB for a grid of 10^5 points and 766
#: MB for 10^6, 582-593 B per point (benchmarks/README.md, Arch), rounded up
ARCH_BYTES_PER_POINT = 600


def grid_points(arch: dict) -> int:
    """The number of points of the architecture grid of config section ``arch`` (before the area
    filter): the product of its axes' lengths."""
    axes = ["n_tc", "n_vc", "tc_width", "tc_depth", "glb_mib", "freq_hz"]
    lengths = [len(set(arch[a])) for a in axes]
    if arch["vc_width"] != "tc_width":
        lengths.append(len(set(arch["vc_width"])))
    return math.prod(lengths)


def machine_memory_bytes() -> int | None:
    """This machine's memory, or the process's cgroup v2 limit where smaller; None if unknown."""
    found = []
    try:
        found.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        pass
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if text.isdigit():
            found.append(int(text))
    except OSError:
        pass
    return min(found) if found else None


def check_grid_size(arch: dict, memory_bytes: int | None = None) -> None:
    """Refuse a grid whose enumeration cannot fit this machine's memory (one line with the count,
    the need and the memory), before any job: `snakemake -n` and `phaze arch` stop on it."""
    points = grid_points(arch)
    memory_bytes = machine_memory_bytes() if memory_bytes is None else memory_bytes
    need = points * ARCH_BYTES_PER_POINT
    if memory_bytes is not None and need > memory_bytes:
        raise PhazeError(
            f"config invalid at arch: the grid has {points:,} points (the product of the axes' "
            f"lengths), about {need / 1e9:.3g} GB at {ARCH_BYTES_PER_POINT} B each to enumerate, "
            f"and this machine has {memory_bytes / 1e9:.3g} GB: use shorter axes"
        )


def validate_config(config: dict) -> dict:
    """Validate in place (filling defaults) and return the config."""
    old = _renamed_key(config)
    if old:
        head, _, key = old.rpartition(".")
        new = f"{head}.{RENAMED_KEYS[key]}" if head else RENAMED_KEYS[key]
        raise PhazeError(f"config key {old} was renamed: write {new}")
    for path, new in MOVED_KEYS.items():
        section, key = path.split(".")
        if isinstance(config.get(section), dict) and key in config[section]:
            raise PhazeError(f"config key {path} moved: write {new}")
    for path, new in RENAMED_PATHS.items():
        section, key = path.split(".")
        if isinstance(config.get(section), dict) and key in config[section]:
            raise PhazeError(f"config key {path} was renamed: write {new}")
    recompute = (config.get("place") or {}).get("recompute")
    if isinstance(recompute, list) and any(isinstance(x, bool) for x in recompute):
        raise PhazeError(
            "config place.recompute lists recompute modes now, not on/off: write e.g. "
            "[none, selective, full] (false was none, true full)"
        )
    check_network_form(
        (config.get("place") or {}).get("network"), "config invalid at place/network"
    )
    bad = non_finite(config)
    if bad:
        raise PhazeError(f"config invalid at {bad}: NaN and infinite numbers are not allowed")
    errors = sorted(_Validator(_schema()).iter_errors(config), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.path) or "<top>"
        raise PhazeError(f"config invalid at {where}: {e.message}")
    _check_consistency(config)
    return config


@functools.lru_cache(maxsize=1)
def _defaults() -> dict:
    return validate_config({})


def schema_defaults() -> dict:
    """The schema's defaults alone (a fresh copy): the config of an empty config file."""
    return copy.deepcopy(_defaults())


def load_config(path: str | Path | None = None) -> dict:
    """Read and validate a config file; ``None`` means the default config/config.yaml."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    if not path.is_file():
        raise PhazeError(f"config file not found: {path}")
    config = read_document(path, "config file") or {}
    if not isinstance(config, dict):
        raise PhazeError(f"config file {path} must hold a mapping at the top level")
    return validate_config(config)


def check_config_files(paths: Iterable[str | Path]) -> None:
    """The config files a workflow run merged (Snakemake's ``--configfile`` list) read again the
    strict way: a syntax error or a key written twice (which Snakemake's reader lets the last
    one win) is a PhazeError naming the file."""
    for path in paths:
        if Path(path).is_file():
            read_document(path, "config file")


_CONVERSIONS = {"float": float, "int": int, "bool": bool}


def from_section(
    cls,
    section: Mapping,
    *,
    given: Mapping | None = None,
    not_keys: Iterable[str] = (),
    convert: bool = False,
):
    """An instance of dataclass ``cls`` built from a validated config section: every field takes
    the section's key of its name (a missing key is a KeyError), except the fields in ``given``
    (these values) and in ``not_keys`` (no config key: the field's default). With ``convert``, a
    field declared ``float``, ``int`` or ``bool`` gets its value converted to that type. The
    class's own ``__post_init__`` validates, as for any other construction."""
    given = dict(given or {})
    not_keys = set(not_keys)
    values = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name in not_keys:
            continue
        value = given.pop(f.name) if f.name in given else section[f.name]
        if convert:
            kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", None)
            value = _CONVERSIONS[kind](value) if kind in _CONVERSIONS else value
        values[f.name] = value
    if given:
        raise TypeError(f"{cls.__name__} has no fields {sorted(given)}")
    return cls(**values)


def add_config_argument(parser) -> None:
    """The ``--config`` option every stage CLI takes."""
    parser.add_argument(
        "--config",
        help="workflow config (YAML, or the workflow's JSON snapshot); default config/config.yaml",
    )
