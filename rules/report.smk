# Plots from the summary tables; `snakemake --report results/report.html` embeds the PNGs with
# the captions in report/.
from phaze.report.plots import FIGURES as _FIGURES

_CAPTIONS = {
    "speedup": "Speedups",
    "convergence": "Search",
    "area_throughput": "Search",
    "arch_table": "Chosen designs",
    "pipeline": "Chosen designs",
}
PLOTS = [f"{RESULTS}/plots/{n}.{fmt}" for n in _FIGURES for fmt in config["report"]["formats"]]


def _plot_output(name, fmt):
    path = f"{RESULTS}/plots/{name}.{fmt}"
    if fmt == "png":
        return report(path, caption=f"../report/{name}.rst", category=_CAPTIONS[name])
    return path


rule report_plots:
    input:
        **SUMMARY,
    output:
        [_plot_output(n, fmt) for n in _FIGURES for fmt in config["report"]["formats"]],
    params:
        code=code_version("report"),
        cfg=config_section(config, "report"),
    log:
        f"{RESULTS}/logs/report/plots.log",
    benchmark:
        f"{RESULTS}/benchmarks/report/plots.tsv"
    shell:
        "{PHAZE} report --summary {RESULTS}/summary --config {CONFIG_JSON}"
        " --out-dir {RESULTS}/plots > {log} 2>&1"
