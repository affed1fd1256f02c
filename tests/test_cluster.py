"""The workflow through the Snakemake SLURM executor on a live single-node SLURM cluster.

The module starts a private cluster with tests/cluster/start_slurm.sh (installing Debian's munge,
slurmctld, slurmd, slurmdbd and MariaDB when missing), runs workflows with `--profile
profiles/slurm`, and stops the cluster again (stop_slurm.sh --purge) however the tests end.

It needs root on Debian: elsewhere (or with PHAZE_SKIP_CLUSTER=1) every test is skipped with the
reason printed. The apt install counts against the cluster start's 8 minutes (start_slurm.sh's
timeout).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]
START = REPO / "tests" / "cluster" / "start_slurm.sh"
STOP = REPO / "tests" / "cluster" / "stop_slurm.sh"
PROFILE = REPO / "profiles" / "slurm"
COMPARISON = Path("results") / "summary" / "comparison.parquet"
ACCOUNT = "phaze"
PARTITION = "debug"

# The plugin waits this long before its first sacct poll and after every poll that saw a job
# finish (default 40 s, sized for busy clusters); on an idle private cluster it only adds latency.
FAST_POLL = ["--slurm-init-seconds-before-status-checks", "2"]


def _skip_reason() -> str | None:
    if os.environ.get("PHAZE_SKIP_CLUSTER", "") not in ("", "0"):
        return "PHAZE_SKIP_CLUSTER is set"
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "needs root (installs Debian packages and starts SLURM daemons)"
    if not Path("/etc/debian_version").exists() or shutil.which("apt-get") is None:
        return "needs Debian with apt-get (the cluster comes from Debian's slurm-wlm packages)"
    etc_conf = Path("/etc/slurm/slurm.conf")
    if etc_conf.exists() and not etc_conf.is_symlink():
        return "a real SLURM cluster is configured here (/etc/slurm/slurm.conf); not touching it"
    return None


@dataclass
class Cluster:
    state_dir: Path
    env: dict[str, str]
    start_s: float
    started_at: datetime

    def run(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(
            args, env=self.env, capture_output=True, text=True, timeout=60, check=False
        )
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
        return out.stdout


@pytest.fixture(scope="module")
def slurm_cluster():
    reason = _skip_reason()
    if reason:
        print(f"cluster tests skipped: {reason}")
        pytest.skip(reason)
    # Short path: munge and MariaDB sockets live inside it (unix socket paths max 107 bytes).
    state_dir = Path(tempfile.mkdtemp(prefix="phaze-slurm-", dir="/tmp"))
    env = dict(os.environ, SLURM_CONF=str(state_dir / "etc" / "slurm.conf"))
    for var in [v for v in env if v.startswith(("SBATCH_", "SLURM_")) and v != "SLURM_CONF"]:
        del env[var]  # a surrounding job's settings must not leak into this cluster's jobs
    env["SBATCH_ACCOUNT"] = ACCOUNT  # read by profiles/slurm/config.yaml, as documented
    env["SBATCH_PARTITION"] = PARTITION
    started_at = datetime.now() - timedelta(minutes=5)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            ["bash", str(START), str(state_dir)],
            capture_output=True,
            text=True,
            timeout=480,
            check=False,
        )
        print(proc.stderr, end="")
        if proc.returncode != 0:
            logs = "\n".join(
                f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}"
                for f in sorted((state_dir / "log").glob("*.log"))
            )
            pytest.fail(f"start_slurm.sh failed ({proc.returncode}):\n{proc.stderr}\n{logs}")
        yield Cluster(state_dir, env, time.monotonic() - t0, started_at)
    finally:
        stop = subprocess.run(
            ["bash", str(STOP), "--purge", str(state_dir)],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        print(stop.stderr, end="")


class Snakemake:
    """One snakemake process in workdir, output to workdir/snakemake.out (no pipe to fill)."""

    def __init__(self, cluster: Cluster, workdir: Path, *args: str):
        self.workdir = workdir
        self.cmd = [sys.executable, "-m", "snakemake", *args]
        self.out_path = workdir / "snakemake.out"
        with open(self.out_path, "w") as out:
            self.proc = subprocess.Popen(
                self.cmd,
                env=cluster.env,
                cwd=workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )

    def wait(self, timeout_s: float) -> str:
        """Wait for it; return its output, failing with its tail and the failed jobs' logs."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()  # snakemake cancels its SLURM jobs on SIGTERM
            self.proc.wait(timeout=60)
            code = None
        text = self.out_path.read_text(errors="replace")
        # Snakemake's own figure: this process may have ended well before wait() was called.
        elapsed = re.findall(r"^Elapsed time: (\S+)", text, flags=re.MULTILINE)
        print(
            f"{' '.join(self.cmd[2:])} in {self.workdir.name}/: exit {code}, "
            f"elapsed {elapsed[-1] if elapsed else '?'}"
        )
        if code != 0:
            failed_logs = sorted(set(re.findall(r"(\S+/\.snakemake/slurm_logs/\S+\.log)", text)))
            logs = "\n".join(
                f"--- {f}\n{Path(f).read_text(errors='replace')[-1500:]}"
                for f in failed_logs[-4:]
                if Path(f).exists()
            )
            reason = "timed out" if code is None else f"exit {code}"
            raise AssertionError(f"snakemake {reason}:\n{text[-5000:]}\n{logs}")
        return text


