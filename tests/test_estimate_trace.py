"""The estimate stage on a REAL trace (phaze trace, OPT-350M at a short sequence, t = 2)."""

from __future__ import annotations

import numpy as np
import pytest

from phaze.arch.presets import load_preset
from phaze.cli import main
from phaze.config import load_config
from phaze.estimate import collective_latency
from phaze.io.tables import read_table
from phaze.network import TorusNetwork
from phaze.paths import REPO_ROOT


@pytest.fixture(scope="module")
def real_dir(tmp_path_factory, trace_cli):
    """A real trace (opt-350m, t = 2), config/test.yaml's space and their latency table."""
    d = tmp_path_factory.mktemp("real")
    test_cfg = str(REPO_ROOT / "config" / "test.yaml")
    trace_cli(d / "trace", "opt-350m", microbatch=1, tp=2, seq=128)
    assert main(["arch", "--config", test_cfg, "--out", str(d / "space.parquet")]) == 0
    assert (
        main(
            [
                "estimate",
                "--trace",
                str(d / "trace"),
                "--space",
                str(d / "space.parquet"),
                "--config",
                test_cfg,
                "--out",
                str(d / "lat.parquet"),
            ]
        )
        == 0
    )
    return d


@pytest.fixture(scope="module")
def run(real_dir):
    return (
        read_table(real_dir / "trace" / "ops.parquet"),
        read_table(real_dir / "space.parquet", "space"),
        read_table(real_dir / "lat.parquet", "latency"),
        load_config(REPO_ROOT / "config" / "test.yaml")["costmodel"],
    )


def test_every_op_of_every_arch_is_estimated(run):
    ops, space, lat, _ = run
    assert len(lat) == len(ops) * len(space)
    assert np.isfinite(lat[["latency_1core_s", "latency_allcores_s"]].to_numpy()).all()
    assert (lat.latency_allcores_s >= 0).all()
    assert (lat.latency_allcores_s <= lat.latency_1core_s * (1 + 1e-12)).all()
    assert set(lat.bound) <= {"compute", "glb", "hbm", "link", "fused", "none"}


def test_real_ops_respect_the_roofline_and_formulas(run):
    ops, space, lat, cm = run
    merged = lat.merge(ops, on=["signature", "pass", "op"], suffixes=("", "_op")).merge(
        space[["arch", "peak_flops"]], on="arch"
    )
    mm = merged[merged.kind == "matmul"]
    assert len(mm) and (mm.latency_allcores_s >= mm.flops / mm.peak_flops * (1 - 1e-9)).all()
    coll = merged[merged.kind == "collective"]
    assert len(coll)  # t = 2 has Megatron all-reduces
    # grid points on the flat costmodel link; the tpuv4 preset on its ICI torus (1024 chips)
    on_torus = coll.arch.isin(set(space.loc[space.preset == "tpuv4", "arch"]))
    assert on_torus.any() and (~on_torus).any()
    flat = coll[~on_torus]
    want = collective_latency(flat.bytes_in.to_numpy(float), flat.group_size.to_numpy(float), cm)
    np.testing.assert_allclose(flat.latency_allcores_s, want)
    ici = TorusNetwork.for_devices(load_preset("tpuv4")["network"], 1024, "tpuv4")
    torus = coll[on_torus]
    want = [ici.all_reduce(b, range(int(g))) for b, g in zip(torus.bytes_in, torus.group_size)]
    np.testing.assert_allclose(torus.latency_allcores_s, want)
    fused = merged[merged.fused_into >= 0]
    assert len(fused) and (fused.latency_allcores_s == 0).all()


def test_faster_hbm_speeds_up_exactly_the_hbm_bound_ops(run):
    ops, space, lat, cm = run
    from phaze.estimate.stage import estimate

    fast = estimate(ops, space, {**cm, "hbm_bandwidth_Bps": cm["hbm_bandwidth_Bps"] * 10})
    assert (
        fast.latency_allcores_s.to_numpy() <= lat.latency_allcores_s.to_numpy() * (1 + 1e-12)
    ).all()
    hbm = (lat.bound == "hbm").to_numpy()
    assert hbm.any()
    assert (fast.latency_allcores_s.to_numpy()[hbm] < lat.latency_allcores_s.to_numpy()[hbm]).all()
    # ops bound by anything else are unchanged (fused matmuls are charged their bound's term)
    other = np.isin(lat.bound.to_numpy(), ["compute", "glb", "link", "none", "fused"])
    np.testing.assert_allclose(
        fast.latency_allcores_s.to_numpy()[other], lat.latency_allcores_s.to_numpy()[other]
    )


@pytest.mark.parametrize("archs_per_block", [1, 3, None])
def test_blind_latency_in_blocks_is_the_whole_tables_bit_for_bit(run, real_dir, archs_per_block):
    """The placement-blind baseline sums the space's latencies a block of architectures at a time
    (its memory stays bounded on any space); every architecture gets exactly the value of the
    whole latency table, and none is dropped or counted twice."""
    from phaze.search.baselines import (
        placement_blind_choice,
        single_accelerator_latency,
        space_single_accelerator_latency,
    )

    ops, space, lat, costmodel = run
    layers = read_table(real_dir / "trace" / "layers.parquet", "layers")
    whole = single_accelerator_latency(lat, layers)
    rows = len(ops) * (archs_per_block or 10 * len(space))
    place = load_config(REPO_ROOT / "config" / "test.yaml")["place"]
    blocks = space_single_accelerator_latency(ops, layers, space, costmodel, place, block_rows=rows)
    assert list(blocks["arch"]) == list(space["arch"])
    assert np.array_equal(
        blocks["latency_s"].to_numpy(), whole.set_index("arch").loc[space["arch"], "latency_s"]
    )
    assert placement_blind_choice(blocks, space).equals(placement_blind_choice(whole, space))
