"""The early-stop test, defined precisely.

The search visits area buckets 0, 1, 2, … (largest area first). Let ``m_j`` be the best score
found *inside* bucket j (``-inf`` when no architecture in it is feasible) and
``R_j = max(m_0, …, m_j)`` the best score found so far. With ``patience = P``:

* ``running_best`` (the default): stop after bucket j when j ≥ P−1 and
  ``R_{j-P+1} ≥ R_{j-P+2} ≥ … ≥ R_j`` — since R never decreases this says the last P−1 buckets
  did not improve on the best found before them. It depends only on R, which exact pruning
  determines exactly (a pruned architecture cannot beat the best proven so far), so the stop point
  with pruning equals the stop point of solving every ILP.
* ``bucket_best`` (upstream's ``get_next_acc_config``): stop after bucket j when j ≥ P−1 and
  ``m_{j-P+1} ≥ m_{j-P+2} ≥ … ≥ m_j``. It needs every bucket's own best exactly, so the workflow
  disables pruning under this rule.

Upstream needs at least P visited buckets before it may stop; so do both rules here. Bucket j is
still visited in full (the test runs after it), i.e. the search's answer covers buckets 0…j.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from phaze.errors import PhazeError

STOP_RULES = ("running_best", "bucket_best")


def stop_bucket(
    bucket_best: Sequence[float], patience: int, rule: str = "running_best"
) -> int | None:
    """Index of the bucket after which the search stops, or ``None`` if it never stops within
    the given buckets. ``bucket_best[j]`` is ``m_j`` (use ``-inf``/NaN for "nothing feasible")."""
    if rule not in STOP_RULES:
        raise PhazeError(f"unknown search.stop_rule {rule!r} (choose from {', '.join(STOP_RULES)})")
    if patience < 2:
        raise PhazeError(f"search.patience must be >= 2, got {patience}")
    m = np.asarray(bucket_best, dtype=float)
    m = np.where(np.isnan(m), -np.inf, m)
    seq = np.maximum.accumulate(m) if rule == "running_best" and len(m) else m
    for j in range(patience - 1, len(seq)):
        window = seq[j - patience + 1 : j + 1]
        if np.all(window[:-1] >= window[1:]):
            return j
    return None
