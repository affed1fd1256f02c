"""The sweep as the Snakefile sees it: its axes, the paths every rule agrees on, the search rounds,
and the input, param and manifest functions of the rules (rules/*.smk hold rules only).

``Sweep(config, checkpoints)`` is built once by the Snakefile from the validated config and
Snakemake's ``checkpoints`` object. Methods whose name ends in ``_inputs``/``_params`` or that
take ``wc`` are what rules pass to ``input:``/``params:``; they read the search's checkpoints
(``search_plan``, ``search_prune``, ``search_state``) through ``checkpoints.NAME.get(...)``, which
raises Snakemake's IncompleteCheckpointException until that checkpoint has run (Snakemake then
re-evaluates the DAG). The same interface over the results on disk, :class:`FileCheckpoints`, is
what a select, prune or summary job uses to build its manifest (``step_manifest``); tests pass
their own stand-in.

Layout under ``results/`` (``{tag}`` = ``b{microbatch}_s{seq}_{shard}``, the shard of the model one
rank holds: ``tp{tp}``, or ``tp{tp}_ep{ep}`` for a mixture-of-experts model at expert-parallel
size ep > 1, with ``_etp1`` when its experts are whole on each rank, etp = 1):

    trace/{model}/{tag}/{ops,edges,layers}.parquet          rule trace
    arch/space.parquet, arch/chunks.parquet                 rules arch, search_plan
    search/space/{model}/b{mbs}.parquet                     rule space_bounds
    search/r{round}/select.parquet, state.json              checkpoint search_select
    estimate/{model}/{tag}/r{round}_c{chunk}.parquet        rule estimate_round
    estimate/{model}/{tag}/{chunk}.parquet | blind          rules estimate, estimate_blind
    schedule/{model}/tier/b{mbs}_r{round}.parquet           rule search_tier
    schedule/{model}/{tag}/bounds/r{round}_c{chunk}.parquet rule schedule_bounds (upstream)
    schedule/{model}/{tag}/{solve}/r{round}_c{chunk}.parquet rule schedule_ilp
        ({solve}: ilp | deep | certify)
    schedule/{model}/{tag}/blind.parquet | {chunk}.parquet  rules schedule_blind, schedule
    place/{model}/h{hbm}_b{mbs}/r{round}_{tier}.parquet | blind | {chunk}
        ({tier}: ub | lo | ilp | ilp_ub | deep | deep_ub | certify | certify_ub)
    search/r{round}/{solve}/{model}_b{mbs}.parquet          checkpoint search_prune
    baselines/blind/{model}/choice.parquet                  rule search_blind
    summary/{best,comparison,explored,front,certified}.parquet, search_stats.json
"""

from __future__ import annotations

import functools
import json
import os
import shlex

import pandas as pd

from phaze.arch.presets import load_preset
from phaze.errors import PhazeError
from phaze.report import FIGURES
from phaze.trace.models import get_model_spec
from phaze.workflow.provenance import code_version, config_section, snapshot_path

#: search settings that decide the plan (chunks.parquet): only they re-run search_plan
PLAN_KEYS = (
    "bucket_width_mm2",
    "round_buckets",
    "chunk_archs",
    "baseline_preset",
    "upstream_baseline_preset",
)
RESULTS = "results"
#: placement tiers of a bound-tier job: output tier -> schedule column used as layer latency
BOUND_TIERS = (("ub", "lower_bound_s"), ("lo", "makespan_s"))
# the ILP tier: placement on the ILP's makespans (achievable) and on its proven lower bounds (a
# throughput upper bound, tighter than the bound tier's: what the search's certificate reads)
ILP_TIERS = (("ilp", "makespan_s"), ("ilp_ub", "lower_bound_s"))
# the deep tier (search.deepen_node_limit > 0): the same, on a deeper ILP of fewer archs
DEEP_TIERS = (("deep", "makespan_s"), ("deep_ub", "lower_bound_s"))
# the certify solve (search.certify_split_nodes > 0): the final tier's solve with the split, on
# the components whose bounds keep a certificate open; its makespans' placement is recorded, not
# scored (phaze.search.scores)
CERTIFY_TIERS = (("certify", "makespan_s"), ("certify_ub", "lower_bound_s"))
BLIND_TIERS = (("ilp", "makespan_s"),)
#: the ILP solves of a round, in order: each one's selection reads the placements of the last
SOLVE_TIERS = {"ilp": ILP_TIERS, "deep": DEEP_TIERS, "certify": CERTIFY_TIERS}


