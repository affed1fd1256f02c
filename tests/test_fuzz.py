"""Fuzz the stage CLIs with corrupted copies of valid inputs.

Each target starts from a valid input and its answer (computed once). Hypothesis, with a fixed
seed (``derandomize``), draws one corruption per example: a value replaced by NaN, +-inf, a
negative number, a wrong type (string, null, list, bool, fraction for an integer), a list entry
or table row duplicated, a key or column dropped, the file truncated. The stage must then either

* exit 2 with exactly ONE line on stderr (``phaze <stage>: error: ...``; warnings count as lines)
  and leave no output file behind, or
* exit 0 with exactly the clean input's answer (the corruption did not matter, e.g. a duplicated
  edge or a NaN in a column the stage does not read).

Anything else fails: a traceback (an exception out of ``main``), a hang (an alarm per CLI call)
or a silently different answer. The CLIs run in-process, so one example costs the stage's own
work only; every target's example count is fixed, the whole module stays within ~2 minutes.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import shutil
import signal
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from phaze.cli import main
from phaze.io.tables import read_table

DATA = Path(__file__).parent / "data"
CALL_LIMIT_S = 60  # a single CLI call longer than this is a hang
NAN, INF = math.nan, math.inf
# warnings Python shows by default on stderr (the others are hidden outside __main__)
_HIDDEN_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def fuzz_settings(n: int):
    # no shrinking: an example's description already names the corruption, and shrinking
    # re-runs stages many times (minutes) before a failure is reported
    return settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


class Hang(Exception):
    pass


@dataclass
class Outcome:
    rc: int
    stdout: str
    stderr_lines: list[str]


def run_cli(argv: list[str]) -> Outcome:
    """``phaze ARGV`` in-process; any exception but SystemExit propagates (= a traceback)."""

    def alarm(signum, frame):
        raise Hang(f"phaze {' '.join(argv)} ran longer than {CALL_LIMIT_S} s")

    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(CALL_LIMIT_S)
    try:
        with (
            warnings.catch_warnings(record=True) as caught,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            warnings.simplefilter("always")
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    lines = err.getvalue().splitlines()
    lines += [str(w.message) for w in caught if not issubclass(w.category, _HIDDEN_WARNINGS)]
    return Outcome(rc, out.getvalue(), lines)


def check_outcome(stage, outcome: Outcome, outputs, answer, clean, what: str, must_reject: bool):
    """Exit 2 + one line + no output, or (unless ``must_reject``) exit 0 + the clean answer."""
    if outcome.rc == 2:
        assert len(outcome.stderr_lines) == 1, (what, outcome.stderr_lines)
        assert outcome.stderr_lines[0].startswith(f"phaze {stage}: error: "), (what, outcome)
        left = [p for p in outputs if p.exists()]
        assert not left, (what, "output written on error", left)
        return
    assert outcome.rc == 0, (what, outcome)
    assert not must_reject, (what, "accepted", outcome)
    got = answer()
    assert _same(got, clean), (what, "exit 0 with a different answer", got, clean)


def _same(a, b) -> bool:
    if isinstance(a, pd.DataFrame):
        if not isinstance(b, pd.DataFrame):
            return False
        try:
            pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-12)
        except AssertionError:
            return False
        return True
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@contextlib.contextmanager
def scratch():
    d = Path(tempfile.mkdtemp(prefix="phaze-fuzz-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --- corruptions of JSON-like documents --------------------------------------------------------
# A leaf's role: "real" (a physical quantity: NaN, inf, negatives and wrong types are invalid),
# "count" (as real, and a fraction is invalid too), "label" (an integer id: wrong types, fractions
# and non-finite values are invalid, any integer is not), "enum" (a bool or a fixed string).


def leaves(doc, path=()):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from leaves(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from leaves(v, (*path, i))
    else:
        yield path, doc


def containers(doc, path=()):
    """(path, container) of every list and dict, the root included."""
    if isinstance(doc, (dict, list)):
        yield path, doc
        items = doc.items() if isinstance(doc, dict) else enumerate(doc)
        for k, v in items:
            yield from containers(v, (*path, k))


def _get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def _set(doc, path, value):
    _get(doc, path[:-1])[path[-1]] = value


def bad_values(value, role: str) -> list:
    wrong_types = ["x", None, [1], {"a": 1}]
    if role == "enum":
        return [*wrong_types, 2, 0.5] if isinstance(value, bool) else [*wrong_types, "bogus", 7]
    out = [NAN, INF, -INF, True, *wrong_types]
    if role in ("count", "label"):
        out.append(int(value) + 0.5)
    if role in ("real", "count"):
        out.append(-abs(value) - 1)
    return out


@st.composite
def corrupt_json(draw, doc, role_of, droppable, text_dumps=json.dumps):
    """(description, text, must_reject) of one corruption of ``doc``. ``role_of(path)`` names a
    leaf's role (None = leave it alone); ``droppable(path)`` says whether a key is required
    (dropping an optional key may legitimately change the answer, so only required keys are
    dropped). Every leaf fuzzed is read by the stage, so a bad value, a dropped required key
    and a truncated file must be rejected; a duplicated list entry may also be harmless."""
    doc = copy.deepcopy(doc)
    keys = [(p, k) for p, c in containers(doc) if isinstance(c, dict) for k in c]
    keys = [(p, k) for p, k in keys if droppable((*p, k))]
    lists = [(p, c) for p, c in containers(doc) if isinstance(c, list) and c]
    kinds = ["value", "value", "value", "truncate"]
    kinds += (["duplicate"] if lists else []) + (["drop"] if keys else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "value":
        cands = [(p, v) for p, v in leaves(doc) if role_of(p)]
        path, value = draw(st.sampled_from(cands))
        new = draw(st.sampled_from(bad_values(value, role_of(path))))
        _set(doc, path, new)
        return f"{'/'.join(map(str, path))} = {new!r}", text_dumps(doc), True
    if kind == "duplicate":
        path, lst = draw(st.sampled_from(lists))
        i = draw(st.integers(0, len(lst) - 1))
        lst.append(copy.deepcopy(lst[i]))
        return f"{'/'.join(map(str, path))}[{i}] duplicated", text_dumps(doc), False
    if kind == "drop":
        path, key = draw(st.sampled_from(keys))
        del _get(doc, path)[key]
        return f"{'/'.join(map(str, (*path, key)))} dropped", text_dumps(doc), True
    text = text_dumps(doc)
    cut = draw(st.integers(1, len(text) - 1))  # an empty config file is a valid one (defaults)
    return f"truncated at {cut} of {len(text)}", text[:cut], True


# --- corruptions of tables ---------------------------------------------------------------------


@st.composite
def corrupt_table(draw, df: pd.DataFrame, numbers: tuple, labels: tuple = (), parquet=True):
    """(description, frame, truncate_at or None, must_reject): one corruption of ``df``.

    ``numbers``: columns of physical quantities/counts (NaN, inf, negative invalid);
    ``labels``: id columns (non-finite values invalid). A bad cell may sit where the stage does
    not look, a duplicated row may be harmless, so those may also give the clean answer; no
    rows, a dropped column (all the fuzzed ones are read) or a truncated Parquet file (its footer
    is at the end) must be rejected; a truncated CSV may have lost only an unread field.
    """
    kind = draw(
        st.sampled_from(["cell", "cell", "cell", "duplicate", "drop", "strings", "empty", "cut"])
    )
    df = df.copy()
    if kind == "cell":
        col = draw(st.sampled_from([*numbers, *labels]))
        row = draw(st.integers(0, len(df) - 1))
        choices = [NAN, INF, -INF] if col in labels else [NAN, INF, -INF, "negative"]
        new = draw(st.sampled_from(choices))
        df[col] = df[col].astype("float64") if df[col].dtype.kind in "iub" else df[col]
        if new == "negative":
            new = -abs(float(df[col].iloc[row])) - 1.0
        if df[col].dtype == object:
            df[col] = df[col].astype(object)
        df.iloc[row, df.columns.get_loc(col)] = new
        return f"{col}[{row}] = {new!r}", df, None, False
    if kind == "duplicate":
        row = draw(st.integers(0, len(df) - 1))
        return (
            f"row {row} duplicated",
            pd.concat([df, df.iloc[[row]]], ignore_index=True),
            None,
            False,
        )
    if kind == "drop":
        col = draw(st.sampled_from([*numbers, *labels]))
        return f"column {col} dropped", df.drop(columns=[col]), None, True
    if kind == "strings":
        col = draw(st.sampled_from(list(numbers)))
        return f"column {col} as strings", df.assign(**{col: df[col].astype(str)}), None, False
    if kind == "empty":
        return "no rows", df.iloc[:0], None, True
    return "truncated file", df, draw(st.floats(0.01, 0.99)), parquet


def write_corrupt(df, path: Path, cut: float | None) -> None:
    """Write ``df`` as Parquet without schema checks (a corrupt file is the point)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path, index=False)
    if cut is not None:
        raw = path.read_bytes()
        path.write_bytes(raw[: int(len(raw) * cut)])


