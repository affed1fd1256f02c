"""Stage 4, ``python -m phaze schedule``: per-layer operator scheduling on n_tc tensor cores and
n_vc vector cores (upstream Phaze's ILP, solved exactly where cheap and with proven bounds where not).

Modules: ``instance`` (the instance and its DAG facts), ``bounds`` (cheap lower bounds),
``listsched`` (list scheduling, replay, verification), ``ilp`` (Pyomo + SCIP model in a
watchdog-guarded worker), ``solve`` (decomposition, cache, the pipeline: ``Scheduler``),
``tables`` (instances from trace/estimate tables and from JSON), ``stage`` and ``cli``. See
docs/schedule.md.
"""

from phaze.schedule.instance import Instance, make_instance  # noqa: F401
from phaze.schedule.solve import Options, Result, Scheduler  # noqa: F401
