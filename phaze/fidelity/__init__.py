"""Fidelity: GPU-shaped presets — layer times summed from kernels over the shared trace and cost
model, priced by the step model (:mod:`phaze.step`) — one strategy (`evaluate`), the best one
(`optimize`), and the validation against published Megatron-LM runs. The network is the shared
:mod:`phaze.network`.

Modules:

* ``compute``  — per-layer kernel times of one rank from the shared trace and cost model, both
  sequence-parallel settings from one costing (imports pandas/numpy).
* ``evaluate`` — ``gpu_chains`` (the step model's chains of a model on a preset; the trace imports
  torch), ``evaluate_strategy`` (iteration time, FLOPs, MFU, memory, breakdown) and
  ``optimize_strategy`` (the exact search of :mod:`phaze.place.megatron`).
* ``validate`` — Megatron-LM Table 1 (``data/megatron_narayanan2021_table1.csv``).

CLIs: ``python -m phaze evaluate`` (``evaluate_cli``), ``python -m phaze optimize``
(``optimize_cli``) and ``python -m phaze validate`` (``validate_cli``).
"""
