"""The one config loader (phaze.config): which file `None` means, JSON vs YAML, defaults from the
schema, the old `tmp` key, and the schema's JSON Schema draft."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import yaml

from phaze.cli import main
from phaze.config import (
    DEFAULT_CONFIG,
    load_config,
    load_schema,
    schema_defaults,
    validate_config,
)
from phaze.errors import PhazeError
from phaze.io import read_table
from phaze.workflow import snapshot_config


def test_none_means_config_yaml_not_the_schema_defaults():
    assert load_config(None) == load_config(DEFAULT_CONFIG)
    # config.yaml's small grid, not the schema's full upstream grid
    assert (
        load_config(None)["arch"]["n_tc"]
        == yaml.safe_load(DEFAULT_CONFIG.read_text())["arch"]["n_tc"]
    )
    assert load_config(None)["arch"] != schema_defaults()["arch"]


def test_absent_keys_take_the_schema_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("models: [opt-350m]\nplace: {global_batch: 512}\n")
    cfg = load_config(path)
    defaults = schema_defaults()
    assert cfg["place"]["global_batch"] == 512
    for section in ("trace", "arch", "costmodel", "schedule", "search", "report", "fidelity"):
        assert cfg[section] == defaults[section], section
    assert {k: v for k, v in cfg["place"].items() if k != "global_batch"} == {
        k: v for k, v in defaults["place"].items() if k != "global_batch"
    }
    # schema_defaults hands out copies
    schema_defaults()["place"]["global_batch"] = -1
    assert schema_defaults()["place"]["global_batch"] == defaults["place"]["global_batch"]


def test_the_workflow_snapshot_is_read_as_json(tmp_path):
    cfg = load_config(None)
    cfg["costmodel"]["link_latency_s"] = 1e-06  # json writes 1e-06, which YAML 1.1 reads as text
    path = snapshot_config(cfg, tmp_path / ".config.json")
    assert "1e-06" in (tmp_path / ".config.json").read_text()
    again = load_config(path)
    assert again == cfg and isinstance(again["costmodel"]["link_latency_s"], float)


@pytest.mark.parametrize(
    "name,text,needle",
    [
        ("bad.json", '{"models": [', "is not valid JSON"),
        ("bad.yaml", "models: [opt-350m\n  x: : y", "is not valid YAML"),
        ("list.yaml", "- a\n- b\n", "mapping at the top level"),
        ("typo.yaml", "search: {patiense: 3}\n", "patiense"),
    ],
)
def test_bad_config_files_are_one_line_errors(tmp_path, name, text, needle):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(PhazeError) as err:
        load_config(path)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(PhazeError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    "config,old,new",
    [
        ({"trace": {"tmp": [1, 2]}}, "trace.tmp", "trace.tp"),
        ({"tmp": [1]}, "tmp", "tp"),
        ({"place": {"expert": {"gpt2-xl": {"pp": 1, "dp": 1, "tmp": 1}}}}, "gpt2-xl.tmp", "tp"),
    ],
)
def test_the_old_tmp_key_is_rejected_naming_tp(config, old, new):
    with pytest.raises(PhazeError) as err:
        validate_config(config)
    assert old in str(err.value) and new in str(err.value)


@pytest.mark.parametrize(
    "config,needle",
    [
        ({"fidelity": {"state_bytes_per_param": 16}}, "write step.state_bytes_per_param"),
        ({"fidelity": {"ddp_bucket_bytes": 1}}, "write step.ddp_bucket_bytes"),
        ({"place": {"scatter_gather": True}}, "write step.scatter_gather"),
        ({"place": {"recompute": [False, True]}}, "[none, selective, full]"),
        ({"place": {"recompute": [True]}}, "lists recompute modes now"),
    ],
)
def test_moved_keys_and_the_on_off_recompute_list_are_rejected_naming_the_new_form(config, needle):
    with pytest.raises(PhazeError, match=re.escape(needle)) as err:
        validate_config(config)
    assert "\n" not in str(err.value)


def test_the_schema_is_json_schema_2020_12_and_mentions_no_tmp():
    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert jsonschema.validators.validator_for(schema) is jsonschema.Draft202012Validator
    jsonschema.Draft202012Validator.check_schema(schema)
    assert "tmp" not in json.dumps(schema)
    assert "tp" in schema["properties"]["trace"]["properties"]


def test_every_cli_without_config_uses_config_yaml(tmp_path):
    # `phaze arch` was the CLI whose default differed (the schema's full grid)
    assert main(["arch", "--out", str(tmp_path / "a.parquet")]) == 0
    assert (
        main(["arch", "--config", str(DEFAULT_CONFIG), "--out", str(tmp_path / "b.parquet")]) == 0
    )
    a, b = read_table(tmp_path / "a.parquet"), read_table(tmp_path / "b.parquet")
    assert a.equals(b) and len(a) < 1000
