# phaze: integrated accelerator architecture and device placement search.
# `snakemake -j 2` runs config/config.yaml; `--configfile config/paper.yaml` the paper's sweep.
# The rules are in rules/*.smk; everything they compute lives in phaze.workflow (tested Python).
import os
import sys

from snakemake.utils import min_version

min_version("9.0")

# The default config only when no --configfile is given: Snakemake would otherwise merge the two
# recursively, leaking config.yaml's keys into e.g. config/paper.yaml's sections.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


# Jobs run `python3 -m phaze ...`: the interpreter running Snakemake comes first on PATH and this
# checkout's package first on PYTHONPATH (under --sdm conda the rules' environment comes first).
os.environ["PATH"] = os.pathsep.join(
    [os.path.dirname(sys.executable), os.environ["PATH"]]
)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [workflow.basedir, *filter(None, [os.environ.get("PYTHONPATH")])]
)
sys.path.insert(0, workflow.basedir)

from phaze.cli import one_line  # noqa: E402
from phaze.config import check_config_files, validate_config  # noqa: E402
from phaze.errors import PhazeError  # noqa: E402
from phaze.report.closing import closing_note  # noqa: E402
from phaze.workflow import Sweep, code_version, snapshot_config  # noqa: E402

# The same validator (and schema defaults) as every `python -m phaze <stage> --config`; a bad
# config stops here, one line, before any job (also under --dry-run).
try:
    check_config_files(workflow.overwrite_configfiles or ["config/config.yaml"])
    validate_config(config)
    W = Sweep(config, checkpoints)
except PhazeError as exc:
    sys.exit(f"phaze: error: {one_line(exc)}")
# This run's config snapshot, results/.config/<content hash>.json, written once; its jobs read it
# as $PHAZE_CONFIG, so another invocation (a dry run, another --configfile) cannot change it.
os.environ["PHAZE_CONFIG"] = snapshot_config(config, W.config_json)


envvars:
    "PATH",
    "PYTHONPATH",
    "PHAZE_CONFIG",


report: "report/workflow.rst"


# The end of a run that built the summary: the answers and where the tables, plots and report
# are, on stdout (phaze/report/closing.py; alone: `python -m phaze report --summary DIR --table`).
# Snakemake skips it under --dry-run and when nothing was to be done; a run for other targets
# prints nothing.
onsuccess:
    if any(job.rule.name == "search_summary" for job in workflow.dag.jobs):
        try:
            print(
                closing_note(
                    f"{W.results}/summary",
                    f"{W.results}/plots",
                    f"{W.results}/report.html",
                )
            )
        except PhazeError as exc:
            print(f"phaze: no closing table: {exc}")


# The default target: the summary tables and the plots.
rule all:
    default_target: True
    input:
        W.all_targets(),


# Light bookkeeping jobs run on the submitting host, never as cluster jobs.
localrules:
    all,
    search_plan,
    search_select,
    search_prune,


include: "rules/common.smk"
include: "rules/trace.smk"
include: "rules/arch.smk"
include: "rules/estimate.smk"
include: "rules/schedule.smk"
include: "rules/place.smk"
include: "rules/search.smk"
include: "rules/baselines.smk"
include: "rules/report.smk"
