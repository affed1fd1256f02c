"""What the search knows of each architecture: components, their tiers, and the searches' scores.

Vocabulary
----------
*component*: one placement result, keyed by ``COMPONENT_KEY`` (model, HBM, microbatch, cluster
size, arch); the placement axes (recompute, interleave, ...) are chosen inside it. A component is
known at one or more *tiers*; each tier is an upper bound on its throughput, an achievable
throughput, or both:

* ``space`` — the space bound (``phaze search bounds``): placement relaxed over every
  configuration on vectorised per-layer lower bounds, computed for every architecture of the
  space at once; an upper bound only (docs/search.md, "Bounds over the whole space");
* ``ub`` — placement on the schedule stage's per-layer *lower bounds*: an upper bound (the
  placement's time is at most that of any latencies above the bounds, with the achievable
  makespans as the DDP overlap's window, docs/step.md; memory does not depend on them);
* ``lo`` — placement on list-schedule makespans (real schedules): achievable;
* ``ilp`` / ``ilp_ub`` — placement on the ILP's makespans (achievable) and on its proven lower
  bounds (an upper bound);
* ``deep`` / ``deep_ub`` — the same on a deeper ILP (``search.deepen_node_limit``). More nodes
  never lengthen a schedule nor lower a bound, so the intervals nest;
* ``certify_ub`` — placement on the bounds of the certify solve (the final tier's limits with the
  split, ``search.certify_split_nodes``): an upper bound. Its placement on that solve's
  makespans (``certify``) is recorded but not scored: achieved values stay the final tier's, the
  solver effort every architecture and baseline gets alike.

``hi`` is the smallest upper bound known, ``ach`` the best achievable value known. A component's
*level* says how far it has been refined: 0 = space bound only, 1 = bound tier (``ub``, ``lo``),
2 = ILP tier, 3 = deep tier. The *final* tier (``deep`` when deepening is configured, else
``ilp``) is the reference: a component is ``exact`` once its final-tier value is known, its bounds
meet, or no placement fits (memory does not depend on latencies, so no schedule can make it fit).

*scores*: Phaze-Per-Model scores an architecture by one model's throughput; Phaze-Common by an
aggregate over the models of each model's best throughput over microbatch (software choices stay
free per model; an architecture infeasible for any model scores nothing, as upstream):

* ``mean`` — upstream's arithmetic mean of throughputs (sequences per second): the models with the
  highest sequences per second decide it;
* ``relative`` — the geometric mean over models of the throughput relative to a reference per
  model (the best throughput the search knows for that model): every model counts alike. The
  reference only scales the score, so the best architecture and every certificate are the same
  whatever reference is used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from phaze.config import from_section, schema_defaults
from phaze.errors import PhazeError
from phaze.search.dominance import check_closed, close_bounds

COMPONENT_KEY = ["model", "hbm_capacity_bytes", "microbatch", "devices", "arch"]
TIERS = ("space", "ub", "lo", "ilp", "ilp_ub", "deep", "deep_ub", "certify", "certify_ub")
#: tiers that bound a component's throughput from above, and tiers that hold a real schedule's
#: (scored: ``certify`` is not, see above)
UPPER = ("space", "ub", "ilp_ub", "deep_ub", "certify_ub")
ACHIEVABLE = ("lo", "ilp", "deep")
FINAL_TIERS = ("ilp", "deep")
#: the level a tier brings a component to (0 = space bound only); the certify solve takes only
#: components already at the final tier and leaves their level as it is
LEVEL = {
    "space": 0,
    "ub": 1,
    "lo": 1,
    "ilp": 2,
    "ilp_ub": 2,
    "deep": 3,
    "deep_ub": 3,
    "certify": 0,
    "certify_ub": 0,
}
COMMON_SCORES = ("relative", "mean")
MODES = ("global", "early_stop", "exhaustive")


_DEFAULT = schema_defaults()["search"]


@dataclass(frozen=True)
class SearchSettings:
    """The search's rules; the defaults are config/schema.yaml's (section ``search``)."""

    patience: int = _DEFAULT["patience"]
    stop_rule: str = _DEFAULT["stop_rule"]
    mode: str = _DEFAULT["mode"]  # global | early_stop | exhaustive
    prune: bool = _DEFAULT["prune"]
    deepen_node_limit: int = _DEFAULT["deepen_node_limit"]  # 0: no deep tier
    certify_split_nodes: int = _DEFAULT["certify_split_nodes"]  # 0: no certify solve
    gap: float = _DEFAULT["gap"]
    front_gap: float | None = _DEFAULT["front_gap"]  # None: the front is not refined for
    round_archs: int = _DEFAULT["round_archs"]
    common_score: str = _DEFAULT["common_score"]

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise PhazeError(f"search.mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("gap", "front_gap"):
            v = getattr(self, name)
            if v is None and name == "front_gap":
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1:
                raise PhazeError(f"search.{name} must be in [0, 1), got {v}")
        if self.common_score not in COMMON_SCORES:
            raise PhazeError(
                f"search.common_score must be one of {', '.join(COMMON_SCORES)}, "
                f"got {self.common_score!r}"
            )
        if self.round_archs < 1:
            raise PhazeError(f"search.round_archs must be >= 1, got {self.round_archs}")

    @classmethod
    def from_config(cls, search_cfg: dict) -> SearchSettings:
        """From a validated config section ``search`` (phaze.config.load_config)."""
        return from_section(cls, search_cfg)

    @property
    def final_tier(self) -> str:
        """The tier whose values are the reference (``exact``): ``deep`` when deepening."""
        return "deep" if self.deepen_node_limit > 0 else "ilp"

    @property
    def final_level(self) -> int:
        return LEVEL[self.final_tier]

    @property
    def certifies(self) -> bool:
        """A certify solve follows each round's last ILP solve (``certify_split_nodes`` > 0)."""
        return self.certify_split_nodes > 0

    @property
    def pruning(self) -> bool:
        # upstream's per-bucket rule needs every bucket's own best exactly: no pruning under it
        return self.prune and self.stop_rule == "running_best"

    @property
    def walk_stops(self) -> bool:
        """The area-ordered walk applies the stop rule (early_stop, and global mode's second
        answer); exhaustive walks every bucket."""
        return self.mode != "exhaustive"