def gib_str(h: float) -> str:
    """An HBM size in GiB as it appears in paths (``32``, ``80``, ``0.5``)."""
    return f"{h:g}"


@functools.cache
def _read_parquet(path: str, mtime: float, columns: tuple[str, ...]) -> pd.DataFrame:
    # keyed by mtime: DAG evaluation asks for the same checkpoint tables many times
    return pd.read_parquet(path, columns=list(columns))


@functools.cache
def _read_json(path: str, mtime: float) -> dict:
    with open(path) as fh:
        return json.load(fh)


def model_keys(models: list[str]) -> dict[str, str]:
    """Model key (a registry name, or the directory name of a config.json) -> the config entry.
    Two entries with one key (``opt-350m`` and ``/x/opt-350m/config.json``; two config.json files
    in directories of one name) would share every path and table row: an error naming both."""
    keys: dict[str, str] = {}
    for m in models:
        key = get_model_spec(m).name
        if key in keys:
            raise PhazeError(
                f"models {keys[key]!r} and {m!r} have the same key {key!r} (a registry name or "
                "the directory of a config.json): rename one directory"
            )
        keys[key] = m
    return keys


class Sweep:
    """The sweep of one validated config; ``checkpoints`` is Snakemake's (or a stand-in)."""

    def __init__(self, config: dict, checkpoints):
        self.config = config
        self.checkpoints = checkpoints
        self.results = results = RESULTS  # the rules' paths are literal: results/...
        self.search = config["search"]
        # model key (used in paths and tables) -> the --model argument (registry name or path)
        self.model_arg = model_keys(config["models"])
        self.models = list(self.model_arg)
        self.microbatches = list(config["trace"]["microbatch"])
        self.hbm_gib = list(config["place"]["hbm_gib"])
        # the megatron model prices selective recomputation from the operators' latencies
        place = config["place"]
        self.needs_latencies = place["model"] == "megatron" and "selective" in place["recompute"]
        # the round's bound tier: rule search_tier (the array tier, megatron placement only) or,
        # under place.model upstream, rules estimate_round, schedule_bounds and place_bounds
        self.array_tier = place["model"] == "megatron"
        self.pairs = [(m, b) for m in self.models for b in self.microbatches]
        self.space = f"{results}/arch/space.parquet"
        self.plan = plan_file(results)
        # this run's config snapshot (content-keyed); jobs get it as $PHAZE_CONFIG, not as a
        # param, so a config edit re-runs only the jobs whose sections changed
        self.config_json = snapshot_path(config, results)
        self.summary = {
            n: f"{results}/summary/{n}.parquet"
            for n in ("best", "comparison", "explored", "front", "certified")
        }
        self.blind_mbs = min(self.microbatches)
        # the ILP solves of every round: ilp, deep when the search deepens (the final solve:
        # the reference of every answer and baseline), certify when it certifies
        self.final_solve = "deep" if self.search["deepen_node_limit"] > 0 else "ilp"
        self.solves = ["ilp"] + (["deep"] if self.final_solve == "deep" else [])
        self.solves += ["certify"] if self.search["certify_split_nodes"] > 0 else []

    # --- axes and paths ------------------------------------------------------------------------
    def tps(self, model: str) -> list[int]:
        """Tensor-parallel widths traced for a model: config trace.tp that the model admits."""
        valid = get_model_spec(self.model_arg[model]).valid_tp
        return [t for t in self.config["trace"]["tp"] if t in valid]

    def eps(self, model: str) -> list[int]:
        """Expert-parallel sizes traced for a model: config trace.ep that divide its routed
        experts (a mixture-of-experts model), 1 for a dense model."""
        moe = get_model_spec(self.model_arg[model]).moe
        if moe is None:
            return [1]
        eps = [e for e in self.config["trace"]["ep"] if moe.experts % e == 0]
        if not eps:
            raise PhazeError(
                f"{model}: no size of trace.ep {self.config['trace']['ep']} divides its "
                f"{moe.experts} routed experts"
            )
        return eps

    def etps(self, model: str, t: int) -> list[int]:
        """The experts' tensor-parallel sizes traced for a model at width t: config trace.etp
        ("tp" = t, 1 = whole experts); whole experts only for a mixture-of-experts model at
        t > 1 whose sequence the t ranks split evenly (its experts run on the rank's shard)."""
        whole = get_model_spec(self.model_arg[model]).whole_experts(t, self.seq(model))
        out = []
        for x in self.config["trace"]["etp"]:
            x = t if x == "tp" else int(x)
            if x != t and not whole:
                continue
            if x not in out:
                out.append(x)
        return out

    def shards(self, model: str) -> list[tuple[int, int, int]]:
        """The (tp, ep, etp) shapes of one rank traced for a model."""
        return [
            (t, e, x) for t in self.tps(model) for e in self.eps(model) for x in self.etps(model, t)
        ]

    def shard_names(self, model: str) -> list[str]:
        return [shard_name(*k) for k in self.shards(model)]

    def seq(self, model: str) -> int:
        arg = self.model_arg[model]
        return self.config["trace"]["seq"].get(arg) or get_model_spec(arg).seq

    def tag(self, model: str, mbs, shard: str) -> str:
        return f"b{mbs}_s{self.seq(model)}_{shard}"

    def trace_dir(self, model: str, mbs, shard: str) -> str:
        return f"{self.results}/trace/{model}/{self.tag(model, mbs, shard)}"

    def schedule_dir(self, model: str, mbs, shard: str) -> str:
        return f"{self.results}/schedule/{model}/{self.tag(model, mbs, shard)}"

    def estimate_dir(self, model: str, mbs, shard: str) -> str:
        return f"{self.results}/estimate/{model}/{self.tag(model, mbs, shard)}"

    def place_dir(self, model: str, hbm, mbs) -> str:
        return f"{self.results}/place/{model}/h{gib_str(hbm)}_b{mbs}"

    def place_outputs(self, name: str) -> list[str]:
        """One placement table per HBM (``{model}``/``{mbs}`` left as wildcards); the placement
        axes (recompute among them) are searched inside each."""
        return [
            f"{self.results}/place/{{model}}/h{gib_str(h)}_b{{mbs}}/{name}.parquet"
            for h in self.hbm_gib
        ]

    def plots(self) -> list[str]:
        return [
            f"{self.results}/plots/{n}.{fmt}"
            for n in FIGURES
            for fmt in self.config["report"]["formats"]
        ]

    def report_plots_outputs(self, report) -> list:
        """rule report_plots' outputs; the PNGs marked for `snakemake --report` (``report`` is
        Snakemake's function) with their caption report/NAME.rst."""
        return [
            report(path, caption=f"../report/{n}.rst", category=FIGURES[n])
            if path.endswith(".png")
            else path
            for n in FIGURES
            for path in [
                f"{self.results}/plots/{n}.{fmt}" for fmt in self.config["report"]["formats"]
            ]
        ]

    def all_targets(self) -> list[str]:
        return [*self.summary.values(), f"{self.results}/summary/search_stats.json", *self.plots()]

    # --- trace and arch rules ------------------------------------------------------------------
    def trace_model(self, wc) -> str:
        """The trace CLI's --model for a path's model key (the key itself if not configured)."""
        return self.model_arg.get(wc.model, wc.model)

    def trace_config_inputs(self, wc) -> list[str]:
        """A model given as a config.json path: re-trace when that file changes."""
        arg = self.trace_model(wc)
        if os.path.isdir(arg):
            return [os.path.join(arg, "config.json")]
        return [arg] if arg.endswith(".json") else []

    def trace_params(self) -> str:
        """Only what changes a trace's content: the microbatch/tp/seq lists choose WHICH traces
        exist, so editing them must not re-run the ones already made."""
        return json.dumps({"fuse": self.config["trace"]["fuse"]})

    def arch_presets(self) -> list[str]:
        arch = self.config["arch"]
        return sorted(set(arch["presets"]) | {arch["area_budget"]["reference_preset"]})

    def arch_params(self) -> str:
        """The arch section and the costmodel keys a preset overrides: they decide whether that
        preset is its own point (and its id)."""
        presets = self.arch_presets()
        overridden = sorted({k for p in presets for k in load_preset(p)["costmodel"]})
        costmodel = {k: self.config["costmodel"].get(k) for k in overridden}
        return json.dumps({"arch": self.config["arch"], "costmodel": costmodel}, sort_keys=True)

    def search_plan_params(self) -> str:
        return json.dumps({k: self.search[k] for k in PLAN_KEYS}, sort_keys=True)

    def search_params(self) -> str:
        """What select and prune read: the search section."""
        return json.dumps(self.search, sort_keys=True)

    @staticmethod
    def search_code() -> str:
        """The code select and prune run (not the summary's or the baselines')."""
        parts = ("scores", "stop", "plan", "files", "commands", "cli", "walk", "global_search")
        parts += ("rounds", "progress")
        return code_version(*(f"search/{f}.py" for f in parts))

    def section(self, *keys: str) -> str:
        return config_section(self.config, *keys)

    # --- trace directories from wildcards ------------------------------------------------------
    # From wildcards, not from `input`: params are re-evaluated inside remote (cluster) jobs,
    # where the named inputs of unpack()ed functions are not available.
    def trace_dir_of(self, wc) -> str:
        return f"{self.results}/trace/{wc.model}/b{wc.mbs}_s{wc.seq}_{wc.shard}"

    @staticmethod
    def shard_tp(wc) -> int:
        """The trace CLI's --tp of a shard wildcard."""
        return parse_shard(wc.shard)[0]

    @staticmethod
    def shard_ep(wc) -> int:
        """The trace CLI's --ep of a shard wildcard (1 for a dense model's)."""
        return parse_shard(wc.shard)[1]

    @staticmethod
    def shard_etp(wc) -> int:
        """The trace CLI's --etp of a shard wildcard (its tp, or 1 for whole experts)."""
        return parse_shard(wc.shard)[2]

    def trace_inputs(self, wc) -> dict[str, str]:
        d = self.trace_dir_of(wc)
        return {n: f"{d}/{n}.parquet" for n in ("ops", "edges", "layers")}

    # --- the space bounds ---------------------------------------------------------------------
    def space_bounds_file(self, model: str, mbs) -> str:
        return f"{self.results}/search/space/{model}/b{mbs}.parquet"

    def space_records(self) -> list[dict]:
        return [
            {"path": self.space_bounds_file(m, b), "model": m, "microbatch": int(b)}
            for m, b in self.pairs
        ]

    def space_bounds_inputs(self, wc) -> dict:
        shards = self.shard_names(wc.model)
        return {
            n: [f"{self.trace_dir(wc.model, wc.mbs, x)}/{n}.parquet" for x in shards]
            for n in ("ops", "edges", "layers")
        } | {"space": self.space}

    def _shard_args(self, model: str, mbs) -> list[str]:
        """--tp (--ep, --etp) --trace-dirs of every shard of a model (--ep only for expert
        parallelism and --etp only for whole experts: a dense model's commands stay as they
        were)."""
        shards = self.shards(model)
        argv = ["--tp", *(str(t) for t, _, _ in shards)]
        if any(e > 1 for _, e, _ in shards):
            argv += ["--ep", *(str(e) for _, e, _ in shards)]
        if any(x != t for t, _, x in shards):
            argv += ["--etp", *(str(x) for _, _, x in shards)]
        return argv + [
            "--trace-dirs",
            *(self.trace_dir(model, mbs, shard_name(*k)) for k in shards),
        ]

    # --- the round's bound tier -----------------------------------------------------------------
    def tier_layers_file(self, model: str, mbs, r) -> str:
        """rule search_tier's per-layer makespans and lower bounds of round r's archs."""
        return f"{self.results}/schedule/{model}/tier/b{mbs}_r{int(r)}.parquet"

    def search_tier_inputs(self, wc) -> dict:
        """Every width's trace and the space (the rule adds round r's selection)."""
        return self.space_bounds_inputs(wc)

    def search_tier_archs(self, wc) -> str:
        """The archs round r refines for one model and microbatch (every chunk), comma-joined."""
        sel = self.select_table(wc.round)
        mine = sel[(sel["model"] == wc.model) & (sel["microbatch"] == int(wc.mbs))]
        return ",".join(sorted(set(mine["arch"])))

    def search_tier_args(self, wc) -> list[str]:
        """The tier's model, microbatch, shards and space: the space bound's arguments."""
        return self.space_bounds_args(wc)

    def space_bounds_args(self, wc) -> list[str]:
        return [
            "--model",
            wc.model,
            "--microbatch",
            str(wc.mbs),
            *self._shard_args(wc.model, wc.mbs),
            "--space",
            self.space,
        ]

    # --- checkpoints ---------------------------------------------------------------------------
    def select_files(self, r) -> tuple[str, str]:
        """(select.parquet, state.json) of round r (checkpoint search_select)."""
        out = self.checkpoints.search_select.get(round=int(r)).output
        return out.select, out.state

    def select_table(self, r) -> pd.DataFrame:
        path = self.select_files(r)[0]
        cols = ("model", "microbatch", "arch", "chunk")
        return _read_parquet(path, os.path.getmtime(path), cols)

    def state_of(self, r) -> dict:
        path = self.select_files(r)[1]
        return _read_json(path, os.path.getmtime(path))

    def pairs_of_round(self, r) -> list[tuple[str, int]]:
        """(model, microbatch) pairs round r refines."""
        sel = self.select_table(r)
        return sorted({(str(m), int(b)) for m, b in zip(sel["model"], sel["microbatch"])})

    def round_chunks(self, r, model: str, mbs) -> list[int]:
        sel = self.select_table(r)
        mine = sel[(sel["model"] == model) & (sel["microbatch"] == int(mbs))]
        return sorted(int(c) for c in mine["chunk"].unique())

    def round_archs(self, wc) -> str:
        """The archs of one chunk of round r's selection, comma-joined (a param: a re-run select
        that picks the same archs re-runs no job)."""
        sel = self.select_table(wc.round)
        mine = sel[
            (sel["model"] == wc.model)
            & (sel["microbatch"] == int(wc.mbs))
            & (sel["chunk"] == int(wc.chunk))
        ]
        return ",".join(sorted(mine["arch"]))

    def round_selection_file(self, wc) -> str:
        return self.select_files(wc.round)[0]

    def last_round(self) -> int:
        """The last round that refined anything (round r+1's select found nothing)."""
        r = 0
        while self.state_of(r)["continue"]:
            # Meet round r's prune checkpoints before round r+1's select. Snakemake re-reads the
            # inputs of a job only when one of the checkpoints that job met has finished; in a
            # resumed run (round r pruned, its ILP jobs killed), a new round-(r+1) select that
            # met round r's prune first would never be re-read and would run before them
            for solve in self.solves:
                self.checkpoints.search_prune.get(round=r, solve=solve)
            r += 1
        return r - 1

    def schedule_ilp_selection(self, wc) -> str:
        """The chunk table of the archs the ILP solve ``wc.solve`` (ilp | deep | certify) solves."""
        d = self.checkpoints.search_prune.get(round=int(wc.round), solve=wc.solve).output[0]
        return f"{d}/{wc.model}_b{wc.mbs}.parquet"

    def _selection(self, r, m, b, solve) -> pd.DataFrame:
        path = self.schedule_ilp_selection(_Wildcards(round=r, model=m, mbs=b, solve=solve))
        return _read_parquet(path, os.path.getmtime(path), ("arch", "chunk"))

    def ilp_chunks(self, r, m, b, solve="ilp") -> list[int]:
        """Chunks of round r whose selection for (m, b) at ILP solve ``solve`` is non-empty."""
        return sorted(int(c) for c in self._selection(r, m, b, solve)["chunk"].unique())

    def schedule_ilp_archs(self, wc) -> str:
        """The archs pruning selected in one chunk, comma-joined (rule schedule_ilp's param)."""
        sel = self._selection(wc.round, wc.model, wc.mbs, wc.solve)
        return ",".join(sorted(sel.loc[sel["chunk"] == int(wc.chunk), "arch"]))

    def schedule_blind_params(self) -> str:
        """rule schedule_blind's config: that of the search's final ILP solve."""
        return self.schedule_ilp_params(_Wildcards(solve=self.final_solve))

    def schedule_ilp_params(self, wc) -> str:
        """What an ILP-solve job reads of the config: the schedule section, for the deep solve
        the search's deep limits (the schedule CLI's ``--tier deep``), for the certify solve the
        final solve's and the split's node allowance."""
        keys = []
        if wc.solve == "deep" or (wc.solve == "certify" and self.final_solve == "deep"):
            keys += ["search.deepen_node_limit", "search.deepen_time_limit_s"]
        if wc.solve == "certify":
            keys += ["search.certify_split_nodes"]
        return self.section("schedule", *keys)

    # --- placement records: each file with what it holds ---------------------------------------
    def _place_record(self, m, h, b, r, tier, name) -> dict:
        return {
            "path": f"{self.place_dir(m, h, b)}/{name}.parquet",
            "model": m,
            "microbatch": int(b),
            "round": int(r),
            "tier": tier,
        }

    def bound_place_records(self, r) -> list[dict]:
        return [
            self._place_record(m, h, b, r, tier, f"r{r}_{tier}")
            for m, b in self.pairs_of_round(r)
            for h in self.hbm_gib
            for tier, _ in BOUND_TIERS
        ]

    def ilp_place_records(self, r, solve="ilp") -> list[dict]:
        return [
            self._place_record(m, h, b, r, tier, f"r{r}_{tier}")
            for m, b in self.pairs_of_round(r)
            if self.ilp_chunks(r, m, b, solve)
            for h in self.hbm_gib
            for tier, _ in SOLVE_TIERS[solve]
        ]

    def solves_before(self, solve: str) -> list[str]:
        """The ILP solves of a round that run before ``solve`` (its selection reads them)."""
        return self.solves[: self.solves.index(solve)]

    def round_place_records(self, r, solves: list[str]) -> list[dict]:
        """Round r's placement records: the bound tiers, then those of the ILP ``solves``."""
        out = self.bound_place_records(r)
        for solve in solves:
            out += self.ilp_place_records(r, solve)
        return out

    def place_records_upto(self, r) -> list[dict]:
        out = []
        for q in range(int(r) + 1):
            out += self.round_place_records(q, self.solves)
        return out

    def blind_place_records(self) -> list[dict]:
        return [
            {
                "path": f"{self.place_dir(m, h, b)}/blind.parquet",
                "model": m,
                "microbatch": int(b),
                "tier": "ilp",
            }
            for m in self.models
            for b in self.microbatches
            for h in self.hbm_gib
        ]

    def schedule_records_upto(self, r) -> list[dict]:
        """Every schedule table of the rounds up to r, then the blind baseline's."""
        out = []
        for q in range(int(r) + 1):
            for m, b in self.pairs_of_round(q):
                chosen = {solve: self.ilp_chunks(q, m, b, solve) for solve in self.solves}
                if self.array_tier:  # one table of every width (tp 0: all of them)
                    out.append(_schedule_record(self.tier_layers_file(m, b, q), m, b, 0, "bounds"))
                for t, e, x in self.shards(m):
                    d = self.schedule_dir(m, b, shard_name(t, e, x))
                    out += [
                        _schedule_record(f"{d}/bounds/r{q}_c{c}.parquet", m, b, t, "bounds")
                        for c in ([] if self.array_tier else self.round_chunks(q, m, b))
                    ]
                    out += [
                        _schedule_record(f"{d}/{solve}/r{q}_c{c}.parquet", m, b, t, solve)
                        for solve, chunks in chosen.items()
                        for c in chunks
                    ]
        out += [
            _schedule_record(
                f"{self.schedule_dir(m, b, shard_name(t, e, x))}/blind.parquet", m, b, t, "blind"
            )
            for m in self.models
            for b in self.microbatches
            for t, e, x in self.shards(m)
        ]
        return out

    # --- search checkpoints and summary: inputs and manifests ----------------------------------
    def search_select_manifest(self, wc) -> dict:
        """Round r's select reads the space bounds and every placement of the rounds before."""
        return {"space": self.space_records(), "place": self.place_records_upto(int(wc.round) - 1)}

    def search_prune_manifest(self, wc) -> dict:
        """The ilp solve reads round r's bound tiers; the deep solve also its ilp tiers."""
        r = int(wc.round)
        current = self.round_place_records(r, self.solves_before(wc.solve))
        return {"space": self.space_records(), "place": self.place_records_upto(r - 1) + current}

    def search_summary_manifest(self, wc=None) -> dict:
        r = self.last_round()
        return {
            "state": [{"path": self.final_state()}],
            "space": self.space_records(),
            "place": self.place_records_upto(r),
            "blind_place": self.blind_place_records(),
            "blind": [
                {"path": f"{self.results}/baselines/blind/{m}/choice.parquet", "model": m}
                for m in self.models
            ],
            "schedules": self.schedule_records_upto(r),
        }

    def _checkpoint_files(self, r, solves) -> list[str]:
        """The outputs of round r's prune checkpoints a later step must wait for: when a config
        edit re-runs an earlier checkpoint, the steps after it must not start while it runs
        (their manifests are built from it)."""
        return [round_prune_dir(self.results, r, solve) for solve in solves]

    def round_select(self, r) -> str:
        return round_select_file(self.results, r)

    def round_state(self, r) -> str:
        return round_state_file(self.results, r)

    def previous_state_args(self, wc) -> list[str]:
        """Rule search_select's ``--previous-state`` (round r-1's state; none at round 0)."""
        r = int(wc.round)
        return ["--previous-state", self.round_state(r - 1)] if r > 0 else []

    def search_select_inputs(self, wc) -> dict:
        r = int(wc.round)
        out = {"plan": self.plan, "files": _paths(self.search_select_manifest(wc))}
        if r > 0:
            out["previous"] = self.round_state(r - 1)
            out["order"] = self._checkpoint_files(r - 1, self.solves)
        return out

    def search_prune_inputs(self, wc) -> dict:
        r = int(wc.round)
        return {
            "plan": self.plan,
            "select": self.round_select(r),
            "state": self.round_state(r),
            "files": _paths(self.search_prune_manifest(wc)),
            # the deep solve follows the round's ilp selection
            "order": self._checkpoint_files(r, self.solves_before(wc.solve)),
        }

    def final_state(self) -> str:
        """The search's last state.json: the round whose select found nothing to refine."""
        return self.round_state(self.last_round() + 1)

    def search_summary_inputs(self, wc) -> dict:
        return {
            "plan": self.plan,
            "space": self.space,
            "files": _paths(self.search_summary_manifest()),
        }

    def step_manifest(self, step: str, round: int | None = None, solve: str = "ilp") -> dict:
        """The manifest of search step ``step`` (select | prune | summary) of ``round``: the
        same function as the step's declared inputs (``search_*_inputs``), so the job that
        builds it from the finished checkpoints (:class:`FileCheckpoints`) lists exactly them."""
        if step == "select":
            return self.search_select_manifest(_Wildcards(round=round))
        if step == "prune":
            return self.search_prune_manifest(_Wildcards(round=round, solve=solve))
        if step == "summary":
            return self.search_summary_manifest()
        raise PhazeError(f"unknown search step {step!r} (select, prune, summary)")

    # --- placement jobs ------------------------------------------------------------------------
    def _place_tables(self, wc, kind: str) -> tuple[list[str], list[list[str]], list[list[str]]]:
        """The shards and, per shard, the schedule files and the operator-latency files (of
        the same chunks) a placement job of `kind` reads."""
        m, b = wc.model, int(wc.mbs)
        shards = self.shard_names(m)
        scheds, lats = [], []
        for x in shards:
            d, e = self.schedule_dir(m, b, x), self.estimate_dir(m, b, x)
            if kind == "bounds":
                chunks = self.round_chunks(wc.round, m, b)
                scheds.append([f"{d}/bounds/r{wc.round}_c{c}.parquet" for c in chunks])
            elif kind == "ilp":  # the ILP solve of the wildcards (ilp | deep | certify)
                chunks = self.ilp_chunks(wc.round, m, b, wc.solve)
                scheds.append([f"{d}/{wc.solve}/r{wc.round}_c{c}.parquet" for c in chunks])
            elif kind == "blind":
                chunks = ["blind"]
                scheds.append([f"{d}/blind.parquet"])
            elif kind == "chunk":
                chunks = [wc.chunk]
                scheds.append([f"{d}/{wc.chunk}.parquet"])
            else:
                raise AssertionError(f"unknown placement kind {kind!r}")
            if kind in ("bounds", "ilp"):
                lats.append([f"{e}/r{wc.round}_c{c}.parquet" for c in chunks])
            else:
                lats.append([f"{e}/{c}.parquet" for c in chunks])
        return shards, scheds, lats

    def place_inputs(self, kind: str):
        """Input function of a placement rule: layers per width, schedules, space (and, when the
        megatron model prices selective recomputation, the ops and operator latencies)."""

        def inputs(wc) -> dict:
            shards, scheds, lats = self._place_tables(wc, kind)
            dirs = [self.trace_dir(wc.model, wc.mbs, x) for x in shards]
            out = {
                "layers": [f"{d}/layers.parquet" for d in dirs],
                "schedules": [f for fs in scheds for f in fs],
                "space": self.space,
            }
            if self.needs_latencies:
                out["ops"] = [f"{d}/ops.parquet" for d in dirs]
                out["latencies"] = [f for fs in lats for f in fs]
            return out

        return inputs

    def _place_args(self, wc, kind: str) -> list[str]:
        _, scheds, lats = self._place_tables(wc, kind)
        argv = [
            "place",
            "--model",
            wc.model,
            *self._shard_args(wc.model, wc.mbs),
            "--schedules",
            *(",".join(fs) for fs in scheds),
            "--microbatch",
            str(wc.mbs),
            "--space",
            self.space,
        ]
        if self.needs_latencies:
            argv += ["--latencies", *(",".join(fs) for fs in lats)]
        return argv

    def place_commands(self, kind: str):
        """Param function of a batched placement rule: one `phaze place` command line per HBM x
        tier, run by `phaze search batch` in one process (one job per model x microbatch x
        round: the placements are fast, interpreter start-up is not)."""

        def commands(wc) -> list[str]:
            if kind == "ilp":
                tiers = SOLVE_TIERS[wc.solve]
            else:
                tiers = BOUND_TIERS if kind == "bounds" else BLIND_TIERS
            base = self._place_args(wc, kind)
            cmds = []
            for h in self.hbm_gib:
                d = self.place_dir(wc.model, h, wc.mbs)
                for tier, column in tiers:
                    name = "blind" if kind == "blind" else f"r{wc.round}_{tier}"
                    argv = [
                        *base,
                        "--hbm-gib",
                        gib_str(h),
                        "--latency-column",
                        column,
                        "--out",
                        f"{d}/{name}.parquet",
                    ]
                    cmds.append(shlex.join(argv))
            return cmds

        return commands

    def place_chunk_args(self, wc) -> list[str]:
        """Arguments of the stand-alone rule place (one chunk, one HBM)."""
        return self._place_args(wc, "chunk")[1:] + ["--hbm-gib", wc.hbm]

    # --- placement-blind baseline --------------------------------------------------------------
    def search_blind_trace(self, wc) -> str:
        return self.trace_dir(wc.model, self.blind_mbs, BLIND_SHARD)

    def search_blind_inputs(self, wc) -> dict[str, str]:
        d = self.search_blind_trace(wc)
        return {n: f"{d}/{n}.parquet" for n in ("ops", "layers")} | {"space": self.space}


