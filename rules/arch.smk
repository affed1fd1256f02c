# Stage 2: the architecture space. One job; re-runs when the arch code, the `arch` config section,
# a preset file, or a costmodel constant that a preset overrides changes.


def _arch_presets():
    names = list(config["arch"]["presets"]) + [config["arch"]["area_budget"]["reference_preset"]]
    return sorted(set(names))


def _arch_cfg(wildcards):
    # costmodel keys a preset overrides decide whether that preset is its own point (and its id)
    from phaze.arch.presets import load_preset

    overridden = sorted({k for p in _arch_presets() for k in load_preset(p)["costmodel"]})
    return _json.dumps({"arch": config["arch"],
                        "costmodel": {k: config["costmodel"].get(k) for k in overridden}},
                       sort_keys=True)


rule arch:
    input:
        presets=[f"config/presets/{p}.yaml" for p in _arch_presets()],
    output:
        f"{RESULTS}/arch/space.parquet",
    log:
        f"{RESULTS}/logs/arch/space.log",
    benchmark:
        f"{RESULTS}/benchmarks/arch/space.tsv"
    params:
        code=code_version("arch"),
        cfg=_arch_cfg,
    resources:
        mem_mb=1000,
        runtime=5,
    shell:
        "{PHAZE} arch --config {CONFIG_JSON} --out {output:q} > {log:q} 2>&1"
