"""The one config loader (phaze.config): which file `None` means, JSON vs YAML, defaults from the
schema, the old `tmp` key, and the schema's JSON Schema draft."""

from __future__ import annotations

import dataclasses
import json
import re

import jsonschema
import pytest
import yaml

from phaze.cli import main
from phaze.config import (
    DEFAULT_CONFIG,
    from_section,
    load_config,
    load_schema,
    schema_defaults,
    validate_config,
)
from phaze.errors import PhazeError
from phaze.io import read_table
from phaze.schedule.solve import Options
from phaze.search.scores import SearchSettings
from phaze.step.model import StepConstants
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
        ("etp.yaml", "trace: {etp: [2]}\n", "trace/etp"),
        (
            "expert_etp.yaml",
            "place: {expert: {m: {pp: 1, dp: 1, tp: 4, etp: 2}}}\n",
            "place.expert.m: etp 2 must be its tp (4) or 1",
        ),
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
        (
            {"schedule": {"gap": 0.01}},
            "config key schedule.gap was renamed: write schedule.mip_gap",
        ),
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


def test_from_section_builds_a_dataclass_from_its_fields_keys():
    @dataclasses.dataclass
    class Section:
        ratio: float
        count: int
        name: str
        on: bool
        given: float = 0.0
        not_a_key: int = 7
        derived: int = dataclasses.field(init=False, default=0)

    section = {"ratio": 1, "count": 3.0, "name": "x", "on": 1, "unread": None}
    kept = from_section(Section, section, given={"given": 2}, not_keys=("not_a_key",))
    assert kept == Section(1, 3.0, "x", 1, 2)  # as the section has them
    assert type(kept.ratio) is int and type(kept.on) is int
    built = from_section(Section, section, given={"given": 2}, not_keys=["not_a_key"], convert=True)
    assert (built.ratio, built.count, built.name, built.on, built.given) == (1.0, 3, "x", True, 2.0)
    assert [type(v) for v in (built.ratio, built.count, built.on, built.given)] == [
        float,
        int,
        bool,
        float,
    ]
    assert built.not_a_key == 7 and built.derived == 0
    with pytest.raises(KeyError, match="count"):  # a missing key, as section["count"] raises
        from_section(Section, {k: v for k, v in section.items() if k != "count"}, given={})
    with pytest.raises(KeyError, match="not_a_key"):  # not listed: a key like any other
        from_section(Section, section, given={"given": 2})
    with pytest.raises(TypeError, match=r"Section has no fields \['typo'\]"):
        from_section(Section, section, given={"given": 2, "typo": 1}, not_keys=("not_a_key",))


def test_the_components_built_from_config_sections():
    """Options, StepConstants and SearchSettings from their sections: every key read, the
    conversions each did by hand, their own validation and messages."""
    defaults = schema_defaults()
    schedule = {**defaults["schedule"], "mip_gap": 0, "threads": 2.0, "cache": 0, "time_limit_s": 5}
    opts = Options.from_config(schedule, "bounds")
    assert opts == Options(
        tier="bounds",
        time_limit_s=5.0,
        mip_gap=0.0,
        threads=2,
        cache=False,
        watchdog_s=float(schedule["watchdog_s"]),
        decompose=bool(schedule["decompose"]),
        node_limit=int(schedule["node_limit"]),
        bnb_node_limit=int(schedule["bnb_node_limit"]),
    )
    assert (type(opts.mip_gap), type(opts.threads), opts.cache, opts.local_search, opts.bnb) == (
        float,
        int,
        False,
        True,
        True,
    )
    with pytest.raises(KeyError, match="node_limit"):
        Options.from_config({k: v for k, v in schedule.items() if k != "node_limit"}, "ilp")

    step = {**defaults["step"], "ddp_bucket_bytes": 4, "scatter_gather": 1}
    consts = StepConstants.from_config(step, 900)
    assert consts.hbm_bandwidth_Bps == 900.0 and type(consts.hbm_bandwidth_Bps) is float
    assert consts.ddp_bucket_bytes == 4.0 and type(consts.ddp_bucket_bytes) is float
    assert consts.scatter_gather is True
    assert consts.state_bytes_per_param == float(step["state_bytes_per_param"])
    with pytest.raises(PhazeError, match=r"^HBM bandwidth must be > 0 B/s$"):
        StepConstants.from_config(step, 0)
    with pytest.raises(PhazeError, match=r"optimizer-state bytes per parameter must be in"):
        StepConstants.from_config({**step, "optimizer_state_bytes_per_param": 1e9}, 900)

    search = {**defaults["search"], "gap": 0}
    settings = SearchSettings.from_config(search)
    fields = [f.name for f in dataclasses.fields(SearchSettings)]
    assert settings == SearchSettings(**{k: search[k] for k in fields})
    assert type(settings.gap) is int  # taken as it is, no conversion (as before)
    with pytest.raises(PhazeError, match=r"^search.gap must be in \[0, 1\), got 1.5$"):
        SearchSettings.from_config({**search, "gap": 1.5})
    with pytest.raises(PhazeError, match=r"^search.mode must be one of global"):
        SearchSettings.from_config({**search, "mode": "greedy"})


