"""Architecture space and area model (issue 3)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest
import yaml

from phaze.arch import area as am
from phaze.arch import calibrate
from phaze.arch.presets import load_preset
from phaze.arch.space import arch_id, build_space
from phaze.cli import main
from phaze.config import validate_config
from phaze.io.tables import read_table

MiB = 2**20


@pytest.fixture(scope="module")
def default_config():
    return validate_config({})


@pytest.fixture(scope="module")
def full_space(default_config):
    return build_space(default_config)


def test_every_area_anchor_within_5_percent(default_config):
    rows = calibrate.anchor_errors(default_config["arch"]["area"])
    assert len(rows) == 18
    for name, model, anchor in rows:
        assert abs(model / anchor - 1) <= 0.05, f"{name}: {model:.4f} vs {anchor}"


@pytest.fixture(scope="module")
def fitted():
    return calibrate.fit()


def _max_error(area_cfg):
    return max(abs(model / anchor - 1) for _, model, anchor in calibrate.anchor_errors(area_cfg))


def test_calibration_is_the_minimax_optimum_of_a_brute_force_exponent_scan(fitted):
    # the fitted constants achieve the reported objective ...
    assert _max_error(fitted) == pytest.approx(fitted["max_relative_error"], abs=1e-9)
    assert fitted["max_relative_error"] < 0.05
    # ... and no exponent of a fine scan does better (each point an exact LP)
    for e in np.linspace(0.80, 1.10, 301):
        c = calibrate.relative_rows(e)
        worst, _ = calibrate.min_max_error(c, range(c.shape[0]))
        assert worst >= fitted["max_relative_error"] - 1e-9, e


def test_calibration_is_the_lexicographic_minimax(fitted):
    """No nearby constants give a lexicographically smaller sorted error vector."""
    c = calibrate.relative_rows(fitted["sram_area_exponent"])
    x = np.array([fitted[k] for k in calibrate._FITTED])
    best = np.sort(np.abs(c @ x - 1.0))[::-1]
    rng = np.random.default_rng(0)
    for _ in range(300):
        y = x * (1 + rng.uniform(-1e-3, 1e-3, size=x.size) * rng.integers(0, 2, size=x.size))
        other = np.sort(np.abs(c @ y - 1.0))[::-1]
        diff = other - best
        first = next((d for d in diff if abs(d) > 1e-10), 0.0)
        assert first >= 0.0, y


def test_lexicographic_minimax_small_case_by_hand_and_brute_force():
    # errors x0 - 1, 2 x0 - 1, x1 - 1: the minimax fixes x0 = 2/3 (errors -1/3, +1/3) and
    # leaves x1 anywhere in [2/3, 4/3]; the lexicographic minimax takes x1 = 1 (error 0)
    c = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])
    x, levels = calibrate.lexicographic_minimax(c)
    assert x == pytest.approx([2 / 3, 1.0], abs=1e-8)
    assert levels[0] == pytest.approx(1 / 3, abs=1e-8) and levels[-1] == pytest.approx(0, abs=1e-8)
    # random 2-constant problems: the LP's minimax equals a brute-force grid search's
    rng = np.random.default_rng(1)
    grid = np.linspace(0.0, 4.0, 801)
    g0, g1 = np.meshgrid(grid, grid, indexing="ij")
    for _ in range(20):
        c = rng.uniform(0.5, 2.0, size=(5, 2))
        worst, x = calibrate.min_max_error(c, range(5))
        assert (x <= grid[-1]).all()
        brute = np.max(np.abs(c[:, :1, None] * g0 + c[:, 1:, None] * g1 - 1.0), axis=0).min()
        step = (grid[1] - grid[0]) * np.abs(c).sum(axis=1).max()
        assert worst <= brute + 1e-9 and worst >= brute - step
        assert np.max(np.abs(c @ x - 1.0)) == pytest.approx(worst, abs=1e-8)


def test_config_constants_are_the_calibration_result(default_config, fitted):
    """schema.yaml carries the fit rounded to 6 significant digits: within 1e-5 relative, and
    its worst anchor error within 1e-5 of the optimum (equal floats are not expected)."""
    cfg = default_config["arch"]["area"]
    for key in (*calibrate._FITTED, "sram_area_exponent"):
        assert cfg[key] == pytest.approx(fitted[key], rel=1e-5), key
    assert _max_error(cfg) <= fitted["max_relative_error"] + 1e-5


def test_sram_area_per_mib_falls_with_capacity(default_config):
    cfg = default_config["arch"]["area"]
    caps = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256]) * MiB
    per_mib = am.sram_area_mm2(caps, cfg) / (caps / MiB)
    assert np.all(np.diff(per_mib) < 0)
    assert np.all(np.diff(am.sram_area_mm2(caps, cfg)) > 0)


def test_tpuv4_peak_and_area(default_config):
    p = load_preset("tpuv4")["arch"]
    assert am.peak_flops(p["n_tc"], p["tc_width"], p["tc_depth"], p["freq_hz"]) == pytest.approx(
        2 * 8 * 128 * 128 * 1.05e9
    )
    assert am.peak_flops(8, 128, 128, 1.05e9) == pytest.approx(275e12, rel=0.001)
    a = am.accelerator_area_mm2(
        p["n_tc"],
        p["n_vc"],
        p["tc_width"],
        p["tc_depth"],
        p["vc_width"],
        p["glb_bytes"],
        default_config["arch"]["area"],
    )
    assert a == pytest.approx(278.8, rel=0.05)


def test_full_grid_matches_an_independent_filter(default_config, full_space):
    space, summary = full_space
    assert summary["grid_points"] == 75_712
    cfg = default_config["arch"]["area"]
    a_max = summary["area_budget_mm2"]
    kept = 0
    pw = [2**i for i in range(13)]
    wd = [2**i for i in range(1, 9)]
    glb = [2**i * MiB for i in range(1, 8)]
    for n_tc, n_vc, w, d, g in itertools.product(pw, pw, wd, wd, glb):
        a = (
            n_tc * am.tensor_core_area_mm2(w, d, cfg)
            + n_vc * am.vector_core_area_mm2(w, cfg)
            + am.glb_area_mm2(g, cfg)
        )
        low = 0.0 if (n_tc == 1 or n_vc == 1) else 0.3 * a_max
        kept += bool(low * (1 - 1e-9) <= a <= a_max * (1 + 1e-9))
    # the space is the kept grid (upstream's TPUv4 point labelled tpuv4-upstream) plus the
    # presets that are not grid points (the faithful tpuv4)
    on_grid = space.preset.isin(["", "tpuv4-upstream"])
    assert on_grid.sum() == kept and summary["kept"] == len(space) == kept + 1
    assert (space.preset == "tpuv4-upstream").sum() == 1
    # upstream kept 29,360; our fitted area model moves a few boundary points
    assert abs(kept - 29_360) / 29_360 < 0.01


def test_space_is_sorted_by_area_ids_unique_and_tpuv4_present(full_space):
    space, _ = full_space
    assert space["area_mm2"].is_monotonic_decreasing
    assert space["arch"].is_unique
    tpu = space[space.preset == "tpuv4"]
    assert len(tpu) == 1
    row = tpu.iloc[0]
    # TPU v4 as described publicly: 8 MXUs of 128x128, 2 VPUs of 8 x 128 lanes, 128 MiB CMEM
    assert (row.n_tc, row.n_vc, row.tc_width, row.tc_depth, row.vc_width, row.glb_bytes) == (
        8,
        2,
        128,
        128,
        1024,
        128 * MiB,
    )
    assert row.costmodel_overrides == ""  # tpuv4's own HBM bandwidth equals the default
    # the budget is upstream's TPUv4 point (tpuv4-upstream), a grid point: no grid point is
    # larger, and that point is in the grid with exactly the budget's area
    up = load_preset("tpuv4-upstream")["arch"]
    grid = space[space.preset != "tpuv4"]
    same = (grid[list(up)] == pd.Series(up)).all(axis=1)
    assert same.sum() == 1 and grid.loc[same, "preset"].iloc[0] == "tpuv4-upstream"
    assert grid.area_mm2.max() == pytest.approx(grid.loc[same, "area_mm2"].iloc[0])
    assert (
        space.peak_flops == 2 * space.n_tc * space.tc_width * space.tc_depth * space.freq_hz
    ).all()


def test_arch_id_is_stable_and_parameter_sensitive():
    p = load_preset("tpuv4-upstream")["arch"]
    # a literal: ids must not change across runs, machines or refactors
    assert arch_id(p) == "1d1d503f31d4"
    assert arch_id({**p, "glb_bytes": 64 * MiB}) != arch_id(p)
    assert arch_id(p, {"hbm_bandwidth_Bps": 2e12}) != arch_id(p)


def test_preset_costmodel_override_gets_its_own_id(default_config):
    config = json.loads(json.dumps(default_config))
    config["costmodel"]["hbm_bandwidth_Bps"] = 0.9e12  # now the preset's 1.2 TB/s is an override
    config["arch"].update(n_tc=[8], n_vc=[2], tc_width=[128], tc_depth=[128], glb_mib=[128])
    config["arch"]["presets"] = ["tpuv4-upstream"]  # the grid point's own parameters
    space, _ = build_space(config)
    assert len(space) == 2  # the grid point and the preset with its own HBM
    tpu = space[space.preset == "tpuv4-upstream"].iloc[0]
    assert json.loads(tpu.costmodel_overrides) == {"hbm_bandwidth_Bps": 1.2e12}
    assert tpu.arch != space[space.preset == ""].iloc[0].arch


def test_cli_narrowed_grid_and_errors(tmp_path, capsys):
    cfg = {
        "arch": {
            "n_tc": [4, 8],
            "n_vc": [1, 2],
            "tc_width": [64, 128],
            "tc_depth": [128, 256],
            "glb_mib": [64, 128],
        }
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "space.parquet"
    assert main(["arch", "--config", str(path), "--out", str(out)]) == 0
    space = read_table(out, "space")
    assert set(space.n_tc) <= {4, 8} and "tpuv4" in set(space.preset)
    area_cfg = validate_config({})["arch"]["area"]
    a_max = am.accelerator_area_mm2(8, 2, 128, 128, 128, 128 * MiB, area_cfg)
    expect = sum(
        am.accelerator_area_mm2(t, v, w, d, w, g * MiB, area_cfg) <= a_max * (1 + 1e-9)
        for t, v, w, d, g in itertools.product([4, 8], [1, 2], [64, 128], [128, 256], [64, 128])
    )
    # + the faithful tpuv4, which is not a grid point (its VPUs are 1024 lanes wide)
    assert 0 < expect < 32 and len(space) == expect + 1

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"arch": {"presets": ["no-such-chip"]}}))
    assert main(["arch", "--config", str(bad), "--out", str(out)]) == 2
    assert "unknown preset 'no-such-chip'" in capsys.readouterr().err
    bad.write_text(yaml.safe_dump({"arch": {"tc_width": []}}))
    assert main(["arch", "--config", str(bad), "--out", str(out)]) == 2
