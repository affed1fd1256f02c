"""The workflow against hostile names and concurrent invocations: shell-safe rules, a config
snapshot per run that nothing else rewrites, unique model keys, config errors at the dry run."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from phaze.errors import PhazeError
from phaze.workflow import snapshot_config, snapshot_path
from phaze.workflow.sweep import model_keys

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
NASTY = ("m$(touch PWNED)x", "with space's")  # command substitution; a space and a quote
# wildcards the rules constrain to digits (rules/common.smk): safe in a shell word unquoted
DIGIT_WILDCARDS = {"mbs", "tp", "seq", "chunk", "round"}


def _shell_strings(text: str) -> list[str]:
    """The shell command of every `shell:` directive and `shell(...)` call of a rule file."""
    out = []
    for m in re.finditer(
        r"(?:^\s*shell:\s*\n|shell\(\s*\n)((?:\s*(?:f?\"[^\n]*\"|f?'[^\n]*')\s*\n)+)",
        text,
        re.MULTILINE,
    ):
        out.append("".join(re.findall(r"[\"'](.*)[\"']", m.group(1))))
    return out


def test_every_placeholder_in_a_shell_command_is_quoted():
    commands = [
        c for f in sorted((REPO / "rules").glob("*.smk")) for c in _shell_strings(f.read_text())
    ]
    assert len(commands) >= 15, commands  # every rule with a command was found
    for cmd in commands:
        for field in re.findall(r"(?<!\{)\{([^{}]+)\}(?!\})", cmd):
            name, _, conv = field.partition(":")
            if name.removeprefix("wildcards.") in DIGIT_WILDCARDS:
                continue
            assert conv == "q", f"unquoted {{{field}}} in: {cmd}"
        # the config reaches jobs through the environment, never as a path in a param
        assert "params.config" not in cmd


def _nasty_checkout(tmp_path, copy_checkout, models, **overrides) -> Path:
    work = copy_checkout(tmp_path / "w")
    cfg = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    cfg["models"] = models
    for section, values in overrides.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    return work


@pytest.mark.slow  # two real trace jobs: ~35 s on 2 busy cores
def test_hostile_model_directories_trace_and_log_where_announced(
    tmp_path, copy_checkout, snakemake
):
    models = []
    work = _nasty_checkout(tmp_path, copy_checkout, [])
    for name in NASTY:
        (work / "models" / name).mkdir(parents=True)
        (work / "models" / name / "config.json").write_text(
            (DATA / "tiny-gpt2" / "config.json").read_text()
        )
        models.append(f"models/{name}/config.json")
    cfg = yaml.safe_load((work / "c.yaml").read_text())
    cfg["models"] = models
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    top = sorted(p.name for p in work.iterdir())
    targets = [f"results/trace/{name}/b1_s128_tp1/layers.parquet" for name in NASTY]
    # the dry run prints each command with every name inside ONE shell word
    dry = snakemake(work, *targets, "-n", "-p", "--configfile", "c.yaml", timeout=300)
    assert dry.returncode == 0, dry.stderr[-2000:]
    printed = re.findall(r"Shell command: (.*)", dry.stdout + dry.stderr)
    assert len(printed) == len(NASTY), printed
    for line, name in zip(sorted(printed), sorted(NASTY, key=lambda n: f"{n}")):
        words = shlex.split(line)
        assert sum(name in w for w in words) >= 3, (name, words)  # --model, --out, the log
    # run the traces: nothing is executed from a name, each log is where the rule says
    run = snakemake(work, *targets, "--cores", "2", "--configfile", "c.yaml", timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not list(work.rglob("PWNED")) and not (work / "PWNED").exists()
    for name in NASTY:
        assert (work / targets[NASTY.index(name)]).is_file()
        assert (work / "results" / "logs" / "trace" / name / "b1_s128_tp1.log").is_file()
    # no stray file from a redirect that split at a space (only results/ and .snakemake/ are new)
    assert sorted({p.name for p in work.iterdir()} - set(top)) == [".snakemake", "results"]


def test_the_snapshot_is_per_config_and_never_rewritten(tmp_path):
    a, b = {"x": 1}, {"x": 2}
    pa, pb = snapshot_path(a, tmp_path), snapshot_path(b, tmp_path)
    assert pa != pb and Path(pa).parent == tmp_path / ".config"
    snapshot_config(a, pa)
    before = Path(pa).stat().st_mtime_ns
    assert snapshot_config(a, pa) == pa and Path(pa).stat().st_mtime_ns == before
    assert json.loads(Path(pa).read_text()) == a
    with pytest.raises(RuntimeError, match="exists with other content"):
        snapshot_config(b, pa)


def test_a_dry_run_with_another_config_leaves_this_runs_snapshot_alone(
    tmp_path, copy_checkout, snakemake
):
    work = copy_checkout(tmp_path / "w")
    cfg = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    (work / "a.yaml").write_text(yaml.safe_dump(cfg))
    cfg["costmodel"] = {"hbm_bandwidth_Bps": 2.4e12}
    (work / "b.yaml").write_text(yaml.safe_dump(cfg))
    first = snakemake(work, "-n", "--configfile", "a.yaml", timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    (snap,) = (work / "results" / ".config").iterdir()
    text, mtime = snap.read_text(), snap.stat().st_mtime_ns
    other = snakemake(work, "-n", "-p", "--configfile", "b.yaml", timeout=300)
    assert other.returncode == 0, other.stderr[-2000:]
    assert snap.read_text() == text and snap.stat().st_mtime_ns == mtime
    assert len(list((work / "results" / ".config").iterdir())) == 2
    assert json.loads(text)["costmodel"]["hbm_bandwidth_Bps"] == 1.2e12
    # jobs name no snapshot path: they read the one their own invocation exported
    jobs = re.findall(r"Shell command: (python3 .*)", other.stdout + other.stderr)
    assert jobs and all(".config/" not in ln for ln in jobs)
    assert all('--config "$PHAZE_CONFIG"' in ln for ln in jobs)


def test_model_keys_must_be_unique(tmp_path):
    (tmp_path / "opt-350m").mkdir()
    (tmp_path / "opt-350m" / "config.json").write_text(
        (DATA / "tiny-gpt2" / "config.json").read_text()
    )
    for a in ("x", "y"):
        (tmp_path / a / "tiny").mkdir(parents=True)
        (tmp_path / a / "tiny" / "config.json").write_text(
            (DATA / "tiny-gpt2" / "config.json").read_text()
        )
    assert list(model_keys(["opt-350m", str(tmp_path / "x" / "tiny")])) == ["opt-350m", "tiny"]
    for models in (
        ["opt-350m", str(tmp_path / "opt-350m" / "config.json")],
        [str(tmp_path / "x" / "tiny" / "config.json"), str(tmp_path / "y" / "tiny")],
    ):
        with pytest.raises(PhazeError, match="have the same key"):
            model_keys(models)


@pytest.mark.parametrize(
    "overrides,needle",
    [
        ({"trace": {"microbatch": [8192]}}, "is not a multiple of trace.microbatch 8192"),
        ({"arch": {"presets": ["no-such-chip"]}}, "unknown preset 'no-such-chip'"),
    ],
)
def test_config_errors_stop_the_dry_run_even_when_results_exist(
    tmp_path, copy_checkout, snakemake, overrides, needle
):
    work = _nasty_checkout(tmp_path, copy_checkout, ["opt-350m"], **overrides)
    (work / "results" / "arch").mkdir(parents=True)
    (work / "results" / "arch" / "space.parquet").write_bytes(b"an old result")
    dry = snakemake(work, "-n", "--configfile", "c.yaml", timeout=300)
    lines = (dry.stdout + dry.stderr).strip().splitlines()
    assert dry.returncode != 0 and len(lines) == 1 and lines[0].startswith("phaze: error: ")
    assert needle in lines[0]


def test_colliding_model_keys_stop_the_dry_run(tmp_path, copy_checkout, snakemake):
    work = _nasty_checkout(tmp_path, copy_checkout, ["opt-350m", "x/opt-350m/config.json"])
    (work / "x" / "opt-350m").mkdir(parents=True)
    (work / "x" / "opt-350m" / "config.json").write_text(
        (DATA / "tiny-gpt2" / "config.json").read_text()
    )
    dry = snakemake(work, "-n", "--configfile", "c.yaml", timeout=300)
    lines = (dry.stdout + dry.stderr).strip().splitlines()
    assert dry.returncode != 0 and len(lines) == 1, lines
    assert "have the same key 'opt-350m'" in lines[0]
