# Plots from the summary tables; `snakemake --report results/report.html` embeds the PNGs with
# the captions in report/.


rule report_plots:
    input:
        **W.summary,
    output:
        W.report_plots_outputs(report),
    log:
        "results/logs/report/plots.log",
    benchmark:
        "results/benchmarks/report/plots.tsv"
    conda:
        "../environment.yml"
    params:
        code=code_version("report"),
        cfg=W.section("report"),
        summary=lambda wc, input: os.path.dirname(input.best),
        out=lambda wc, output: os.path.dirname(output[0]),
    shell:
        'python3 -m phaze report --summary {params.summary:q} --config "$PHAZE_CONFIG"'
        " --out-dir {params.out:q} > {log:q} 2>&1"
