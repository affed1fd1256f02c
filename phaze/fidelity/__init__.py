"""Fidelity: evaluation of a given parallel strategy on GPU-shaped presets with modern pipeline
schedules, and validation against published Megatron-LM runs. The network (ring collectives and
point-to-point on a two-level network, Megatron's scatter/gather) is the shared
:mod:`phaze.network`.

Modules (pure Python unless noted):

* ``pipeline`` — ``PipelineSchedule``: 1F1B and interleaved 1F1B (bubble, traffic, in-flight
  activations; invalid interleaving rejected).
* ``memory``   — Korthikanti et al. 2022 activation bytes per block (none / selective / full
  recomputation, sequence parallelism).
* ``strategy`` — ``Strategy``: a given (N, t, p, b, G, V, recompute, SP, DDP) and Megatron's rank
  layout.
* ``compute``  — per-layer kernel times of one rank from the shared trace and cost model
  (imports pandas/numpy; the trace imports torch).
* ``evaluate`` — ``evaluate_strategy(spec, strategy, preset, ...)``: the iteration time, FLOPs,
  MFU, peak memory and breakdown.
* ``validate`` — Megatron-LM Table 1 (``data/megatron_narayanan2021_table1.csv``).

CLIs: ``python -m phaze evaluate`` (``evaluate_cli``) and ``python -m phaze validate``
(``validate_cli``).
"""
