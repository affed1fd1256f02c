"""Fuzz every preset field and the numeric flags of the CLIs with the values an adversary tries.

Two families, each drawn by Hypothesis with a fixed seed (``derandomize``), a bounded number of
examples, the CLIs called in-process (``tests/test_fuzz.py``'s ``run_cli``):

* **preset fields**: one field of one shipped preset (``config/presets/*.yaml``, every leaf but
  ``sources``) set to NaN, ±inf, 0, a negative number, a huge number, a string, null, a bool or a
  list, then read by a stage that reads presets (``estimate --matmul``, ``evaluate``, ``arch``
  with the preset in ``arch.presets``);
* **numeric flags**: one numeric flag of one command (``estimate --matmul/--batch/--chunk``,
  ``evaluate``, ``optimize``, ``trace``, ``place``, ``search bounds``) set to nan, ±inf, 0, a
  negative number, numbers beyond 64 bits or the float range, 2^62, a string, the empty string or
  a fraction, the other flags valid.

Either outcome is allowed, and nothing else: exit 2 with exactly one line on stderr (``phaze
STAGE: error: …``; for a preset value of the wrong type, NaN, infinite or negative, the line
names the preset file and the key), or exit 0 with every number of the output finite (the JSON
printed, the table written; a placement row that nothing fits keeps its NaN throughput, as
``phaze place`` documents). A traceback, a hang (an alarm per call) or an infinite or NaN result
fails. Mutation checks: with the ``exclusiveMinimum`` of ``costmodel.hbm_bandwidth_Bps``
removed (config/schema.yaml, which the preset schema refers to), the preset family fails on
``estimate`` accepting a negative bandwidth; without the upper bound of ``place --hbm-gib``, the
flag family fails on an OverflowError writing the placement table (``--hbm-gib 2^62``: 2^92
bytes in an int64 column), as it did before that bound existed.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from phaze.arch import presets
from phaze.io.tables import write_table
from tests.test_fuzz import fuzz_settings, leaves, run_cli, scratch
from tests.test_place_tables import PEAK, layers_frame, schedule_frame

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "tests" / "data" / "tiny-gpt2" / "config.json")
TEST_CONFIG = str(REPO / "config" / "test.yaml")
NAN, INF = math.nan, math.inf

# --- what "finite output" means ------------------------------------------------------------------


def _numbers(node):
    if isinstance(node, bool):
        return
    if isinstance(node, (int, float)):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _numbers(v)
    elif isinstance(node, list):
        for v in node:
            yield from _numbers(v)


def finite_json(text: str) -> bool:
    return all(math.isfinite(x) for x in _numbers(json.loads(text)))


def finite_table(path: Path, nan_ok: pd.Series | None = None) -> bool:
    df = pd.read_parquet(path)
    num = df.select_dtypes(include=[np.number])
    values = num.to_numpy(dtype=float)
    if np.isinf(values).any():
        return False
    nan = np.isnan(values)
    if nan_ok is not None:
        nan &= ~nan_ok(df).to_numpy()[:, None]
    return not nan.any()


def check(outcome, stage: str, what: str, finite, must_reject: bool = False, needles=()):
    """Exit 2 and one line (naming ``needles`` when ``must_reject``), or exit 0 and ``finite()``."""
    if outcome.rc == 2:
        assert len(outcome.stderr_lines) == 1, (what, outcome.stderr_lines)
        line = outcome.stderr_lines[0]
        # a usage error names the subcommand (`phaze search bounds: error:`), others the stage
        assert line.startswith(f"phaze {stage.split()[0]}") and ": error: " in line, (what, line)
        if must_reject:
            for needle in needles:
                assert needle in line, (what, needle, line)
        return "rejected"
    assert outcome.rc == 0, (what, outcome)
    assert not must_reject, (what, "accepted", outcome.stdout[:500])
    assert finite(), (what, "exit 0 with a non-finite output", outcome.stdout[:500])
    return "accepted"


# --- family 1: preset fields ---------------------------------------------------------------------
PRESET_VALUES = [NAN, INF, -INF, 0, -1, -1.0e300, 1.0e300, 2**70, "x", "80GiB", None, True, [1]]


def _preset_docs() -> dict:
    return {
        name: yaml.safe_load((presets.PRESET_DIR / f"{name}.yaml").read_text())
        for name in presets.list_presets()
    }


DOCS = _preset_docs()
FIELDS = [
    (name, path) for name, doc in DOCS.items() for path, _ in leaves(doc) if path[0] != "sources"
]


# the costmodel keys whose null is a value (config/schema.yaml: type [number, "null"])
NULLABLE = {
    k
    for k, v in yaml.safe_load((REPO / "config" / "schema.yaml").read_text())["properties"][
        "costmodel"
    ]["properties"].items()
    if isinstance(v.get("type"), list) and "null" in v["type"]
}


def _must_reject(path, old, new) -> bool:
    """A value no preset field takes: NaN, ±inf, negative, or of another type than the field's
    (a bool for a number, a number for a string, null but where null is a value, a list)."""
    if new is None and path[-1] in NULLABLE:
        return False
    if isinstance(new, float) and not math.isfinite(new):
        return True
    if type(new) is not type(old) and not (
        isinstance(new, (int, float))
        and not isinstance(new, bool)
        and isinstance(old, (int, float))
        and not isinstance(old, bool)
    ):
        return not (isinstance(old, list) and isinstance(new, list))
    return isinstance(new, (int, float)) and not isinstance(new, bool) and new < 0


@pytest.fixture(scope="module")
def preset_dir():
    """config/presets copied to a scratch directory the fuzzed preset is added to."""
    with scratch() as d:
        for p in presets.PRESET_DIR.glob("*.yaml"):
            shutil.copy(p, d / p.name)
        old = presets.PRESET_DIR
        presets.PRESET_DIR = d
        presets._load.cache_clear()
        try:
            yield d
        finally:
            presets.PRESET_DIR = old
            presets._load.cache_clear()


def _preset_command(stage: str, d: Path) -> tuple[list[str], callable]:
    if stage == "estimate":
        argv = ["estimate", "--matmul", "512", "256", "128", "--arch", "fuzz", "--json"]
        return [*argv, "--config", TEST_CONFIG], None
    if stage == "evaluate":
        argv = ["evaluate", "--hf-config", TINY, "--arch", "fuzz", "--devices", "8"]
        argv += ["--global-batch", "64", "--tp", "1", "--pp", "1", "--microbatch", "1"]
        return [*argv, "--seq", "16", "--config", TEST_CONFIG], None
    cfg = yaml.safe_load(Path(TEST_CONFIG).read_text())
    cfg["arch"]["presets"] = ["fuzz"]
    (d / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    out = d / "space.parquet"
    out.unlink(missing_ok=True)
    return ["arch", "--config", str(d / "cfg.yaml"), "--out", str(out)], lambda: finite_table(out)


TALLY: dict = {}


@fuzz_settings(80)
@given(
    field=st.sampled_from(FIELDS),
    value=st.sampled_from(PRESET_VALUES),
    stage=st.sampled_from(["estimate", "evaluate", "arch"]),
)
def test_fuzz_preset_fields(preset_dir, field, value, stage):
    name, path = field
    doc = copy.deepcopy(DOCS[name])
    node = doc
    for key in path[:-1]:
        node = node[key]
    old = node[path[-1]]
    node[path[-1]] = value
    if stage == "evaluate" and "network" not in doc:
        stage = "estimate"  # evaluate needs the preset's own network (tpuv4-upstream has none)
    (preset_dir / "fuzz.yaml").write_text(yaml.safe_dump(doc))
    presets._load.cache_clear()
    argv, table_check = _preset_command(stage, preset_dir)
    outcome = run_cli(argv)
    what = f"{stage}: {name} {'/'.join(map(str, path))} = {value!r}"
    key = "/".join(map(str, path))
    result = check(
        outcome,
        stage,
        what,
        table_check or (lambda: finite_json(outcome.stdout)),
        must_reject=_must_reject(path, old, value),
        needles=(str(preset_dir / "fuzz.yaml"), key),
    )
    TALLY[("preset", result)] = TALLY.get(("preset", result), 0) + 1


# --- family 2: the CLIs' numeric flags -----------------------------------------------------------
FLAG_VALUES = [
    "nan",
    "inf",
    "-inf",
    "0",
    "-1",
    "-99999999999999999999",
    "99999999999999999999",
    "9223372036854775807",
    "4611686018427387904",
    "1e400",
    "1.5",
    "x",
    "",
]


@pytest.fixture(scope="module")
def flag_inputs():
    """A trace of tiny-gpt2, the test config's space, a chunk table and test_place_tables'
    placement inputs, made once."""
    with scratch() as d:
        argv = ["trace", "--model", TINY, "--microbatch", "1", "--seq", "16", "--no-verify"]
        assert run_cli([*argv, "--out", str(d / "trace")]).rc == 0
        assert run_cli(["arch", "--config", TEST_CONFIG, "--out", str(d / "space.parquet")]).rc == 0
        space = pd.read_parquet(d / "space.parquet")
        chunks = pd.DataFrame({"arch": space["arch"][:2], "chunk": [0, 1]})
        chunks.to_parquet(d / "chunks.parquet", index=False)
        p = d / "place"
        for t in (1, 2):
            write_table(layers_frame(t), p / f"trace_t{t}" / "layers.parquet", "layers")
            write_table(schedule_frame(t), p / f"sched_t{t}.parquet", "schedule")
        rows = [
            {**space.iloc[0].to_dict(), "arch": a, "peak_flops": f, "preset": ""}
            for a, f in PEAK.items()
        ]
        write_table(pd.DataFrame(rows), p / "space.parquet", "space")
        place = {"devices": [16], "global_batch": 256, "recompute": ["none", "full"]}
        (p / "cfg.yaml").write_text(yaml.safe_dump({"models": ["tiny"], "place": place}))
        yield d


def _commands(d: Path) -> dict:
    """stage -> (argv with {FLAG} placeholders' valid values, the fuzzable flags, the output check)."""
    out = d / "out"
    p = d / "place"
    space = str(d / "space.parquet")
    return {
        "estimate --matmul": (
            ["estimate", "--matmul", "64", "64", "64", "--batch", "2", "--arch", "a100-80gb"]
            + ["--json", "--config", TEST_CONFIG],
            {"--matmul": 1, "--batch": 1},
            lambda o: finite_json(o.stdout),
        ),
        "estimate --chunk": (
            ["estimate", "--trace", str(d / "trace"), "--space", space, "--chunks"]
            + [str(d / "chunks.parquet"), "--chunk", "0", "--config", TEST_CONFIG]
            + ["--out", str(out / "lat.parquet")],
            {"--chunk": 1},
            lambda o: finite_table(out / "lat.parquet"),
        ),
        "evaluate": (
            ["evaluate", "--hf-config", TINY, "--arch", "a100-80gb", "--devices", "8"]
            + ["--global-batch", "64", "--tp", "1", "--pp", "2", "--microbatch", "1"]
            + ["--interleave", "1", "--seq", "16", "--ep", "1", "--config", TEST_CONFIG],
            {f: 1 for f in ("--devices", "--global-batch", "--tp", "--pp", "--microbatch")}
            | {"--interleave": 1, "--seq": 1, "--ep": 1},
            lambda o: finite_json(o.stdout),
        ),
        "optimize": (
            ["optimize", "--hf-config", TINY, "--arch", "a100-80gb", "--devices", "8"]
            + ["--global-batch", "64", "--hbm-gib", "80", "--tp", "1", "--microbatch", "1"]
            + ["--seq", "16", "--json", "--config", TEST_CONFIG],
            {f: 1 for f in ("--devices", "--global-batch", "--hbm-gib", "--tp", "--microbatch")}
            | {"--seq": 1},
            lambda o: finite_json(o.stdout),
        ),
        "trace": (
            ["trace", "--model", TINY, "--microbatch", "1", "--tp", "1", "--ep", "1"]
            + ["--seq", "16", "--no-verify", "--out", str(out / "trace")],
            {"--microbatch": 1, "--tp": 1, "--ep": 1, "--seq": 1},
            lambda o: all(finite_table(out / "trace" / f"{t}.parquet") for t in ("ops", "layers")),
        ),
        "place": (
            ["place", "--model", "tiny", "--tp", "1", "2", "--trace-dirs"]
            + [str(p / "trace_t1"), str(p / "trace_t2"), "--schedules"]
            + [str(p / "sched_t1.parquet"), str(p / "sched_t2.parquet")]
            + ["--space", str(p / "space.parquet"), "--hbm-gib", "32", "--microbatch", "1"]
            + ["--devices", "16", "--config", str(p / "cfg.yaml")]
            + ["--out", str(out / "place.parquet")],
            {"--tp": 2, "--hbm-gib": 1, "--microbatch": 1, "--devices": 1},
            lambda o: finite_table(
                out / "place.parquet",
                lambda df: ~df["feasible"] | ~df["expert_feasible"],
            ),
        ),
        "search bounds": (
            ["search", "bounds", "--model", "tiny-gpt2", "--microbatch", "1", "--tp", "1"]
            + ["--trace-dirs", str(d / "trace"), "--space", space, "--config", TEST_CONFIG]
            + ["--out", str(out / "bounds.parquet")],
            {"--microbatch": 1, "--tp": 1},
            lambda o: finite_table(out / "bounds.parquet", lambda df: df.index >= 0),
        ),
    }


@fuzz_settings(100)
@given(data=st.data())
def test_fuzz_numeric_flags(flag_inputs, data):
    commands = _commands(flag_inputs)
    name = data.draw(st.sampled_from(sorted(commands)))
    argv, flags, finite = commands[name]
    flag = data.draw(st.sampled_from(sorted(flags)))
    argv = list(argv)
    at = argv.index(flag) + 1 + data.draw(st.integers(0, flags[flag] - 1))
    value = data.draw(st.sampled_from(FLAG_VALUES))
    argv[at] = value
    shutil.rmtree(flag_inputs / "out", ignore_errors=True)
    outcome = run_cli(argv)
    what = f"{name}: {flag} {value!r} (phaze {' '.join(argv)})"
    result = check(outcome, name, what, lambda: finite(outcome))
    TALLY[("flags", result)] = TALLY.get(("flags", result), 0) + 1


def test_fuzz_tally():
    """Prints how many cases each family ran and how they ended (run with -s to see it); both
    families must have seen both outcomes, or they test less than they claim."""
    if not TALLY:
        pytest.skip("the fuzz tests did not run in this process")
    print("fuzz cases:", dict(sorted(TALLY.items())))
    for family in ("preset", "flags"):
        assert TALLY.get((family, "rejected"), 0) > 0, TALLY
        assert TALLY.get((family, "accepted"), 0) > 0, TALLY