def _snakemake(cluster: Cluster, workdir: Path, *args: str, timeout_s: float) -> str:
    return Snakemake(cluster, workdir, *args).wait(timeout_s)


@dataclass
class SlurmJob:
    job_id: str
    rule: str
    state: str
    exit_code: str
    req_mem: str
    time_limit: str
    req_cpus: int
    account: str
    partition: str


def _jobs_of_run(cluster: Cluster, log: str) -> tuple[list[str], dict[str, SlurmJob]]:
    """Job ids snakemake says it submitted, and sacct's record of every job of that run.

    The plugin names all SLURM jobs of one run after its run id and puts `rule_<name>...` in the
    job comment, so `sacct --name` finds exactly this run's jobs.
    """
    run_ids = re.findall(r"SLURM run ID: (\S+)", log)
    assert len(run_ids) == 1, f"expected one SLURM run id in the log, found {run_ids}"
    submitted = re.findall(r"submitted with SLURM jobid (\d+)", log)
    fields = "JobID,Comment%200,State,ExitCode,ReqMem,Timelimit,ReqCPUS,Account,Partition"
    start = cluster.started_at.strftime("%Y-%m-%dT%H:%M:%S")
    # Accounting reaches slurmdbd asynchronously: wait until every submitted job has a final state.
    deadline = time.monotonic() + 60
    while True:
        out = cluster.run(
            "sacct", "-X", "-n", "-P", "-S", start, "--name", run_ids[0], "-o", fields
        )
        jobs = {}
        for line in out.splitlines():
            jid, comment, state, exit_code, mem, limit, cpus, account, part = line.split("|")
            rule = re.match(r"rule_(\w+?)(?:_wildcards_.*)?$", comment)
            jobs[jid] = SlurmJob(
                jid,
                rule.group(1) if rule else comment,
                state,
                exit_code,
                mem,
                limit,
                int(cpus),
                account,
                part,
            )
        settled = all(j.state not in ("PENDING", "RUNNING", "COMPLETING") for j in jobs.values())
        if (set(submitted) <= set(jobs) and settled) or time.monotonic() > deadline:
            return submitted, jobs
        time.sleep(1)


def _assert_all_completed(submitted: list[str], jobs: dict[str, SlurmJob], log: str) -> None:
    assert submitted, "snakemake submitted no SLURM job"
    assert sorted(submitted, key=int) == sorted(jobs, key=int), (
        f"snakemake submitted {sorted(submitted, key=int)}, sacct lists {sorted(jobs, key=int)}"
    )
    bad = {
        j.job_id: (j.rule, j.state, j.exit_code)
        for j in jobs.values()
        if j.state != "COMPLETED" or j.exit_code != "0:0"
    }
    assert not bad, f"SLURM jobs not COMPLETED with exit 0: {bad}"
    # Every non-local rule instance snakemake ran went through SLURM (local rules print as
    # "localrule"); a retried job would show up as an extra submission and fail the equality.
    remote_rule_runs = re.findall(r"^rule (\w+):$", log, flags=re.MULTILINE)
    assert len(remote_rule_runs) == len(submitted), (
        f"{len(remote_rule_runs)} rule jobs ran but {len(submitted)} SLURM jobs were submitted"
    )
    assert sorted(remote_rule_runs) == sorted(j.rule for j in jobs.values())
    for j in jobs.values():
        assert (j.account, j.partition) == (ACCOUNT, PARTITION), j


