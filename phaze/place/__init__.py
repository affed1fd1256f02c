"""Placement stage: pipeline, data and tensor-parallel placement of one model on a cluster of
identical accelerators, under the step model (``place.model: megatron``: the exact search of
phaze.place.megatron over the placement axes, chains from the tables by phaze.place.chains) or
upstream's objective (``place.model: upstream``: an exact dynamic program, phaze.place.dp, over
the contiguous stages of the layer graph, phaze.place.graph).

Public API of the upstream objective:
* ``solve(graphs, rule, devices, microbatches, d_values, allreduce)`` — best placement over the
  tensor-parallel widths in ``graphs`` ({t: LayerGraph}); ``solve_width`` for one t.
* ``time_placement(...)`` — time and memory of a given placement (used for expert placements).
* ``phaze.place.upstream`` — upstream's JSON instances (``solve_instance``, ``load_instance``).
* ``phaze.place.tables`` — the table mode: layer/schedule/space tables to placement rows, under
  the objective of ``place.model`` (``phaze.place.objective``: ``objective_megatron``,
  ``objective_upstream``).
* ``PlaceNetwork`` (phaze.place.network) — a two-level network for the placement; pass it as
  ``AllReduce(mode="max", ..., network=...)`` and the same ``solve``/``time_placement`` cost
  pipeline transfers and all-reduces on the level they cross (Megatron's rank layout).
"""

from phaze.place.dp import (
    AllReduce,
    Placement,
    data_parallel_degrees,
    solve,
    solve_width,
    time_placement,
)
from phaze.place.graph import LayerGraph, StageRule, chain_graph
from phaze.place.network import PlaceNetwork

__all__ = [
    "AllReduce",
    "LayerGraph",
    "PlaceNetwork",
    "Placement",
    "StageRule",
    "chain_graph",
    "data_parallel_degrees",
    "solve",
    "solve_width",
    "time_placement",
]