# --- target: place --instance (upstream's JSON) ------------------------------------------------
PLACE_INSTANCE = json.loads((DATA / "place_upstream_reference.json").read_text())["cases"][2][
    "instance"
]
_PLACE_ROLES = {
    **dict.fromkeys(("id", "sourceId", "destId"), "label"),
    **dict.fromkeys(
        ("isTensorParallelized", "activationRecomputation", "optimizerAlgorithm"), "enum"
    ),
    **dict.fromkeys(
        ("maxDevices", "mbsInBatch", "fixedPP", "fixedTMPC", "fixedDP", "numTransformerLayers"),
        "count",
    ),
}


def _place_role(path):
    key = next(k for k in reversed(path) if isinstance(k, str))
    return _PLACE_ROLES.get(key, "real")


def _place_instance_answer(path: Path):
    out = json.loads(path.read_text())
    out.pop("solveSeconds", None)
    return out


@pytest.fixture(scope="module")
def place_instance_clean():
    with scratch() as d:
        (d / "i.json").write_text(json.dumps(PLACE_INSTANCE))
        assert run_cli(["place", "--instance", str(d / "i.json"), "--out", str(d / "o")]).rc == 0
        return _place_instance_answer(d / "o")


@fuzz_settings(400)
@given(case=corrupt_json(PLACE_INSTANCE, _place_role, droppable=lambda path: True))
def test_fuzz_place_instance(place_instance_clean, case):
    what, text, must = case
    with scratch() as d:
        (d / "i.json").write_text(text)
        out = d / "o.json"
        res = run_cli(["place", "--instance", str(d / "i.json"), "--out", str(out)])
        answer = lambda: _place_instance_answer(out)
        check_outcome("place", res, [out], answer, place_instance_clean, what, must)


