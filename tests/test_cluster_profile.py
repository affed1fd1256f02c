"""profiles/slurm without a cluster: it parses the way Snakemake parses it, takes account and
partition from SBATCH_ACCOUNT / SBATCH_PARTITION, and sizes exactly the rules that run as jobs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "profiles" / "slurm" / "config.yaml"
RESOURCE_KEYS = {"runtime", "mem_mb", "cpus_per_task"}


def _parse_profile(monkeypatch, **env) -> dict:
    """The profile as Snakemake turns it into command-line arguments (YTE evaluated)."""
    from snakemake.profiles import ProfileConfigFileParser

    for var in ("SBATCH_ACCOUNT", "SBATCH_PARTITION"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with open(PROFILE) as fh:
        return ProfileConfigFileParser().parse(fh)


def _pairs(entries: list[str]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in entries)


def test_profile_core_settings(monkeypatch):
    args = _parse_profile(monkeypatch)
    assert args["executor"] == "slurm"
    assert int(args["jobs"]) >= 10
    assert int(args["latency-wait"]) >= 30  # shared filesystems lag
    assert float(args["max-status-checks-per-second"]) <= 1
    defaults = _pairs(args["default-resources"])
    assert RESOURCE_KEYS <= set(defaults)
    assert "slurm_account" not in defaults and "slurm_partition" not in defaults


@pytest.mark.parametrize("account", ["proj-a1", "123456"])
def test_account_and_partition_come_from_sbatch_environment(monkeypatch, account):
    args = _parse_profile(monkeypatch, SBATCH_ACCOUNT=account, SBATCH_PARTITION="short")
    defaults = _pairs(args["default-resources"])
    # Quoted, so Snakemake evaluates them to strings (a numeric account must not become an int).
    assert defaults["slurm_account"] == repr(account)
    assert defaults["slurm_partition"] == repr("short")


def _local_rules(checkout: Path) -> set[str]:
    names: set[str] = set()
    # `localrules: a, b` on one line, or (as snakefmt writes it) one indented name per line
    pattern = re.compile(r"^localrules:[ \t]*(.*)\n((?:[ \t]+\S.*\n)*)", flags=re.MULTILINE)
    for f in [checkout / "Snakefile", *sorted((checkout / "rules").glob("*.smk"))]:
        for m in pattern.finditer(f.read_text()):
            text = m.group(1) + "," + m.group(2)
            names |= {n.strip() for n in text.replace("\n", ",").split(",") if n.strip()}
    return names


def test_profile_sizes_exactly_the_rules_that_run_as_jobs(tmp_path, copy_checkout, snakemake):
    checkout = copy_checkout(tmp_path / "checkout")
    # The round's bound tier is rule search_tier under place.model megatron and the rules
    # schedule_bounds + place_bounds under upstream: the profile sizes the rules of both.
    upstream = tmp_path / "upstream.yaml"
    upstream.write_text("place:\n  model: upstream\n")
    rules = set()
    for overlay in ([], [str(upstream)]):
        listed = snakemake(
            checkout, "--list-rules", "--configfile", "config/test.yaml", *overlay, timeout=120
        )
        assert listed.returncode == 0, listed.stderr[-3000:]
        # One rule name per unindented line; docstrings follow indented.
        names = {line.split()[0] for line in listed.stdout.splitlines() if line[:1].strip()}
        assert "all" in names, listed.stdout
        rules |= names
    job_rules = rules - _local_rules(checkout)
    sized = yaml.safe_load(PROFILE.read_text())["set-resources"]
    missing, stale = sorted(job_rules - set(sized)), sorted(set(sized) - job_rules)
    assert not missing and not stale, (
        f"profiles/slurm/config.yaml set-resources: rules without an entry {missing}, "
        f"entries naming no rule {stale}"
    )
    for rule, res in sized.items():
        assert set(res) == RESOURCE_KEYS, (rule, res)
        assert all(isinstance(v, int) and v > 0 for v in res.values()), (rule, res)


@pytest.mark.parametrize("script", ["start_slurm.sh", "stop_slurm.sh"])
def test_cluster_scripts_are_valid_bash(script):
    path = REPO / "tests" / "cluster" / script
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
