"""The ILP's worker process: a long-lived solver process (Pyomo and SCIP imported once) running
`phaze.schedule.ilp.solve_once`, guarded by a wall-clock watchdog."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path

from phaze.errors import PhazeError
from phaze.schedule.ilp import IlpOutcome, solve_once
from phaze.schedule.instance import Instance
from phaze.schedule.listsched import Schedule


def _worker_main(read_fd: int, write_fd: int) -> None:
    import pyomo.environ  # noqa: F401  # deferred: pyomo, paid once per worker process
    from pyomo.contrib.solver.solvers.scip.scip_direct import ScipDirect  # noqa: F401  # deferred: SCIP

    rx = Connection(read_fd, writable=False)
    tx = Connection(write_fd, readable=False)
    while True:
        try:
            task = rx.recv()
        except EOFError:
            return
        if task is None:
            return
        try:
            *args, stages, end = task
            tx.send(("ok", solve_once(*args, end=end, **stages)))
        except Exception:  # noqa: BLE001 - reported to the parent, which raises
            tx.send(("error", traceback.format_exc()))


class SolverWorker:
    """A long-lived solver process (Pyomo imported once), talking over two private pipes. A solve
    that outlives its wall-clock budget kills the process (SCIP was seen to hang at 0 % CPU); the
    next solve starts a new one. A plain subprocess (not multiprocessing) so that neither the
    caller's ``__main__`` nor its threads are inherited."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._tx = self._rx = None
        self.restarts = 0

    def _ensure(self):
        if self._proc is not None and self._proc.poll() is None:
            return
        c_read, p_write = os.pipe()
        p_read, c_write = os.pipe()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"from phaze.schedule.ilp_worker import _worker_main; _worker_main({c_read}, {c_write})",
            ],
            pass_fds=(c_read, c_write),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=None,
        )
        os.close(c_read)
        os.close(c_write)
        self._tx = Connection(p_write, readable=False)
        self._rx = Connection(p_read, writable=False)

    def solve(
        self,
        inst: Instance,
        warm: Schedule,
        lb: float,
        time_limit_s: float,
        mip_gap: float,
        threads: int,
        watchdog_s: float,
        node_limit: int = 0,
        **stages,
    ) -> IlpOutcome:
        """``solve_once`` in the worker; ``stages`` are its ``mode_bound``, ``kicks``, ``full``."""
        self._ensure()
        t0 = time.perf_counter()
        end = time.monotonic() + time_limit_s  # the worker's clock (CLOCK_MONOTONIC) is ours
        try:
            self._tx.send(
                (inst, warm, lb, time_limit_s, mip_gap, threads, node_limit, 0, stages, end)
            )
            # SCIP stops itself at time_limit_s; the watchdog allows watchdog_s more (model
            # building, the worker's first imports) before it declares the solve hung
            if self._rx.poll(time_limit_s + watchdog_s):
                kind, payload = self._rx.recv()
                if kind == "ok":
                    return payload
                raise PhazeError(f"ILP solve failed inside the solver worker:\n{payload}")
            status = "watchdog"
        except (EOFError, BrokenPipeError, ConnectionResetError):
            status = "solver_died"
        self.kill()
        self.restarts += 1
        return IlpOutcome(status, None, None, None, 0.0, (), time.perf_counter() - t0)

    def kill(self):
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait(10)
        for c in (self._tx, self._rx):
            if c is not None:
                c.close()
        self._proc = self._tx = self._rx = None

    def close(self):
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._tx.send(None)
                self._proc.wait(5)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