# --- target: schedule --instance ----------------------------------------------------------------
SCHEDULE_INSTANCE = json.loads((DATA / "schedule_instance.json").read_text())
SCHEDULE_INSTANCE["time_limit_s"] = 20  # solves in well under a second; the limit never binds


def _schedule_role(path):
    if path[0] == "edges" or path[-1] == "id":
        return "label"
    if path[-1] == "core":
        return "enum"
    return "count" if path[0] in ("n_tc", "n_vc") else "real"


def _schedule_answer(path: Path):
    out = json.loads(path.read_text())
    out.pop("solve_s", None)
    return out


def _run_schedule(d: Path, text: str, tier: str) -> tuple[Outcome, Path]:
    (d / "i.json").write_text(text)
    out = d / "o.json"
    argv = ["schedule", "--tier", tier, "--instance", str(d / "i.json"), "--out", str(out)]
    return run_cli(argv), out


@pytest.fixture(scope="module")
def schedule_clean():
    clean = {}
    for tier in ("bounds", "ilp"):
        with scratch() as d:
            res, out = _run_schedule(d, json.dumps(SCHEDULE_INSTANCE), tier)
            assert res.rc == 0, res
            clean[tier] = _schedule_answer(out)
    return clean


@fuzz_settings(250)
@given(
    case=corrupt_json(SCHEDULE_INSTANCE, _schedule_role, lambda p: p[0] in ("n_tc", "n_vc", "ops")),
    ilp=st.integers(0, 9),
)
def test_fuzz_schedule_instance(schedule_clean, case, ilp):
    what, text, must = case
    tier = "ilp" if ilp == 0 else "bounds"  # one example in ten runs the solver
    with scratch() as d:
        res, out = _run_schedule(d, text, tier)
        answer = lambda: _schedule_answer(out)
        check_outcome("schedule", res, [out], answer, schedule_clean[tier], what, must)


# --- target: estimate (ops.parquet + space.parquet) --------------------------------------------
OPS_NUMBERS = ("m", "n", "k", "batch", "elements", "flops", "bytes_in", "bytes_out", "weight_bytes")
SPACE_NUMBERS = ("n_tc", "n_vc", "tc_width", "tc_depth", "vc_width", "glb_bytes", "freq_hz")


def _estimate_inputs() -> dict:
    from tests.test_estimate import fixture_ops, small_space

    return {"ops": fixture_ops(), "space": small_space()}


def _run_estimate(d: Path, tables: dict, cuts: dict) -> tuple[Outcome, Path]:
    write_corrupt(tables["ops"], d / "trace" / "ops.parquet", cuts.get("ops"))
    write_corrupt(tables["space"], d / "space.parquet", cuts.get("space"))
    out = d / "latency.parquet"
    argv = ["estimate", "--trace", str(d / "trace"), "--space", str(d / "space.parquet")]
    return run_cli([*argv, "--out", str(out)]), out