def _profile_resources() -> dict:
    # The profile is a YTE template; its set-resources block is plain YAML.
    return yaml.safe_load((PROFILE / "config.yaml").read_text())["set-resources"]


def _minutes(limit: str) -> int:
    """sacct Timelimit [D-]HH:MM:SS -> minutes."""
    days, _, hms = limit.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return int(days or 0) * 1440 + h * 60 + m + math.ceil(s / 60)


# Two rules named like phaze's (the profile sizes them differently), and a local target rule.
TOY_SNAKEFILE = """
localrules: all

rule all:
    input: "summary.txt"

rule arch:
    output: "arch.txt"
    shell: "echo $SLURM_JOB_ID > {output}"

rule search_summary:
    input: "arch.txt"
    output: "summary.txt"
    shell: "cat {input} > {output}; echo $SLURM_JOB_ID >> {output}"
"""


def test_profile_submits_each_rule_with_its_resources(slurm_cluster, tmp_path):
    """A two-rule workflow named like phaze's stages: each rule becomes one COMPLETED SLURM job
    carrying the runtime, memory, CPUs, account and partition the profile sets for that rule."""
    (tmp_path / "Snakefile").write_text(TOY_SNAKEFILE)
    log = _snakemake(slurm_cluster, tmp_path, "--profile", str(PROFILE), *FAST_POLL, timeout_s=240)
    submitted, jobs = _jobs_of_run(slurm_cluster, log)
    _assert_all_completed(submitted, jobs, log)
    assert sorted(j.rule for j in jobs.values()) == ["arch", "search_summary"]
    wanted = _profile_resources()
    assert wanted["arch"] != wanted["search_summary"], "pick two rules the profile sizes apart"
    for j in jobs.values():
        res = wanted[j.rule]
        assert j.req_mem == f"{res['mem_mb']}M", j
        assert _minutes(j.time_limit) == res["runtime"], j
        assert j.req_cpus == res["cpus_per_task"], j
    # The rules really ran inside those jobs: each wrote its own SLURM_JOB_ID.
    ids_by_rule = {j.rule: j.job_id for j in jobs.values()}
    assert (tmp_path / "arch.txt").read_text().split() == [ids_by_rule["arch"]]
    assert (tmp_path / "summary.txt").read_text().split() == [
        ids_by_rule["arch"],
        ids_by_rule["search_summary"],
    ]


def _read_comparison(path: Path):
    import pandas as pd

    assert path.exists(), f"the workflow did not produce {path}"
    return pd.read_parquet(path)


def _clock_stopped_solves(results: Path) -> list[str]:
    """Schedule tables with solves that stopped on a clock (time limit, watchdog): those depend on
    machine speed and load, so two runs need not agree. The array tier's layer tables
    (``schedule/{model}/tier/``) have no status: their work does not depend on a clock."""
    import pandas as pd
    import pyarrow.parquet as pq

    tables = sorted((results / "schedule").rglob("*.parquet"))
    assert tables, f"no schedule tables under {results / 'schedule'}"
    found = []
    for t in tables:
        if "status" not in pq.read_schema(t).names:
            assert t.parent.name == "tier", f"{t} has no status column"
            continue
        status = pd.read_parquet(t, columns=["status"])["status"]
        n = int(status.isin(["time_limit", "watchdog"]).sum())
        if n:
            found.append(f"{t.relative_to(results.parent)}: {n} of {len(status)}")
    return found


def _peak_rss_mb(cluster: Cluster, job_ids: list[str]) -> dict[str, float]:
    """Largest MaxRSS over each job's steps (batch script and the srun step running the rule)."""
    out = cluster.run("sacct", "-n", "-P", "-j", ",".join(job_ids), "-o", "JobID,MaxRSS")
    units = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2}
    peak: dict[str, float] = {}
    for line in out.splitlines():
        step, rss = line.split("|")
        if rss:
            mb = float(rss[:-1]) * units[rss[-1]] if rss[-1] in units else float(rss) / 2**20
            job = step.split(".")[0]
            peak[job] = max(peak.get(job, 0.0), mb)
    return peak


