"""Inputs that contradict each other or the machine are refused with one line before any work:
presets against config/preset_schema.yaml, a stage's flags against the trace they restate,
grids and counts too large to hold, keys written twice, selections that say two things."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

import phaze.config
from phaze.arch import presets
from phaze.arch.presets import PRESET_DIR, check_preset, list_presets, load_preset
from phaze.cli import main
from phaze.config import check_grid_size, grid_points, load_config, schema_defaults
from phaze.errors import PhazeError
from phaze.io.tables import write_table
from tests.test_place_tables import PEAK, layers_frame, schedule_frame

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
TEST_CONFIG = str(REPO / "config" / "test.yaml")


def one_error_line(capsys, stage: str) -> str:
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"phaze {stage}: error: "), err
    return err[0]


def _a100() -> dict:
    return yaml.safe_load((PRESET_DIR / "a100-80gb.yaml").read_text())


def _with(doc: dict, path: tuple, value) -> dict:
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


@pytest.fixture
def preset_dir(tmp_path, monkeypatch):
    """A preset directory of copies of the shipped presets that a test may add to."""
    d = tmp_path / "presets"
    d.mkdir()
    for p in PRESET_DIR.glob("*.yaml"):
        (d / p.name).write_text(p.read_text())
    monkeypatch.setattr(presets, "PRESET_DIR", d)
    presets._load.cache_clear()
    yield d
    presets._load.cache_clear()


# --- presets -----------------------------------------------------------------------------------
def test_every_shipped_preset_passes_the_preset_schema():
    for name in list_presets():
        assert load_preset(name)["arch"]["freq_hz"] > 0


@pytest.mark.parametrize(
    "path, value, needle",
    [
        (("costmodel", "hbm_bandwidth_Bps"), -2.039e12, "costmodel/hbm_bandwidth_Bps"),
        (("arch", "freq_hz"), float("inf"), "arch/freq_hz: NaN and infinite"),
        (("arch", "freq_hz"), float("nan"), "arch/freq_hz: NaN and infinite"),
        (("arch", "freq_hz"), 0, "arch/freq_hz"),
        (("gpu", "hbm_capacity_bytes"), "80GiB", "gpu/hbm_capacity_bytes: '80GiB' is not of type"),
        (("arch", "n_tc"), 108.5, "arch/n_tc"),
        (("arch", "glb_bytes"), 1e300, "arch/glb_bytes"),
        (("network", "intra_node", "bandwidth_Bps"), 0, "network/intra_node/bandwidth_Bps"),
        (("network", "devices_per_node"), "8", "network/devices_per_node"),
        (("costmodel", "hbm_efficiency"), 1.5, "costmodel/hbm_efficiency"),
        (("costmodel", "no_such_key"), 1.0, "no_such_key"),
        (("gpu", "peak_fp8_flops"), -1.0, "gpu/peak_fp8_flops"),
        (("gpu", "hbm_bytes"), 1, "gpu.hbm_bytes was renamed"),
        (("sources", "n_tc"), 3, "sources/n_tc"),
    ],
)
def test_a_bad_preset_value_names_the_file_and_the_key(path, value, needle):
    with pytest.raises(PhazeError) as err:
        check_preset(_with(_a100(), path, value), "config/presets/x.yaml")
    assert "preset config/presets/x.yaml" in str(err.value)
    assert needle in str(err.value)


def test_a_further_peak_key_of_the_gpu_section_is_accepted_when_positive():
    doc = _with(_a100(), ("gpu", "peak_fp8_flops"), 6.24e14)
    assert check_preset(doc, "x")["gpu"]["peak_fp8_flops"] == 6.24e14


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "--matmul", "64", "64", "64", "--arch", "bad"],
        ["optimize", "--model", "opt-350m", "--arch", "bad", "--devices", "8"]
        + ["--global-batch", "64"],
        ["validate"],  # reads a100-80gb, broken below as well
    ],
)
def test_every_stage_that_reads_a_preset_refuses_a_bad_one(preset_dir, capsys, argv):
    bad = _with(_a100(), ("costmodel", "hbm_bandwidth_Bps"), -2.039e12)
    for name in ("bad", "a100-80gb"):
        (preset_dir / f"{name}.yaml").write_text(yaml.safe_dump(bad))
    assert main([*argv, "--config", TEST_CONFIG]) == 2
    line = one_error_line(capsys, argv[0])
    assert "invalid at costmodel/hbm_bandwidth_Bps" in line and str(preset_dir) in line


def test_a_config_naming_a_bad_preset_is_refused_when_read(preset_dir, tmp_path):
    (preset_dir / "bad.yaml").write_text(yaml.safe_dump(_with(_a100(), ("arch", "n_tc"), -1)))
    (tmp_path / "c.yaml").write_text("arch: {presets: [bad]}\n")
    with pytest.raises(PhazeError, match="bad.yaml invalid at arch/n_tc"):
        load_config(tmp_path / "c.yaml")


def test_a_preset_key_written_twice_is_refused(preset_dir, capsys):
    text = (preset_dir / "a100-80gb.yaml").read_text()
    (preset_dir / "twice.yaml").write_text(text.replace("arch:\n", "arch:\n  n_tc: 4\n", 1))
    argv = ["estimate", "--matmul", "64", "64", "64", "--arch", "twice"]
    assert main([*argv, "--config", TEST_CONFIG]) == 2
    assert "key 'n_tc' is written twice" in one_error_line(capsys, "estimate")


# --- config files ------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_config_key_written_twice_is_refused(tmp_path, suffix):
    path = tmp_path / f"c{suffix}"
    text = (
        "models: [opt-350m]\nmodels: [bert-large]\n"
        if suffix == ".yaml"
        else '{"models": ["opt-350m"], "models": ["bert-large"]}'
    )
    path.write_text(text)
    with pytest.raises(PhazeError, match="key 'models' is written twice"):
        load_config(path)


def test_a_yaml_merge_key_may_still_be_overridden(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("x: &a {global_batch: 8}\nplace:\n  <<: *a\n  global_batch: 16\n")
    with pytest.raises(PhazeError, match="x"):  # the unknown top-level key, not a repeat
        load_config(path)


# --- sizes -------------------------------------------------------------------------------------
def test_a_grid_too_large_for_the_memory_is_refused_with_its_size():
    arch = schema_defaults()["arch"]
    assert grid_points(arch) == 75712
    check_grid_size(arch, memory_bytes=10**9)
    with pytest.raises(PhazeError, match="the grid has 75,712 points"):
        check_grid_size(arch, memory_bytes=10**6)
    arch = {**arch, "vc_width": [1, 2, 4]}
    assert grid_points(arch) == 3 * 75712


def test_a_grid_of_a_hundred_million_points_is_refused_when_the_config_is_read(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(phaze.config, "machine_memory_bytes", lambda: 32 * 2**30)
    axis = list(range(1, 101))
    cfg = {"arch": {"n_tc": axis, "n_vc": axis, "tc_width": axis, "tc_depth": axis}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"arch": {**cfg["arch"], "glb_mib": [64]}}))
    with pytest.raises(PhazeError, match="the grid has 100,000,000 points"):
        load_config(tmp_path / "c.yaml")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["place", "--devices", "99999999999999999999"], "--devices: 99999999999999999999 is too"),
        (["optimize", "--hbm-gib", "inf"], "--hbm-gib: expected a finite number"),
        (["evaluate", "--global-batch", "1e3"], "expected an integer"),
        (["trace", "--microbatch", "-99999999999999999999"], "too large to represent"),
    ],
)
def test_numbers_beyond_64_bits_or_not_finite_are_usage_errors(capsys, argv, needle):
    assert main(argv) == 2
    assert needle in one_error_line(capsys, argv[0])


def test_a_trace_whose_largest_tensor_cannot_be_addressed_is_refused(tmp_path, capsys):
    argv = ["trace", "--model", "opt-350m", "--microbatch", str(2**62)]  # a registry model:
    # no transformers import before the check
    assert main([*argv, "--seq", "8", "--out", str(tmp_path / "t")]) == 2
    assert "microbatch 4611686018427387904 x sequence length 8 is too large to trace" in (
        one_error_line(capsys, "trace")
    )


def test_a_config_count_beyond_64_bits_is_refused(tmp_path):
    (tmp_path / "c.yaml").write_text("place: {devices: [100000000000000000000]}\n")
    with pytest.raises(PhazeError, match="place/devices/0"):
        load_config(tmp_path / "c.yaml")


# --- outputs -----------------------------------------------------------------------------------
def test_an_unwritable_output_is_refused_before_the_trace_is_computed(
    tmp_path, capsys, monkeypatch
):
    import phaze.trace.cli

    def traced(*args, **kwargs):
        raise AssertionError("the model was read before the output was checked")

    monkeypatch.setattr(phaze.trace.cli, "get_model_spec", traced)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    argv = ["trace", "--model", "opt-350m", "--microbatch", "1", "--out", str(blocker / "t")]
    assert main(argv) == 2
    assert "is a file" in one_error_line(capsys, "trace")


# --- selections --------------------------------------------------------------------------------
@pytest.fixture
def estimate_inputs(tmp_path):
    from tests.test_estimate import fixture_ops, small_space

    space = small_space()
    write_table(fixture_ops(), tmp_path / "t" / "ops.parquet", "ops")
    write_table(space, tmp_path / "space.parquet", "space")
    chunks = pd.DataFrame({"arch": list(space["arch"][:1]), "chunk": [0]})
    chunks.to_parquet(tmp_path / "chunks.parquet", index=False)
    argv = ["estimate", "--trace", str(tmp_path / "t"), "--space", str(tmp_path / "space.parquet")]
    return tmp_path, [*argv, "--out", str(tmp_path / "lat.parquet")]


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--archs", ""], "--archs takes architecture ids separated by commas, got ''"),
        (["--archs", ","], "got ','"),
        (["--archs", "a,,b"], "got 'a,,b'"),
        (["--archs", "{a},{a}"], "--archs lists {a} twice"),
        (["--archs", "{a}", "--chunk", "0"], "both select architectures"),
    ],
)
def test_an_empty_repeated_or_contradicted_archs_selection_is_refused(
    estimate_inputs, capsys, extra, needle
):
    tmp_path, argv = estimate_inputs
    a = pd.read_parquet(tmp_path / "space.parquet")["arch"].iloc[0]
    extra, needle = [x.format(a=a) for x in extra], needle.format(a=a)
    if "--chunk" in extra:
        extra = [*extra, "--chunks", str(tmp_path / "chunks.parquet")]
    assert main([*argv, *extra]) == 2
    assert needle in one_error_line(capsys, "estimate")
    assert not (tmp_path / "lat.parquet").exists()


def test_a_binary_reference_table_is_refused(tmp_path, capsys):
    (tmp_path / "ref.csv").write_bytes(bytes(range(256)) * 8)
    assert main(["validate", "--reference", str(tmp_path / "ref.csv")]) == 2
    assert "is not a text file" in one_error_line(capsys, "validate")


# --- a placement's flags against its traces ----------------------------------------------------
@pytest.fixture
def place_inputs(tmp_path, space_table):
    """test_place_tables' two-tp inputs, the layers as `phaze trace` records them (model,
    microbatch, seq_len, tp columns) with a trace.json each."""
    args = {"trace": [], "sched": []}
    for t in (1, 2):
        d = tmp_path / f"trace_t{t}"
        layers = pd.DataFrame(layers_frame(t)).assign(model="tiny", microbatch=1, seq_len=64, tp=t)
        write_table(layers, d / "layers.parquet", "layers")
        meta = {"model": "tiny", "microbatch": 1, "seq_len": 64, "tp": t}
        (d / "trace.json").write_text(json.dumps(meta))
        write_table(schedule_frame(t), tmp_path / f"sched_t{t}.parquet", "schedule")
        args["trace"].append(str(d))
        args["sched"].append(str(tmp_path / f"sched_t{t}.parquet"))
    space = space_table(list(PEAK), peak_flops=list(PEAK.values()), preset="")
    write_table(space, tmp_path / "space.parquet", "space")
    place = {"devices": [16], "global_batch": 256, "recompute": ["none", "full"]}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({"models": ["tiny"], "place": place}))
    return tmp_path, args


def _place(tmp_path, args, model="tiny", microbatch="1", devices=()) -> int:
    argv = ["place", "--model", model, "--tp", "1", "2", "--trace-dirs", *args["trace"]]
    argv += ["--schedules", *args["sched"], "--space", str(tmp_path / "space.parquet")]
    argv += ["--hbm-gib", "32", "--microbatch", microbatch, "--config", str(tmp_path / "cfg.yaml")]
    argv += ["--devices", *devices] if devices else []
    return main([*argv, "--out", str(tmp_path / "place.parquet")])


def test_place_on_traces_it_agrees_with_places(place_inputs):
    tmp_path, args = place_inputs
    assert _place(tmp_path, args) == 0
    assert set(pd.read_parquet(tmp_path / "place.parquet")["model"]) == {"tiny"}


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"microbatch": "4"}, "--microbatch 4 but {d} is a trace of microbatch 1"),
        ({"model": "bert-large"}, "--model bert-large but {d} is a trace of model tiny"),
        ({"devices": ("8", "8")}, "--devices lists 8 twice"),
    ],
)
def test_place_flags_that_contradict_the_traces_are_refused(place_inputs, capsys, change, needle):
    tmp_path, args = place_inputs
    assert _place(tmp_path, args, **change) == 2
    assert needle.format(d=args["trace"][0]) in one_error_line(capsys, "place")
    assert not (tmp_path / "place.parquet").exists()


def test_traces_that_disagree_with_each_other_are_refused(place_inputs, capsys):
    tmp_path, args = place_inputs
    meta = Path(args["trace"][1]) / "trace.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "seq_len": 128}))
    assert _place(tmp_path, args) == 2
    line = one_error_line(capsys, "place")
    assert "trace.json says seq_len 128 but its layers table says 64" in line
    layers = pd.read_parquet(Path(args["trace"][1]) / "layers.parquet").assign(seq_len=128)
    layers.to_parquet(Path(args["trace"][1]) / "layers.parquet", index=False)
    assert _place(tmp_path, args) == 2
    assert "the traces disagree" in one_error_line(capsys, "place")


# --- the workflow's dry run ----------------------------------------------------------------------
@pytest.mark.slow  # three `snakemake -n` starts: ~20 s, ~55 s on 2 busy cores
def test_the_dry_run_stops_on_each_with_one_line(tmp_path, copy_checkout, snakemake):
    """A grid no machine holds (1000^4 points, 600 TB to enumerate), a model whose config.json is invalid (two lines
    before: the library's message had a line break) and a key written twice."""
    work = copy_checkout(tmp_path / "w")
    cfg = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    axis = list(range(1, 1001))
    grid = {**cfg, "arch": {**cfg["arch"], "n_tc": axis, "n_vc": axis, "tc_width": axis}}
    grid["arch"]["tc_depth"] = axis
    (work / "grid.yaml").write_text(yaml.safe_dump(grid))
    hf = json.loads((DATA / "tiny-gpt2" / "config.json").read_text())
    (work / "m").mkdir()
    (work / "m" / "config.json").write_text(json.dumps({**hf, "n_layer": 2.5}))
    (work / "model.yaml").write_text(yaml.safe_dump({**cfg, "models": ["m/config.json"]}))
    (work / "twice.yaml").write_text(yaml.safe_dump(cfg) + "models: [bert-large]\n")
    for name, needle in (
        ("grid.yaml", "the grid has 1,000,000,000,000 points"),
        ("model.yaml", "Field 'n_layer' expected int"),
        ("twice.yaml", "key 'models' is written twice"),
    ):
        dry = snakemake(work, "-n", "--configfile", name, timeout=300)
        lines = (dry.stdout + dry.stderr).strip().splitlines()
        assert dry.returncode != 0 and len(lines) == 1, (name, lines)
        assert lines[0].startswith("phaze: error: ") and needle in lines[0], (name, lines)