@pytest.fixture(scope="module")
def estimate_clean():
    with scratch() as d:
        res, out = _run_estimate(d, _estimate_inputs(), {})
        assert res.rc == 0, res
        return read_table(out)


@fuzz_settings(200)
@given(data=st.data())
def test_fuzz_estimate(estimate_clean, data):
    tables, cuts = _estimate_inputs(), {}
    which = data.draw(st.sampled_from(["ops", "space"]))
    numbers, labels = {"ops": (OPS_NUMBERS, ("op", "fused_into")), "space": (SPACE_NUMBERS, ())}[
        which
    ]
    what, tables[which], cuts[which], must = data.draw(
        corrupt_table(tables[which], numbers, labels)
    )
    with scratch() as d:
        res, out = _run_estimate(d, tables, cuts)
        answer = lambda: read_table(out)
        check_outcome("estimate", res, [out], answer, estimate_clean, f"{which}: {what}", must)


# --- target: place, tables mode (layers + schedules + space) -----------------------------------
PLACE_CONFIG = {
    "models": ["tiny"],
    "place": {
        "devices": [16],
        "global_batch": 64,
        "recompute": ["none", "full"],
        "expert": {"tiny": {"pp": 2, "dp": 4, "tp": 2}},
    },
}
LAYER_NUMBERS = (
    "param_bytes",
    "activation_bytes",
    "attention_activation_bytes",
    "replicated_activation_bytes",
    "stash_recompute_bytes",
    "boundary_bytes",
    "fwd_flops",
    "bwd_flops",
)
SCHEDULE_NUMBERS = ("makespan_s", "lower_bound_s", "upper_bound_s")
PLACE_FLAGS = {"--hbm-gib": "32", "--microbatch": "2"}


def _place_tables_inputs() -> dict:
    from tests.conftest import _ARCH_COLUMNS
    from tests.test_place_tables import PEAK, layers_frame, schedule_frame

    space = pd.DataFrame({"arch": list(PEAK), **_ARCH_COLUMNS, "preset": ""})
    return {
        "layers1": layers_frame(1),
        "layers2": layers_frame(2),
        "sched1": schedule_frame(1),
        "sched2": schedule_frame(2),
        "space": space.assign(peak_flops=list(PEAK.values())),
    }


def _run_place_tables(d: Path, tables: dict, cuts: dict, flags: dict) -> tuple[Outcome, Path]:
    for t in (1, 2):
        layers = d / f"trace{t}" / "layers.parquet"
        write_corrupt(tables[f"layers{t}"], layers, cuts.get(f"layers{t}"))
        write_corrupt(tables[f"sched{t}"], d / f"sched{t}.parquet", cuts.get(f"sched{t}"))
    write_corrupt(tables["space"], d / "space.parquet", cuts.get("space"))
    (d / "cfg.yaml").write_text(yaml.safe_dump(PLACE_CONFIG))
    out = d / "place.parquet"
    argv = ["place", "--model", "tiny", "--tp", "1", "2"]
    argv += ["--trace-dirs", str(d / "trace1"), str(d / "trace2")]
    argv += ["--schedules", str(d / "sched1.parquet"), str(d / "sched2.parquet")]
    argv += ["--space", str(d / "space.parquet")]
    argv += [x for kv in flags.items() for x in kv]
    argv += ["--config", str(d / "cfg.yaml"), "--out", str(out)]
    return run_cli(argv), out


@pytest.fixture(scope="module")
def place_tables_clean():
    with scratch() as d:
        res, out = _run_place_tables(d, _place_tables_inputs(), {}, PLACE_FLAGS)
        assert res.rc == 0, res
        return read_table(out)


@fuzz_settings(200)
@given(data=st.data())
def test_fuzz_place_tables(place_tables_clean, data):
    tables, cuts, flags = _place_tables_inputs(), {}, dict(PLACE_FLAGS)
    which = data.draw(st.sampled_from(["layers1", "layers2", "sched1", "sched2", "space", "flag"]))
    if which == "flag":
        flag = data.draw(st.sampled_from(sorted(flags)))
        bad = {
            "--hbm-gib": ["nan", "inf", "-1", "0", "x", "1e400", ""],
            "--microbatch": ["-1", "0", "x", "2.5", ""],
        }
        flags[flag] = data.draw(st.sampled_from(bad[flag]))
        what, must = f"{flag} {flags[flag]}", True
    else:
        numbers, labels = {
            "layers": (LAYER_NUMBERS, ("index",)),
            "sched": (SCHEDULE_NUMBERS, ()),
            "space": (("peak_flops", "n_tc"), ()),
        }[which.rstrip("12")]
        what, tables[which], cuts[which], must = data.draw(
            corrupt_table(tables[which], numbers, labels)
        )
    with scratch() as d:
        res, out = _run_place_tables(d, tables, cuts, flags)
        answer = lambda: read_table(out)
        check_outcome("place", res, [out], answer, place_tables_clean, f"{which}: {what}", must)


