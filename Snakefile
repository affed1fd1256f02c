# phaze: integrated accelerator architecture and device placement search.
# `snakemake -j 2` runs config/config.yaml; `--configfile config/paper.yaml` the paper's sweep.
import os
import sys
from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")

# The default config only when no --configfile is given: Snakemake would otherwise merge the two
# recursively, leaking config.yaml's keys into e.g. config/paper.yaml's sections.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


validate(config, "config/schema.yaml", set_default=True)

# Jobs run `python -m phaze ...` with this interpreter and this checkout's package.
os.environ["PYTHONPATH"] = workflow.basedir + os.pathsep + os.environ.get("PYTHONPATH", "")
sys.path.insert(0, workflow.basedir)

from phaze.workflow import code_version, config_section, snapshot_config  # noqa: E402

PHAZE = f"{sys.executable} -m phaze"
RESULTS = "results"
CONFIG_JSON = snapshot_config(config, f"{RESULTS}/.config.json")


report: "report/workflow.rst"


# The default target: the summary tables and the plots (defined in rules/search.smk, report.smk).
rule all:
    input:
        lambda wc: list(SUMMARY.values()) + [f"{RESULTS}/summary/search_stats.json"] + PLOTS,
    default_target: True


# Light bookkeeping jobs run on the submitting host, never as cluster jobs.
localrules: all, search_plan, search_prune, search_state


include: "rules/common.smk"


for _rules in ("trace", "arch", "estimate", "schedule", "place", "search", "report"):
    if Path(workflow.basedir, "rules", f"{_rules}.smk").exists():
        include: f"rules/{_rules}.smk"
