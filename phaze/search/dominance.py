"""Dominance between architectures: an architecture with more of one resource and nothing else
changed is at least as fast (docs/search.md, "Dominance").

Architecture ``Y`` *dominates* ``X`` for a model and microbatch when ``Y`` equals ``X`` in every
column of the space except one of :data:`AXES` (and the area and peak rate that follow from it),
has at least as much of that resource, and every operator of every traced width of that model and
microbatch has a latency on ``Y`` no larger than on ``X`` (on one core and on all cores; checked
value by value when the space bound is computed, never assumed). Then ``Y``'s optimum is at least
``X``'s, whatever the tier:

* a schedule of a layer on ``X`` is a schedule on ``Y`` with the same start times: durations
  shrink, so every precedence still holds and every core is busy for a subset of the time it was;
  an operator on all cores of ``X`` runs on all cores of ``Y`` over a shorter interval in which no
  other operator of its core type ran; an operator on one core keeps its core. The makespan does
  not grow, so each layer's optimum on ``Y`` is at most ``X``'s;
* the placement's step time is non-decreasing in every layer time, and its memory, network and
  constants do not depend on the architecture inside a family (same preset, same cost-model
  overrides), so the best placement of ``X`` priced on ``Y`` is no slower.

Hence ``opt(X) <= opt(Y) <= hi(Y)`` for every component (model, HBM, microbatch, devices), and
``hi(X)`` may be lowered to the smallest ``hi`` of the architectures that dominate it, through
chains of such steps (:func:`close_bounds`). Only steps to the next larger value of one axis are
recorded; longer steps follow by the chain.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from phaze.errors import PhazeError

#: the resources one step of dominance may grow (tensor cores, vector cores, global buffer)
AXES = ("n_tc", "n_vc", "glb_bytes")
#: space columns that follow from the others (not part of an architecture's identity)
DERIVED = ("arch", "area_mm2", "peak_flops")
#: relative slack of the consistency check hi(X) >= ach(X) after closure (float rounding only)
CHECK_RTOL = 1e-9


def _identity(space: pd.DataFrame, drop: tuple[str, ...]) -> np.ndarray:
    """Group ids of the rows of ``space`` that agree on every column but ``DERIVED`` and
    ``drop`` (NaN and empty text compare equal to themselves)."""
    cols = [c for c in space.columns if c not in DERIVED and c not in drop]
    if not cols:
        return np.zeros(len(space), dtype=np.int64)
    keys = space[cols].astype(str)
    return keys.groupby(cols, sort=False, dropna=False).ngroup().to_numpy(np.int64)


def families(space: pd.DataFrame) -> np.ndarray:
    """Family id per architecture: the rows that differ at most in :data:`AXES` (a dominance step
    never leaves its family)."""
    return _identity(space, AXES)


def candidate_steps(space: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) row positions of ``space``: ``y`` is ``x`` with the next larger value of one axis
    and every other column equal. Candidates only: :func:`verified` checks the latencies."""
    xs, ys = [], []
    for axis in AXES:
        if axis not in space.columns:
            continue
        gid = _identity(space, (axis,))
        val = space[axis].to_numpy(float)
        order = np.lexsort((val, gid))
        g, v = gid[order], val[order]
        nxt = (g[1:] == g[:-1]) & (v[1:] > v[:-1])
        xs.append(order[:-1][nxt])
        ys.append(order[1:][nxt])
    if not xs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(xs), np.concatenate(ys)


def verified(
    x: np.ndarray, y: np.ndarray, latencies: list[np.ndarray], counts: dict[str, np.ndarray]
) -> np.ndarray:
    """Mask of the steps (x, y) whose every latency array (archs × ops) is no larger on ``y``
    than on ``x`` and whose core counts (``counts``: name -> per-arch array) are no smaller."""
    ok = np.ones(len(x), dtype=bool)
    for c in counts.values():
        ok &= c[y] >= c[x]
    for lat in latencies:
        if lat.shape[1] == 0 or not ok.any():
            continue
        ok &= np.all(lat[y] <= lat[x], axis=1)
    return ok