# --- target: arch (the config, as JSON: every prefix of it is invalid) -------------------------
ARCH_CONFIG = {
    "arch": {
        "n_tc": [4, 8],
        "n_vc": [1, 2],
        "tc_width": [64, 128],
        "tc_depth": [128],
        "glb_mib": [64, 128],
        "freq_hz": [1.05e9],
        "area_budget": {"max_fraction": 1.0, "min_fraction": 0.3},
    }
}


@pytest.fixture(scope="module")
def arch_clean():
    with scratch() as d:
        (d / "c.json").write_text(json.dumps(ARCH_CONFIG))
        assert run_cli(["arch", "--config", str(d / "c.json"), "--out", str(d / "s")]).rc == 0
        return read_table(d / "s")


@fuzz_settings(150)
@given(
    case=corrupt_json(
        ARCH_CONFIG,
        lambda p: "real" if p[1] in ("glb_mib", "freq_hz", "area_budget") else "count",
        lambda p: False,
    )
)
def test_fuzz_arch_config(arch_clean, case):
    what, text, must = case
    with scratch() as d:
        (d / "c.json").write_text(text)
        out = d / "space.parquet"
        res = run_cli(["arch", "--config", str(d / "c.json"), "--out", str(out)])
        check_outcome("arch", res, [out], lambda: read_table(out), arch_clean, what, must)


# --- target: validate (the reference CSV) ------------------------------------------------------
def _reference_numbers() -> tuple[str, ...]:
    from phaze.fidelity.validate import REQUIRED

    return tuple(c for c in REQUIRED if c != "ddp") + ("achieved_tflops_per_gpu",)


def _reference() -> pd.DataFrame:
    from phaze.fidelity.validate import REFERENCE

    return pd.read_csv(REFERENCE, comment="#").iloc[:1]  # one run: one model evaluation


def _run_validate(d: Path, ref: pd.DataFrame, cut) -> Outcome:
    path = d / "ref.csv"
    ref.to_csv(path, index=False)
    if cut is not None:
        raw = path.read_bytes()
        path.write_bytes(raw[: int(len(raw) * cut)])
    return run_cli(["validate", "--json", "--reference", str(path)])


@pytest.fixture(scope="module")
def validate_clean():
    with scratch() as d:
        res = _run_validate(d, _reference(), None)
        assert res.rc == 0, res
        return json.loads(res.stdout)


@fuzz_settings(40)
@given(data=st.data())
def test_fuzz_validate_reference(validate_clean, data):
    what, ref, cut, must = data.draw(
        corrupt_table(_reference(), _reference_numbers(), parquet=False)
    )
    with scratch() as d:
        res = _run_validate(d, ref, cut)
        answer = lambda: json.loads(res.stdout)
        check_outcome("validate", res, [], answer, validate_clean, what, must)


# --- target: trace (a Hugging Face config.json) ------------------------------------------------
TINY_GPT2 = json.loads((DATA / "tiny-gpt2" / "config.json").read_text())
_TRACE_NUMBERS = {"n_layer", "n_embd", "n_head", "n_inner", "vocab_size", "n_positions"}


def _trace_answer(out: Path):
    return {n: read_table(out / f"{n}.parquet") for n in ("ops", "edges", "layers")}


def _run_trace(d: Path, text: str) -> tuple[Outcome, Path]:
    (d / "tiny-gpt2").mkdir()
    (d / "tiny-gpt2" / "config.json").write_text(text)
    out = d / "trace"
    argv = ["trace", "--model", str(d / "tiny-gpt2" / "config.json"), "--microbatch", "1"]
    return run_cli([*argv, "--seq", "16", "--out", str(out)]), out


@pytest.fixture(scope="module")
def trace_clean():
    with scratch() as d:
        res, out = _run_trace(d, json.dumps(TINY_GPT2))
        assert res.rc == 0, res
        return _trace_answer(out)


@fuzz_settings(60)
@given(
    case=corrupt_json(
        TINY_GPT2, lambda p: "count" if p[-1] in _TRACE_NUMBERS else None, lambda p: False
    )
)
def test_fuzz_trace_hf_config(trace_clean, case):
    what, text, must = case
    with scratch() as d:
        res, out = _run_trace(d, text)
        # the trace directory is the output (three tables and trace.json)
        check_outcome("trace", res, [out], lambda: _trace_answer(out), trace_clean, what, must)