# The checkpoints' output paths (rules/search.smk names the same files), for the Sweep that
# builds the jobs' inputs and for FileCheckpoints, which reads them back inside a job.
def plan_file(results: str) -> str:
    """Checkpoint search_plan's output: the architecture chunks."""
    return f"{results}/arch/chunks.parquet"


def round_select_file(results: str, r) -> str:
    """Checkpoint search_select's selection of round r."""
    return f"{results}/search/r{int(r)}/select.parquet"


def round_state_file(results: str, r) -> str:
    """Checkpoint search_select's state of round r."""
    return f"{results}/search/r{int(r)}/state.json"


def round_prune_dir(results: str, r, solve: str) -> str:
    """Checkpoint search_prune's output directory of round r and one solve tier."""
    return f"{results}/search/r{int(r)}/{solve}"


class FileCheckpoints:
    """Snakemake's ``checkpoints`` as a job's own process sees them: the outputs of the search's
    finished checkpoints under ``results`` (a step's manifest is built inside its job, from the
    same Sweep functions that gave the job's inputs; a missing output is an error)."""

    def __init__(self, results: str = RESULTS):
        r = results
        self.search_plan = _DoneCheckpoint(lambda: [plan_file(r)])
        self.search_select = _DoneCheckpoint(
            lambda round: _Wildcards(
                select=round_select_file(r, round), state=round_state_file(r, round)
            )
        )
        self.search_prune = _DoneCheckpoint(lambda round, solve: [round_prune_dir(r, round, solve)])


