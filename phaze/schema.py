"""What the workflow config and the architecture presets share when they are read: YAML and JSON
that refuse a key written twice, the first NaN or infinite number of a document, a JSON Schema
validator, and one-line messages naming the file and the key."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import yaml

from phaze.errors import PhazeError
from phaze.network import NETWORK_FORMS


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping with a key written twice (PyYAML keeps the last)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # keys merged in (<<: *anchor) may be overridden, as YAML intends
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            continue  # SafeLoader reports an unhashable key itself
        if key in seen:
            raise PhazeError(
                f"key {key!r} is written twice (lines {seen[key] + 1} and "
                f"{key_node.start_mark.line + 1}); write it once"
            )
        seen[key] = key_node.start_mark.line
    loader.flatten_mapping(node)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def _unique_pairs(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise PhazeError(f"key {twice[0]!r} is written twice; write it once")
    return dict(pairs)


def read_document(path: str | Path, what: str):
    """The parsed YAML (or, for a ``.json`` file, JSON) document of ``path``; a PhazeError naming
    ``what`` and the file for an unreadable file, a syntax error or a key written twice."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise PhazeError(f"{what} {path} is not a text file (not UTF-8)") from None
    except OSError as exc:
        raise PhazeError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    try:
        if path.suffix == ".json":
            # JSON through json: YAML 1.1 reads `1e-06` (no dot) as a string.
            return json.loads(text, object_pairs_hook=_unique_pairs)
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except json.JSONDecodeError as exc:
        raise PhazeError(f"{what} {path} is not valid JSON: {exc}") from exc
    except yaml.YAMLError as exc:
        raise PhazeError(f"{what} {path} is not valid YAML: {' '.join(str(exc).split())}") from exc
    except PhazeError as exc:
        raise PhazeError(f"{what} {path}: {exc}") from None


def non_finite(node, where: str = "") -> str | None:
    """The first NaN or infinite number in a nested document, as ``a/b/0``; None if none."""
    if isinstance(node, float) and not math.isfinite(node):
        return where or "<top>"
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, value in items:
        found = non_finite(value, f"{where}/{key}" if where else str(key))
        if found:
            return found
    return None


def first_error(validator: jsonschema.protocols.Validator, document) -> str | None:
    """``where: message`` of the first schema error (in key order) of ``document``; None if it
    is valid."""
    errors = sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.path)))
    if not errors:
        return None
    e = errors[0]
    where = "/".join(str(p) for p in e.absolute_path) or "<top>"
    return f"{where}: {e.message}"


def check_network_form(network, where: str) -> None:
    """A network section (config place.network, a preset's network) is one form or the other: a
    one-line error naming the topology or the keys of the other form (the schema would report a
    missing key of the form it guessed). ``where`` starts the message, e.g. ``config invalid at
    place/network``."""
    if not isinstance(network, dict):
        return
    topology = network.get("topology", "two_level")
    if not isinstance(topology, str) or topology not in NETWORK_FORMS:
        raise PhazeError(
            f"{where}/topology: unknown topology {topology!r} (known: {', '.join(NETWORK_FORMS)})"
        )
    others = set().union(*(keys for t, keys in NETWORK_FORMS.items() if t != topology))
    mixed = sorted(others & set(network))
    if mixed:
        raise PhazeError(
            f"{where}: topology {topology!r} takes "
            f"{', '.join(sorted(NETWORK_FORMS[topology]))}, not {', '.join(mixed)}"
        )
