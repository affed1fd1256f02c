"""Stage 1, trace: Hugging Face transformer -> per-layer forward/backward operator graphs.

Public API (torch is imported only by the functions that need it):

* ``phaze.trace.models.get_model_spec(name_or_path)`` / ``list_models()``: the model registry.
* ``phaze.trace.tracer.trace_model(spec, microbatch, tp=1, seq=None, fuse=True)`` returns a
  ``Trace`` with the ``ops``, ``edges`` and ``layers`` DataFrames (schemas in phaze/io/tables.py).
* ``phaze.trace.capture.build_model(spec, num_blocks, tp, seq)``: the meta-device model the
  tracer records (used by the tests to cross-check against ``FlopCounterMode``).
"""
