"""`python -m phaze <stage> ...`: one subcommand per stage.

Each stage module exposes ``add_arguments(parser)`` and ``run(args) -> int``. Modules are imported
lazily so that `phaze place` does not pay for importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from phaze.errors import PhazeError
from phaze.io.atomic import check_writable_dir

# subcommand -> (module, one-line help)
STAGES: dict[str, tuple[str, str]] = {
    "trace": ("phaze.trace.cli", "trace a model into operator/edge/layer tables"),
    "arch": ("phaze.arch.cli", "enumerate the accelerator architecture space"),
    "estimate": ("phaze.estimate.cli", "per-operator latency on each core configuration"),
    "schedule": ("phaze.schedule.cli", "per-layer operator scheduling (ILP)"),
    "place": ("phaze.place.cli", "pipeline/data/tensor-parallel placement"),
    "search": ("phaze.search.cli", "architecture search, baselines and summary tables"),
    "report": ("phaze.report.cli", "plots and HTML report"),
    "evaluate": ("phaze.fidelity.evaluate_cli", "evaluate a given parallel strategy"),
    "optimize": ("phaze.fidelity.optimize_cli", "the fastest parallel strategy on a GPU preset"),
    "validate": ("phaze.fidelity.validate_cli", "validate against published training runs"),
}


class _Parser(argparse.ArgumentParser):
    """Usage errors as ONE line on stderr and exit code 2, like every other bad input."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def one_line(text: str) -> str:
    """A message on one line: a library's multi-line message (pydantic, argparse) joined."""
    parts = [part.strip() for part in str(text).splitlines() if part.strip()]
    return "; ".join(parts).replace(":; ", ": ")


def check_outputs(args: argparse.Namespace) -> None:
    """Every output path of a command (``--out``, ``--out-dir``, ``--export-instance``) where it
    can be written, before the stage works: a read-only place is one line at once, not after the
    work (``phaze.io.atomic.check_writable_dir``)."""
    for name in ("out", "out_dir", "export_instance"):
        value = getattr(args, name, None)
        if isinstance(value, str) and value:
            path = Path(value)
            check_writable_dir(path if path.is_dir() or name == "out_dir" else path.parent)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="phaze", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="stage", metavar="STAGE")
    sub.required = True
    for name, (module_name, help_text) in STAGES.items():
        module = importlib.import_module(module_name)  # a missing stage is a broken install
        sp = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sp)
        sp.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, its one line already printed)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        check_outputs(args)
        return int(args._run(args) or 0)
    except PhazeError as exc:
        print(f"phaze {args.stage}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"phaze {args.stage}: interrupted", file=sys.stderr)
        return 130