def test_a_preset_with_the_old_hbm_key_names_the_new_one(tmp_path, monkeypatch):
    from phaze.arch import presets

    src = (presets.PRESET_DIR / "h100-sxm.yaml").read_text()
    assert "hbm_capacity_bytes:" in src
    (tmp_path / "old.yaml").write_text(src.replace("hbm_capacity_bytes:", "hbm_bytes:", 1))
    monkeypatch.setattr(presets, "PRESET_DIR", tmp_path)
    presets._load.cache_clear()
    try:
        with pytest.raises(
            PhazeError, match="gpu.hbm_bytes was renamed: write gpu.hbm_capacity_bytes"
        ):
            presets.load_preset("old")
    finally:
        presets._load.cache_clear()


def _overlay(base: dict, top: dict) -> dict:
    """Snakemake's merge of --configfile A B: B's keys update A's, section by section."""
    out = dict(base)
    for k, v in top.items():
        out[k] = (
            _overlay(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
        )
    return out


def test_fine_grid_overlay_holds_the_paper_grid_and_8x_more():
    from pathlib import Path

    from phaze.arch.space import build_space

    cfg = Path(__file__).resolve().parents[1] / "config"
    paper = yaml.safe_load((cfg / "paper.yaml").read_text())
    fine = _overlay(paper, yaml.safe_load((cfg / "paper-fine.yaml").read_text()))
    assert set(fine) == set(paper) and fine["search"] == paper["search"]
    coarse, _ = build_space(validate_config(paper))
    finer, _ = build_space(validate_config(fine))
    # every architecture of upstream's grid is in the fine one (same ids), so its answer can
    # only be as fast or faster; and the space is at least 8x larger
    assert set(coarse["arch"]) <= set(finer["arch"])
    assert len(finer) >= 8 * len(coarse)


def test_ici_overlay_is_the_tpuv4_presets_torus_for_every_architecture():
    from pathlib import Path

    from phaze.arch.presets import load_preset

    cfg = Path(__file__).resolve().parents[1] / "config"
    paper = yaml.safe_load((cfg / "paper.yaml").read_text())
    top = yaml.safe_load((cfg / "paper-ici.yaml").read_text())
    ici = validate_config(_overlay(paper, top))
    torus = dict(load_preset("tpuv4")["network"])
    assert ici["place"]["network"] == torus
    assert ici["place"]["preset_networks"] is False  # presets on it too
    # only the network differs from the paper config
    plain = validate_config(paper)
    ici["place"]["network"] = None
    assert ici == plain


def test_reproduce_overlay_is_a_reduced_paper_sweep():
    from pathlib import Path

    cfg = Path(__file__).resolve().parents[1] / "config"
    paper = yaml.safe_load((cfg / "paper.yaml").read_text())
    small = validate_config(_overlay(paper, yaml.safe_load((cfg / "reproduce.yaml").read_text())))
    full = validate_config(paper)
    assert set(small["models"]) < set(full["models"])
    assert small["place"]["hbm_gib"] == [32]
    for section in ("trace", "arch", "costmodel", "schedule", "search", "step"):
        assert small[section] == full[section], section
