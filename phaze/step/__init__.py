"""The step-time model: one training iteration of a parallel strategy, priced from per-layer
quantities — the model the placement search optimises and `phaze evaluate` reports.

Modules (pure functions over per-layer quantities; no file I/O):

* ``strategy`` — `Strategy` (tp, pp, dp, cp, ep, microbatch, interleave, recompute, sequence
  parallelism, distributed optimizer, DDP mode, blocks per stage), Megatron's rank layout and
  `PipelineSchedule` (1F1B and interleaved 1F1B); impossible combinations give one-line reasons.
* ``layers`` — `LayerCost` (one layer on one tensor-parallel rank, per microbatch) and
  `ChainCost` (first layer, identical blocks, last layer), FLOP conventions.
* ``model`` — `StepConstants`, the network geometry of a layout (`Layout`), a chain on it
  (`PlacedChain`), the per-rank terms as functions of the blocks a rank holds (`StageTerms`) and
  `price` (iteration time, breakdown, memory, MFU).
* ``megatron_args`` — the Megatron-LM arguments that run a strategy, and its pipeline layout read back.
* ``simulate`` — an event simulation of 1F1B, the reference of the pipeline closed form.

The exact placement search over this model is `phaze.place.megatron`; docs/step.md describes it
all.
"""
