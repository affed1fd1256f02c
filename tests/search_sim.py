"""The search's round loop on synthetic values, and its brute force, for the search tests.

Each component (model, HBM, microbatch, devices, arch) has a true optimum ``t`` (the placement on
the optimum schedules, unknown to the search) and, per tier, what that tier would report: the ILP
schedule's value ``v`` ≤ t, its proven bound ``ihi`` ≥ t, the list schedule's ``lo`` ≤ v, the
bound tier's ``hi`` ≥ t, the space bound ``sb`` ≥ hi; the deep tier ``dv`` / ``dhi`` nests
inside the ILP tier's interval; the certify solve's bound ``chi`` ≥ t (its makespans' value
``cv`` = t, better than any scored tier's: recorded, never scored). ``simulate`` runs the
workflow's rounds (select, bound tier, ILP selection, ILP tier, deep, certify) on these values;
``brute`` knows every tier of every component.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from phaze.search.dominance import edges_of, scope_edges
from phaze.search.plan import make_plan
from phaze.search.rounds import select, solve_selection
from phaze.search.scores import COMPONENT_KEY, SearchSettings, components

MODELS = ["m1", "m2"]
MBS = [1, 2]
TIER_COLUMN = {
    "ub": "hi",
    "lo": "lo",
    "ilp": "v",
    "ilp_ub": "ihi",
    "deep": "dv",
    "deep_ub": "dhi",
    "certify": "cv",
    "certify_ub": "chi",
}


def truth_table(rng, n_archs, n_hbm=1, infeasible_frac=0.1, space_slack=0.2) -> pd.DataFrame:
    rows = []
    for m, h, b, a in itertools.product(MODELS, range(n_hbm), MBS, range(n_archs)):
        v = float(rng.choice([rng.uniform(1, 10), np.round(rng.uniform(1, 10))]))
        infeasible = rng.random() < infeasible_frac
        lo = v * (1 - rng.uniform(0, 0.15)) if rng.random() < 0.8 else v
        hi = v * (1 + rng.uniform(0, 0.3)) if rng.random() < 0.8 else v
        ihi = v * (1 + rng.uniform(0, 0.05)) if rng.random() < 0.7 else hi
        t = v + rng.uniform(0, 1) * (min(hi, ihi) - v)
        if rng.random() < 0.3:
            dv = dhi = t
        else:
            dv = v + rng.uniform(0, 1) * (t - v) if rng.random() < 0.7 else v
            dhi = t + rng.uniform(0, 1) * (min(hi, ihi) - t) if rng.random() < 0.7 else ihi
        sb = hi * (1 + rng.uniform(0, space_slack)) if rng.random() < 0.8 else hi
        chi = t if rng.random() < 0.3 else t + rng.uniform(0, 1) * (min(hi, ihi) - t)
        vals = {"v": v, "lo": lo, "hi": hi, "ihi": ihi, "t": t, "dv": dv, "dhi": dhi, "sb": sb}
        vals.update(chi=chi, cv=t)
        if infeasible:  # memory does not depend on latencies: infeasible at every tier
            vals = dict.fromkeys(vals, np.nan)
        rows.append(
            {
                "model": m,
                "hbm_capacity_bytes": (h + 1) * 2**30,
                "microbatch": b,
                "devices": 64,
                "arch": f"a{a}",
                **vals,
            }
        )
    return pd.DataFrame(rows)


def random_plan(rng, n_archs, round_buckets, presets=None) -> pd.DataFrame:
    areas = np.round(rng.uniform(1, 3, n_archs), 1)  # ties: several archs per bucket
    presets = presets or [""] * n_archs
    return make_plan(
        pd.DataFrame(
            {"arch": [f"a{i}" for i in range(n_archs)], "area_mm2": areas, "preset": presets}
        ),
        0.1,
        round_buckets,
        3,
    )


def place_rows(truth: pd.DataFrame, tier: str) -> pd.DataFrame:
    col = TIER_COLUMN[tier]
    df = truth[COMPONENT_KEY].copy()
    df["tier"] = tier
    df["throughput_seq_s"] = truth[col].to_numpy()
    df["feasible"] = truth[col].notna().to_numpy()
    return df


def space_rows(truth: pd.DataFrame) -> pd.DataFrame:
    df = truth[COMPONENT_KEY].copy()
    df["throughput_upper_seq_s"] = truth["sb"].to_numpy()
    if "dominated_by" in truth.columns:
        df["dominated_by"] = truth["dominated_by"].to_numpy()
    return df


def with_dominance(truth: pd.DataFrame, rng, p_edge: float = 0.3) -> pd.DataFrame:
    """``truth`` with dominance steps (column ``dominated_by``): random steps from each arch to
    archs of larger id, per model and microbatch (a step of one may be missing in another), and
    every value that would contradict them lowered: the true optimum ``t`` to the smallest ``t``
    over the archs dominating it (through chains), the achieved values (``v``, ``lo``, ``dv``)
    below it. The upper bounds stay as drawn (each still at least its own ``t``). Memory does not
    depend on latencies: where nothing fits a dominating arch, nothing fits the arch either."""
    n = truth["arch"].nunique()
    out = []
    for _, grp in truth.groupby(["model", "microbatch"], sort=False):
        ups = {x: [y for y in range(x + 1, n) if rng.random() < p_edge] for x in range(n)}
        text = {f"a{x}": ",".join(f"a{y}" for y in ys) for x, ys in ups.items()}
        for _, g in grp.groupby(["hbm_capacity_bytes", "devices"], sort=False):
            g = g.sort_values("arch", key=lambda a: a.str[1:].astype(int)).copy()
            t = g["t"].to_numpy(float).copy()
            for x in range(n - 1, -1, -1):  # larger ids first: their t is final
                for y in ups[x]:
                    t[x] = np.minimum(t[x], t[y])  # NaN (nothing fits) passes down
            gone = np.isnan(t)
            cols = ["v", "lo", "hi", "ihi", "dv", "dhi", "sb", "chi", "cv"]
            g.loc[gone, cols] = np.nan
            v = np.fmin(g["v"].to_numpy(float), t)
            g["t"] = t
            g["v"] = v
            g["lo"] = np.fmin(g["lo"].to_numpy(float), v)
            g["dv"] = np.clip(g["dv"].to_numpy(float), v, t)
            g["cv"] = t
            g["dominated_by"] = g["arch"].map(text)
            out.append(g)
    return pd.concat(out).sort_index()


def _pick(truth: pd.DataFrame, sel: pd.DataFrame) -> pd.DataFrame:
    idx = pd.MultiIndex.from_frame(truth[["model", "microbatch", "arch"]])
    want = pd.MultiIndex.from_frame(
        sel[["model", "microbatch", "arch"]].astype({"microbatch": int})
    )
    return truth[idx.isin(want)]


class Run:
    """The outcome of :func:`simulate`: components known at the end, rounds, work counts."""

    def __init__(self, comp, rounds, n_bound, n_ilp, n_deep, n_certify, known, walk_completed):
        self.comp, self.rounds = comp, rounds
        self.n_bound, self.n_ilp, self.n_deep = n_bound, n_ilp, n_deep
        self.n_certify = n_certify
        self.known = known
        self.walk_completed = walk_completed


def simulate(
    truth: pd.DataFrame,
    plan: pd.DataFrame,
    s: SearchSettings,
    pinned: tuple[str, ...] = (),
    max_rounds: int = 500,
    space: pd.DataFrame | None = None,
) -> Run:
    """The workflow's round loop on the synthetic values (every component's space bound known
    from the start)."""
    sb = space_rows(truth) if space is None else space
    known: list[pd.DataFrame] = []
    final = s.final_tier

    def comp_of():
        place = pd.concat(known) if known else place_rows(truth.iloc[:0], "lo")
        return components(place, final, sb, edges_of(sb))

    n_bound = n_ilp = n_deep = n_certify = 0
    completed = -1
    r = 0
    for r in range(max_rounds):
        before = comp_of()
        sel, pic = select(before, plan, r, s, MODELS, completed, pinned, scope_edges(edges_of(sb)))
        visit, prior = pic["walk_visit"], pic["walk_states"]
        completed = visit if visit is not None else pic["walk_completed"]
        if sel.empty:
            break
        n_bound += len(sel)
        cur = _pick(truth, sel)
        known += [place_rows(cur, "ub"), place_rows(cur, "lo")]
        ilp = solve_selection(comp_of(), plan, s, MODELS, visit, prior, sel, "ilp", pinned)
        n_ilp += len(ilp)
        solved = _pick(truth, ilp)
        known += [place_rows(solved, "ilp"), place_rows(solved, "ilp_ub")]
        if s.deepen_node_limit:
            ilp_now = comp_of()
            done = ilp_now[ilp_now["level"] >= 2][["model", "microbatch", "arch"]]
            cand = sel.merge(done, on=["model", "microbatch", "arch"])
            deep = solve_selection(ilp_now, plan, s, MODELS, visit, prior, cand, "deep", pinned)
            n_deep += len(deep)
            d = _pick(truth, deep)
            known += [place_rows(d, "deep"), place_rows(d, "deep_ub")]
        if s.certifies:
            now = comp_of()
            done = now[now["level"] >= s.final_level][["model", "microbatch", "arch"]]
            cand = sel.merge(done.drop_duplicates(), on=["model", "microbatch", "arch"])
            cert = solve_selection(now, plan, s, MODELS, visit, prior, cand, "certify", pinned)
            n_certify += len(cert)
            c = _pick(truth, cert)
            known += [place_rows(c, "certify"), place_rows(c, "certify_ub")]
    else:
        raise AssertionError(f"the search did not end within {max_rounds} rounds")
    return Run(comp_of(), r, n_bound, n_ilp, n_deep, n_certify, known, completed)


def brute(truth: pd.DataFrame, s: SearchSettings) -> pd.DataFrame:
    """Every component at every tier (the final tier's values are the reference)."""
    tiers = ("ub", "lo", "ilp", "ilp_ub") + (("deep", "deep_ub") if s.deepen_node_limit else ())
    tiers += ("certify", "certify_ub") if s.certifies else ()
    everything = pd.concat([place_rows(truth, t) for t in tiers])
    return components(everything, s.final_tier, space_rows(truth))
