"""Atomic output: write to a temporary file beside the target, then rename.

A crash or an interrupt therefore never leaves a half-written file under the final name, which
Snakemake (or a later stage) would take for done.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from phaze.errors import PhazeError


def ensure_dir(path: str | os.PathLike) -> Path:
    """Create the output directory ``path`` (and its parents); PhazeError if that is impossible
    (a file in the way, no permission)."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise PhazeError(f"cannot create the output directory {path}: {p} is a file")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PhazeError(
            f"cannot create the output directory {path}: {exc.strerror or exc}"
        ) from exc
    return path


def check_writable_dir(path: str | os.PathLike) -> Path:
    """PhazeError unless the output directory ``path`` can be created and written (a file in the
    way, no permission, a read-only file system), found by trying: a temporary file in it, or
    the first missing directory created and removed again. Nothing is left behind, so a stage
    can ask before its work rather than fail after it."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise PhazeError(f"cannot write the output directory {path}: it is a file")
    missing = path
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    try:
        if missing.exists():
            fd, tmp = tempfile.mkstemp(prefix=".phaze-probe.", dir=missing)
            os.close(fd)
            os.unlink(tmp)
        else:
            if not missing.parent.is_dir():
                raise PhazeError(
                    f"cannot create the output directory {path}: {missing.parent} is a file"
                )
            missing.mkdir()
            missing.rmdir()
    except OSError as exc:
        raise PhazeError(
            f"cannot write the output directory {path}: {exc.strerror or exc}"
        ) from exc
    return path


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; rename it onto ``target`` on success,
    delete it on any exception. An output that cannot be written at all (a directory of that
    name, a file in the way of its directory, no permission) is a PhazeError before any work."""
    target = Path(target)
    if target.is_dir():
        raise PhazeError(f"output {target} is a directory")
    ensure_dir(target.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise PhazeError(f"cannot write {target}: {exc.strerror or exc}") from exc
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp creates 0600; give the output the permissions a plain open() would (umask), so
    # results on a shared cluster filesystem stay readable by the group.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def write_text_atomic(target: str | os.PathLike, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def write_json_atomic(target: str | os.PathLike, obj) -> None:
    write_text_atomic(
        target, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n"
    )


def _json_default(obj):
    # numpy scalars and arrays
    if hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
