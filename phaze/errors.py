"""The one exception type the CLI turns into exit code 2 and a single line on stderr."""


class PhazeError(Exception):
    """Bad input or an unrecoverable condition the user can act on (unknown model, malformed
    config, infeasible memory, solver failure). The message must name the problem."""