def joined(ups: list[list[str]]) -> list[str]:
    """The ``dominated_by`` text of each architecture: its dominating neighbours, comma-joined."""
    return [",".join(sorted(u)) for u in ups]


def edges_of(bounds: pd.DataFrame) -> pd.DataFrame:
    """The dominance steps of the space bounds (column ``dominated_by``): one row per (model,
    microbatch, arch, up) — ``up`` dominates ``arch`` for that model and microbatch. Empty when
    the bounds carry none."""
    cols = ["model", "microbatch", "arch", "up"]
    if bounds.empty or "dominated_by" not in bounds.columns:
        return pd.DataFrame(columns=cols)
    d = bounds[["model", "microbatch", "arch", "dominated_by"]].drop_duplicates(
        ["model", "microbatch", "arch"]
    )
    d = d[d["dominated_by"].fillna("").astype(str) != ""]
    if d.empty:
        return pd.DataFrame(columns=cols)
    # split in Arrow: a list of Python strings per row would cost several times the table
    text = pa.array(d["dominated_by"].astype(str), type=pa.string())
    parts = pc.split_pattern(text, ",")
    parent = pc.list_parent_indices(parts).to_numpy()
    out = pd.DataFrame(
        {
            "model": d["model"].take(parent).reset_index(drop=True),
            "microbatch": d["microbatch"].to_numpy().astype("int64")[parent],
            "arch": d["arch"].take(parent).reset_index(drop=True),
            "up": pc.list_flatten(parts).to_pandas(),
        }
    )
    return out[cols]


def scope_edges(edges: pd.DataFrame) -> pd.DataFrame:
    """The steps that hold for a whole search: per model (column ``scope``) those recorded for
    every microbatch of the model, and for ``"*"`` (Phaze-Common) those recorded for every model
    and microbatch. Columns scope, arch, up."""
    cols = ["scope", "arch", "up"]
    if edges.empty:
        return pd.DataFrame(columns=cols)
    n_mbs = edges.groupby("model")["microbatch"].nunique()
    per = edges.groupby(["model", "arch", "up"], sort=False).size().rename("n").reset_index()
    per = per[per["n"].to_numpy() == n_mbs.reindex(per["model"]).to_numpy()]
    n_all = len(edges[["model", "microbatch"]].drop_duplicates())
    both = edges.groupby(["arch", "up"], sort=False).size().rename("n").reset_index()
    common = both[both["n"].to_numpy() == n_all].assign(scope="*")
    return pd.concat(
        [per.rename(columns={"model": "scope"})[cols], common[cols]], ignore_index=True
    )


def _arrow(col) -> pa.Array:
    a = pa.array(pd.Series(col).reset_index(drop=True))
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


def _codes(first, *others) -> list[np.ndarray]:
    """Integer codes of the values of ``first`` (0..n−1, in order of first appearance), and of
    ``others`` in the same code space, where a value ``first`` lacks gets ``n`` (it matches no
    row of ``first``). Hashed in Arrow: the columns may hold every component of the space."""
    enc = pc.dictionary_encode(_arrow(first))
    n = len(enc.dictionary)
    out = [enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)]
    for col in others:
        c = pc.fill_null(pc.index_in(_arrow(col), value_set=enc.dictionary), n)
        out.append(c.to_numpy(zero_copy_only=False).astype(np.int64))
    return out


def _combine(*codes: np.ndarray) -> np.ndarray:
    """One int64 key per row from several code arrays (mixed radix: distinct rows, distinct
    keys)."""
    key = np.zeros(len(codes[0]), dtype=np.int64)
    for c in codes:
        key = key * (int(c.max(initial=-1)) + 1) + c
    return key


def _inverse(col) -> np.ndarray:
    """Codes 0..k−1 of a numeric column's values, in value order."""
    return np.unique(np.asarray(col), return_inverse=True)[1].astype(np.int64)