def components(
    place: pd.DataFrame,
    final: str = "ilp",
    space: pd.DataFrame | None = None,
    edges: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Wide table, one row per component: per tier its throughput (NaN = unknown or infeasible),
    ``hi``, ``ach``, ``level``, ``exact``, ``led``.

    ``place`` is the concatenation of placement tables with an added ``tier`` column; ``space``
    (optional) the space bounds (``COMPONENT_KEY`` + ``throughput_upper_seq_s``), which may hold
    every architecture of the space: components known only there get level 0. ``edges``
    (optional, :func:`phaze.search.dominance.edges_of`): the dominance steps; ``hi`` is then the
    smallest bound of the component and of every architecture dominating it, and ``led`` says
    that it came from such an architecture (refining that one tightens this one)."""
    if final not in FINAL_TIERS:
        raise AssertionError(f"final tier must be one of {FINAL_TIERS}, got {final!r}")
    missing = [c for c in COMPONENT_KEY + ["tier", "throughput_seq_s"] if c not in place.columns]
    if missing:
        raise PhazeError(f"placement results lack columns {missing}")
    df = place[COMPONENT_KEY + ["tier", "throughput_seq_s"]].copy()
    if "feasible" in place.columns:
        df.loc[~place["feasible"].astype(bool).to_numpy(), "throughput_seq_s"] = np.nan
    bad = sorted(set(df["tier"]) - set(TIERS))
    if bad:
        raise PhazeError(f"unknown placement tiers {bad}")
    # only the (component, tier) pairs present: pivot_table(dropna=False) would add every
    # combination of the key's levels
    g = df.groupby(COMPONENT_KEY + ["tier"], sort=False)["throughput_seq_s"]
    wide = g.max().unstack("tier").reindex(columns=list(TIERS))
    present = g.size().unstack("tier").reindex(index=wide.index, columns=list(TIERS)).notna()
    del df, g
    level = np.zeros(len(wide), dtype=np.int64)
    for tier in TIERS:
        level = np.maximum(level, np.where(present[tier].to_numpy(), LEVEL[tier], 0))
    wide.columns.name = None
    wide = wide.reset_index()
    has = {t: present[t].to_numpy() for t in UPPER}
    if space is not None and len(space):
        # the placements' components on the space bounds' rows: the space bound joins their
        # own, and a component the space bounds lack is added (every row's values are computed
        # on the placements' rows, then spread over the space's: the space may hold every
        # component of the space, and most have no placement)
        at, rows, extra = _on_space(space, wide)
        sb = np.full(len(wide), np.nan)
        sb[at >= 0] = space["throughput_upper_seq_s"].to_numpy(float)[at[at >= 0]]
        wide["space"] = np.fmin(wide["space"].to_numpy(float), sb)
        has["space"] = has["space"] | (at >= 0)
    vals = _values(wide, has, level, final)
    if space is None or not len(space):
        out = wide[COMPONENT_KEY].copy()
        for name, v in vals.items():
            out[name] = v
    else:
        out = _spread(space, wide, at, rows, extra, vals)
    del wide
    own = out["hi"].to_numpy(float)
    hi = own
    if edges is not None and len(edges):
        hi = close_bounds(out, edges, own)
        with np.errstate(invalid="ignore"):
            lowered = hi < own
        check_closed(out, hi, out["ach"].to_numpy(float), among=lowered)
    level = out["level"].to_numpy()
    exact = out.pop("_exact").to_numpy(bool)
    certified = out.pop("has_certify").to_numpy(bool)
    out["hi"] = hi
    with np.errstate(invalid="ignore"):
        out["led"] = hi < own
    out["has_ilp"] = level >= LEVEL["ilp"]
    out["has_deep"] = level >= LEVEL["deep"]
    out["has_certify"] = certified
    # exactly known: a final-tier value, bounds that meet, or infeasible (NaN upper bound)
    with np.errstate(invalid="ignore"):
        out["exact"] = exact | (hi <= out["ach"].to_numpy(float)) | np.isnan(hi)
    return out


def _values(wide: pd.DataFrame, has: dict, level: np.ndarray, final: str) -> dict:
    """Per row of the placements' wide table: ``level``, ``ach``, the component's own ``hi``,
    whether the certify solve has run (``has_certify``) and the part of ``exact`` that does not
    depend on the dominance closure (``_exact``: a final-tier value, or the final level)."""
    # memory does not depend on latencies, so "nothing fits" (NaN) at one upper-bound tier holds
    # at every tier: hi is NaN then; the smallest bound otherwise; +inf with no bound at all
    hi = np.full(len(wide), np.inf)
    infeasible = np.zeros(len(wide), dtype=bool)
    for t in UPPER:
        v = wide[t].to_numpy(float)
        nan = np.isnan(v)
        infeasible |= has[t] & nan
        hi = np.where(has[t] & ~nan, np.minimum(hi, np.where(nan, np.inf, v)), hi)
    hi = np.where(infeasible, np.nan, hi)
    ach = np.full(len(wide), np.nan)
    for t in ACHIEVABLE:
        ach = np.fmax(ach, wide[t].to_numpy(float))
    return {
        "level": level,
        "ach": ach,
        "hi": hi,
        "has_certify": has["certify_ub"],
        "_exact": wide[final].notna().to_numpy() | (level >= LEVEL[final]),
    }


def _sorted_codes(big: pd.Series, small: pd.Series) -> tuple[np.ndarray, np.ndarray, int]:
    """Codes of ``big``'s and ``small``'s values in the sorted order of their union (code order =
    value order), and the number of values. Hashed in Arrow: ``big`` may hold every component."""
    a = pa.array(big.reset_index(drop=True))
    values = set(pc.unique(a).to_pylist()) | set(small.tolist())
    keys = pa.array(sorted(values), type=a.type)
    codes = [
        pc.index_in(a, value_set=keys).to_numpy(zero_copy_only=False).astype(np.int64),
        pc.index_in(pa.array(small.reset_index(drop=True), type=a.type), value_set=keys)
        .to_numpy(zero_copy_only=False)
        .astype(np.int64),
    ]
    return codes[0], codes[1], len(keys)


def _on_space(space: pd.DataFrame, wide: pd.DataFrame):
    """Where the placements' rows (``wide``) are among the space bounds' rows, as (``at``: the
    space row of each wide row, −1 where the space lacks it; ``rows``: the output's rows in
    ``COMPONENT_KEY`` order as positions in space rows followed by the wide rows the space
    lacks; ``extra``: those wide rows)."""
    key = np.zeros(len(space), dtype=np.int64)
    wkey = np.zeros(len(wide), dtype=np.int64)
    for c in COMPONENT_KEY:
        big, small, n = _sorted_codes(space[c], wide[c])
        key = key * n + big
        wkey = wkey * n + small
        del big, small
    at = _lookup_keys(key, wkey)
    extra = np.flatnonzero(at < 0)
    rows = np.argsort(np.r_[key, wkey[extra]], kind="stable")
    return at, rows, extra


def _lookup_keys(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Position in ``keys`` of each of ``wanted``; −1 where absent."""
    if len(keys) == 0:
        return np.full(len(wanted), -1, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    pos = np.minimum(np.searchsorted(keys[order], wanted), len(keys) - 1)
    return np.where(keys[order][pos] == wanted, order[pos], -1)


def _spread(space, wide, at, rows, extra, vals) -> pd.DataFrame:
    """The components table over the space bounds' rows and the placements' rows they lack
    (``rows``: :func:`_on_space`), each with its values: the placements' where it has any, the
    space bound alone (level 0) elsewhere."""
    n = len(space)
    cols = {}
    for c in COMPONENT_KEY:
        both = space[c].reset_index(drop=True)
        if len(extra):  # in the space's types (an empty placements table has untyped columns)
            both = pd.concat([both, wide[c].iloc[extra].astype(both.dtype)], ignore_index=True)
        cols[c] = both.take(rows).reset_index(drop=True)
        del both
    # where a wide row sits among the output rows
    src = np.full(n + len(extra), -1, dtype=np.int64)
    src[at[at >= 0]] = np.flatnonzero(at >= 0)
    src[n:] = extra
    src = src[rows]
    mine = src >= 0
    sb = np.r_[space["throughput_upper_seq_s"].to_numpy(float), np.full(len(extra), np.nan)]
    defaults = {
        # a component known only from the space bound: hi is that bound (NaN: nothing fits)
        "level": np.zeros(len(rows), dtype=np.int64),
        "ach": np.full(len(rows), np.nan),
        "hi": sb[rows],
        "has_certify": np.zeros(len(rows), dtype=bool),
        "_exact": np.zeros(len(rows), dtype=bool),
    }
    del sb
    for name, v in vals.items():
        d = defaults[name]
        d[mine] = v[src[mine]]
        cols[name] = d
    return pd.DataFrame(cols)


#: one walk search (area-ordered, upstream's): per model × HBM × microbatch × devices, and
#: Phaze-Common per HBM × devices × score
SEARCH_KEY = ["strategy", "common_score", "model", "hbm_capacity_bytes", "microbatch", "devices"]
VALUE_COLUMNS = ["hi", "ach", "exact", "has_ilp", "has_deep", "level", "led"]


def model_values(comp: pd.DataFrame) -> pd.DataFrame:
    """Per (model, HBM, devices, arch): the best over microbatch — ``hi`` / ``ach`` the largest
    (NaN-aware), ``exact`` when every microbatch is, ``level`` the least refined microbatch,
    ``led`` when a microbatch with the largest ``hi`` has it from a dominating architecture."""
    key = ["model", "hbm_capacity_bytes", "devices", "arch"]
    top = comp.groupby(key, sort=False, observed=True)["hi"].transform("max")
    led = comp["led"] if "led" in comp.columns else pd.Series(False, index=comp.index)
    comp = comp.assign(_led=led.astype(bool) & (comp["hi"] == top))
    g = comp.groupby(key, sort=False, observed=True)
    return g.agg(
        hi=("hi", "max"),
        ach=("ach", "max"),
        exact=("exact", "all"),
        has_ilp=("has_ilp", "all"),
        has_deep=("has_deep", "all"),
        level=("level", "min"),
        led=("_led", "any"),
    ).reset_index()


def model_references(comp: pd.DataFrame) -> dict[tuple, float]:
    """(model, HBM, devices) -> the best achievable throughput known, or before any, the largest
    finite upper bound: the reference of the ``relative`` score (any positive reference gives the
    same ranking and certificates)."""
    key = ["model", "hbm_capacity_bytes", "devices"]
    hi = comp["hi"].where(np.isfinite(comp["hi"].to_numpy(dtype=float)))
    refs = {k: float(v) for k, v in hi.groupby([comp[c] for c in key]).max().items() if v > 0}
    best = comp["ach"].groupby([comp[c] for c in key]).max()
    refs.update({k: float(v) for k, v in best.items() if v > 0})
    return refs


def aggregate(values: pd.DataFrame, models: list[str], kind: str, refs: dict) -> pd.DataFrame:
    """Phaze-Common's score per (HBM, devices, arch) from per-model ``values`` (columns model,
    hbm_capacity_bytes, devices, arch, hi, ach, exact, has_ilp, has_deep, level): ``mean`` or
    ``relative`` (module docstring); NaN unless every model of ``models`` has a value. The
    upper bound is the same aggregate of the upper bounds (both are non-decreasing in each
    model's value)."""
    if kind not in COMMON_SCORES:
        raise AssertionError(f"unknown common score {kind!r}")
    v = values[values["model"].isin(models)].copy()
    if kind == "relative":
        keys = pd.MultiIndex.from_tuples(
            list(refs) or [("", 0, 0)], names=["model", "hbm_capacity_bytes", "devices"]
        )
        table = pd.Series(list(refs.values()) or [np.nan], index=keys, dtype=float)
        ref = table.reindex(pd.MultiIndex.from_frame(v[["model", "hbm_capacity_bytes", "devices"]]))
        ref = ref.to_numpy(dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            v["hi"] = np.log(v["hi"].to_numpy(float) / ref)
            v["ach"] = np.log(v["ach"].to_numpy(float) / ref)
    n = len(models)
    g = v.groupby(["hbm_capacity_bytes", "devices", "arch"], sort=False, observed=True)
    out = g.agg(
        hi=("hi", "sum"),
        ach=("ach", "sum"),
        n_hi=("hi", "count"),
        n_ach=("ach", "count"),
        n=("model", "nunique"),
        exact=("exact", "all"),
        has_ilp=("has_ilp", "all"),
        has_deep=("has_deep", "all"),
        level=("level", "min"),
        led=("led", "all"),
    ).reset_index()
    full = out["n"].to_numpy() == n
    for col, cnt in (("hi", "n_hi"), ("ach", "n_ach")):
        x = out[col].to_numpy(float)
        ok = full & (out[cnt].to_numpy() == n) & np.isfinite(x)
        if kind == "mean":
            x = x / n
        else:
            x = np.exp(x / n)
        # an unbounded model (+inf upper bound) leaves the aggregate unbounded
        if col == "hi":
            unbounded = full & (out[cnt].to_numpy() == n) & np.isposinf(out[col].to_numpy(float))
            x = np.where(unbounded, np.inf, x)
            ok |= unbounded
        out[col] = np.where(ok, x, np.nan)
    out["exact"] = out["exact"] & full
    # led: every model's bound comes from a dominating architecture
    out["led"] = out["led"] & full
    out["exact"] |= (out["hi"] <= out["ach"]).fillna(False) | out["hi"].isna()
    return out.drop(columns=["n_hi", "n_ach", "n"])


def common_scores(
    comp: pd.DataFrame,
    models: list[str],
    kinds=COMMON_SCORES,
    refs: dict | None = None,
    values: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The walk's Phaze-Common searches: per (HBM, devices) and score kind, each arch's score
    from each model's best over microbatch (``values``: :func:`model_values`, if computed)."""
    values = model_values(comp) if values is None else values
    refs = model_references(comp) if refs is None else refs
    frames = []
    for kind in kinds:
        out = aggregate(values, models, kind, refs)
        out.insert(0, "strategy", "phaze-common")
        out.insert(1, "common_score", kind)
        out["model"], out["microbatch"] = "*", -1
        frames.append(out)
    return pd.concat(frames, ignore_index=True)


def all_scores(
    comp: pd.DataFrame, models: list[str], kinds=COMMON_SCORES, values: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Every walk search's score per arch (``SEARCH_KEY`` + arch + values)."""
    common = common_scores(comp, models, kinds, values=values)
    # column by column: the per-model rows are the components' own, copied once (the scores hold
    # every component of the space)
    n = len(comp)
    const = {"strategy": "phaze-per-model", "common_score": ""}
    cols = {}
    for c in SEARCH_KEY + ["arch", *VALUE_COLUMNS]:
        mine = pd.Series(const[c], index=pd.RangeIndex(n)) if c in const else comp[c]
        cols[c] = pd.concat([mine, common[c]], ignore_index=True)
    return pd.DataFrame(cols)


def upper_bound(upper_bounds: np.ndarray) -> float:
    """The largest proven upper bound among architectures; NaN bounds are infeasible
    architectures (no schedule makes them fit) and count as none (NaN if all are)."""
    finite = upper_bounds[~np.isnan(upper_bounds)]
    return float(finite.max()) if len(finite) else np.nan


def certified_gap(top: float, winner: float) -> float:
    """``top`` (:func:`upper_bound`; NaN: none feasible) / winner − 1, floored at 0."""
    if not np.isfinite(winner) or winner <= 0:
        return np.nan
    return max(0.0, (top if not np.isnan(top) else winner) / winner - 1.0)
