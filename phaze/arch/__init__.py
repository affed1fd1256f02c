"""The architecture space (``python -m phaze arch``) and its area model.

* ``phaze.arch.area``      parametric area model (mm²) and peak FLOP/s, numpy-vectorised;
* ``phaze.arch.calibrate`` fits the area constants to upstream's anchor areas;
* ``phaze.arch.presets``   ``load_preset(name)`` for ``config/presets/NAME.yaml``;
* ``phaze.arch.space``     ``build_space(config)`` -> the space table (sorted by area, largest first).
"""
