"""Plots of the search results (matplotlib, Agg): speedups, convergence, area vs throughput with
the Pareto front, the chosen architectures as a table, the chosen placements' pipeline stages, the
throughput at each HBM size."""

#: the figures (phaze.report.plots.make_figures), each with its category in
#: `snakemake --report` (the caption is report/NAME.rst); importing this does not load matplotlib
FIGURES = {
    "speedup": "Speedups",
    "convergence": "Search",
    "area_throughput": "Search",
    "arch_table": "Chosen designs",
    "pipeline": "Chosen designs",
    "hbm_sensitivity": "Chosen designs",
}
