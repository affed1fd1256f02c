"""The Python side of the Snakemake workflow (the Snakefile and rules/*.smk hold rules only).

* :mod:`phaze.workflow.provenance` — ``code_version``, ``config_section`` (what rules put in
  ``params:`` so that a job re-runs exactly when its code or config changed) and
  ``snapshot_config`` (the merged config the stage CLIs read);
* :mod:`phaze.workflow.sweep` — :class:`Sweep`: the sweep's axes, the results layout, the search
  rounds read from the checkpoints, and the rules' input, param and manifest functions.
"""

from phaze.workflow.provenance import code_version, config_section, snapshot_config, snapshot_path
from phaze.workflow.sweep import Sweep, gib_str

__all__ = [
    "Sweep",
    "code_version",
    "config_section",
    "gib_str",
    "snapshot_config",
    "snapshot_path",
]
