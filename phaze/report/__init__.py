"""Plots of the search results (matplotlib, Agg): speedups, convergence, area vs throughput with
the Pareto front, the chosen architectures as a table, the chosen placements' pipeline stages."""