class _DoneCheckpoint:
    def __init__(self, outputs_of):
        self._outputs_of = outputs_of

    def get(self, **wc):
        out = self._outputs_of(**wc)
        paths = out if isinstance(out, list) else list(vars(out).values())
        for path in paths:
            if not os.path.exists(path):
                raise PhazeError(f"search checkpoint output missing: {path} (run the workflow)")
        return _Wildcards(output=out)


def step_manifest(
    config: dict, step: str, round: int | None = None, solve: str = "ilp", results=RESULTS
) -> dict:
    """A search step's manifest from a validated config and the results on disk."""
    return Sweep(config, FileCheckpoints(results)).step_manifest(step, round, solve)


class _Wildcards:
    """Attribute access like Snakemake's wildcards, for calls from inside this module."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _schedule_record(path: str, model: str, mbs, tp: int, tier: str) -> dict:
    return {"path": path, "model": model, "microbatch": int(mbs), "tp": int(tp), "tier": tier}


#: the placement-blind baseline's shard: one accelerator holds the whole model
BLIND_SHARD = "tp1"


def shard_name(tp: int, ep: int = 1, etp: int | None = None) -> str:
    """The path name of one rank's shard: ``tp{tp}``, with ``_ep{ep}`` at ep > 1 and ``_etp1``
    for whole experts (etp = 1 at tp > 1)."""
    whole = etp is not None and etp != tp
    return f"tp{tp}" + (f"_ep{ep}" if ep > 1 else "") + ("_etp1" if whole else "")


def parse_shard(name: str) -> tuple[int, int, int]:
    """(tp, ep, etp) of a shard name (`shard_name`)."""
    base, whole, _ = name.partition("_etp1")
    tp, _, ep = base.removeprefix("tp").partition("_ep")
    return int(tp), int(ep or 1), 1 if whole else int(tp)


def _paths(doc: dict) -> list[str]:
    return [e["path"] for entries in doc.values() for e in entries]