def close_bounds(wide: pd.DataFrame, edges: pd.DataFrame, hi: np.ndarray) -> np.ndarray:
    """``hi`` (per row of ``wide``, keyed by model, hbm_capacity_bytes, microbatch, devices, arch)
    lowered to the smallest bound of every architecture that dominates the row's, through chains
    of steps. A NaN (nothing fits) stays NaN and lends nothing to the archs below it.

    Dense: the bounds in one (cell × architecture) array, a cell being a (model, HBM,
    microbatch, devices) of the rows (every component of the space: no join on the text
    columns, no list of (row, dominating row) pairs); each (model, microbatch)'s steps lower its
    cells' columns together until nothing changes."""
    if edges.empty or wide.empty:
        return hi
    model, e_model = _codes(wide["model"], edges["model"])
    arch, e_arch, e_up = _codes(wide["arch"], edges["arch"], edges["up"])
    n_arch = int(arch.max()) + 1  # an edge's arch or up that no row has gets code n_arch
    mb = wide["microbatch"].to_numpy().astype(np.int64)
    e_mb = edges["microbatch"].to_numpy().astype(np.int64)
    key = _combine(model, _inverse(wide["hbm_capacity_bytes"]), _inverse(mb))
    key = _combine(key, _inverse(wide["devices"]))
    cells, first, cell = np.unique(key, return_index=True, return_inverse=True)
    del key
    own_nan = np.isnan(hi)
    # a chain passes through an arch where nothing fits (its NaN lends nothing, as +inf)
    h = np.full((len(cells), n_arch), np.inf)
    h[cell, arch] = np.where(own_nan, np.inf, hi.astype(float))
    # a chain passes only through components that exist (as the rows' own steps do)
    present = np.zeros((len(cells), n_arch), dtype=bool)
    present[cell, arch] = True
    cell_model, cell_mb = model[first], mb[first]
    known = (e_arch < n_arch) & (e_up < n_arch)
    e_model, e_mb, e_arch, e_up = e_model[known], e_mb[known], e_arch[known], e_up[known]
    for m, b in set(zip(e_model.tolist(), e_mb.tolist())):
        mine = (e_model == m) & (e_mb == b)
        cs = np.flatnonzero((cell_model == m) & (cell_mb == b))
        if not len(cs):
            continue
        order = np.argsort(e_arch[mine], kind="stable")
        x, y = e_arch[mine][order], e_up[mine][order]
        starts = np.flatnonzero(np.r_[True, x[1:] != x[:-1]])
        ux = x[starts]
        sub, here = h[cs], present[cs][:, ux]
        for _ in range(n_arch + 1):
            new = sub.copy()
            low = np.minimum(sub[:, ux], np.minimum.reduceat(sub[:, y], starts, axis=1))
            new[:, ux] = np.where(here, low, np.inf)
            if np.array_equal(new, sub):
                break
            sub = new
        else:
            raise AssertionError("dominance closure did not converge (a cycle of strict steps)")
        h[cs] = sub
    out = h[cell, arch]
    out[own_nan] = np.nan
    return out


def check_closed(
    wide: pd.DataFrame, hi: np.ndarray, ach: np.ndarray, among: np.ndarray | None = None
) -> None:
    """A closed upper bound below the same component's achieved value disproves a dominance step
    (its latencies were checked, so a modelling term outside them depends on the architecture):
    an error naming the component, never a silently wrong certificate. ``among``: a mask of the
    rows to check (default all)."""
    with np.errstate(invalid="ignore"):
        below = hi < ach * (1 - CHECK_RTOL)
    if among is not None:
        below &= among
    bad = np.flatnonzero(below)
    if len(bad):
        r = wide.iloc[bad[0]]
        raise PhazeError(
            f"dominance contradicted: {r['model']} b{int(r['microbatch'])} arch {r['arch']} "
            f"achieves {ach[bad[0]]:.6g} seq/s above the bound {hi[bad[0]]:.6g} of the "
            "architectures said to dominate it"
        )