def _summary_mismatches(on_slurm, local) -> tuple[list[str], list[str]]:
    """(columns compared, differences) between the two comparison tables: same (model, strategy)
    rows, every throughput/speedup column equal within 1e-6 relative (NaN equals NaN)."""
    import numpy as np

    key = ["model", "strategy"]
    assert set(key) <= set(local.columns), f"comparison.parquet lacks {key}: {list(local.columns)}"
    assert len(local) > 0
    assert list(on_slurm.columns) == list(local.columns)
    on_slurm = on_slurm.sort_values(key).reset_index(drop=True)
    local = local.sort_values(key).reset_index(drop=True)
    assert on_slurm[key].equals(local[key]), "different (model, strategy) rows"
    compared = [c for c in local.columns if "throughput" in c or "speedup" in c]
    assert "throughput_seq_s" in compared
    diffs = []
    for c in compared:
        a = on_slurm[c].to_numpy(dtype=float)
        b = local[c].to_numpy(dtype=float)
        same = np.isclose(a, b, rtol=1e-6, atol=0.0) | (np.isnan(a) & np.isnan(b))
        for row in np.flatnonzero(~same):
            diffs.append(
                f"{c} {tuple(local.loc[row, key])}: "
                f"SLURM {float(a[row])!r} vs local {float(b[row])!r}"
            )
    return compared, diffs


# A hang guard, not a speed target: the suite's other worker shares the cores with both runs.
@pytest.mark.timeout(900)
def test_workflow_on_slurm_matches_local_run(slurm_cluster, tmp_path, copy_checkout):
    """config/test.yaml end to end through SLURM: every job a COMPLETED SLURM job with the
    profile's resources for its rule, and the summary throughputs equal a local run's within 1e-6
    relative."""
    # Each run in its own copy of the checkout, invoked as a user would from its root. The local
    # run goes alongside: the SLURM run mostly waits on queue polls.
    common = ["--configfile", "config/test.yaml"]
    slurm_dir, local_dir = copy_checkout(tmp_path / "slurm"), copy_checkout(tmp_path / "local")
    local_run = Snakemake(slurm_cluster, local_dir, *common, "--cores", "1")
    slurm_run = Snakemake(
        slurm_cluster, slurm_dir, *common, "--profile", "profiles/slurm", *FAST_POLL
    )
    log = slurm_run.wait(timeout_s=1200)
    local_run.wait(timeout_s=120)

    submitted, jobs = _jobs_of_run(slurm_cluster, log)
    _assert_all_completed(submitted, jobs, log)
    wanted = _profile_resources()
    peak = _peak_rss_mb(slurm_cluster, list(jobs))
    by_rule: dict[str, list[SlurmJob]] = {}
    for j in jobs.values():
        by_rule.setdefault(j.rule, []).append(j)
        assert j.rule in wanted, f"profiles/slurm has no set-resources entry for rule {j.rule}"
        res = wanted[j.rule]
        assert (j.req_mem, _minutes(j.time_limit), j.req_cpus) == (
            f"{res['mem_mb']}M",
            res["runtime"],
            res["cpus_per_task"],
        ), j
        # Memory is not enforced here (no cgroups), so check the request covers the use.
        assert peak.get(j.job_id, 0.0) <= res["mem_mb"], (j, peak.get(j.job_id))
    print(f"{len(jobs)} SLURM jobs; per rule: count, peak MaxRSS MB / requested mem_mb")
    for rule, js in sorted(by_rule.items()):
        rss = max(peak.get(j.job_id, 0.0) for j in js)
        print(f"  {rule:16s} {len(js):3d}  {rss:7.0f} / {wanted[rule]['mem_mb']}")

    compared, diffs = _summary_mismatches(
        _read_comparison(slurm_dir / COMPARISON), _read_comparison(local_dir / COMPARISON)
    )
    clocked = _clock_stopped_solves(slurm_dir / "results") + _clock_stopped_solves(
        local_dir / "results"
    )
    # Both conditions are the contract of a cluster run: equal summaries, from solves that are
    # deterministic (gap reached or proven, never cut by a clock).
    assert not diffs and not clocked, (
        "summary throughputs differ between the SLURM and local runs:\n  "
        + ("\n  ".join(diffs) or "(none)")
        + "\nsolves stopped on a clock (config/test.yaml `schedule:` must let every solve finish):"
        + "\n  "
        + ("\n  ".join(clocked) or "(none)")
    )
    print(f"summary columns equal within 1e-6: {compared}")
