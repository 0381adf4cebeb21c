"""Where the grader writes its results (``-o``): never over a notebook or an input, and whole or
not at all.

``target`` is asked before anything is graded, so that a slip costs nothing: it refuses a path
that is a notebook (by its name, ``.ipynb``, or by its content: a shell pattern such as
``-o subs/*/04_layernorm.ipynb`` puts a student's notebook right after ``-o``), one of the inputs
(a notebook graded, the roster), a folder where a file is meant, a file's folder that does not exist,
and a file where a folder is meant. ``write`` puts the text in a temporary file beside the target,
then renames it over the target: a full disk, a size limit or a read-only folder leaves the
previous results as they were and no temporary file behind. Each refusal is an ``OutputError``
of one sentence naming the path.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import tempfile

__all__ = ["OutputError", "is_notebook", "target", "write"]


class OutputError(Exception):
    """A place the grader will not or cannot write, in one sentence."""


def is_notebook(path) -> bool:
    """Whether ``path`` names a notebook: an ``.ipynb`` name, or a JSON file with cells and nbformat."""
    path = pathlib.Path(path)
    if path.suffix.lower() == ".ipynb":
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
        data = json.loads(head)
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and "cells" in data and "nbformat" in data


def _same(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return pathlib.Path(a).resolve() == pathlib.Path(b).resolve()


def target(path, inputs=(), *, folder=False) -> pathlib.Path:
    """``path`` checked as the place for results (a folder of them with ``folder=True``)."""
    path = pathlib.Path(path)
    for given in inputs:
        if _same(path, given):
            raise OutputError(f"-o {path} is one of the grader's inputs: results are never written over an input; "
                              "give another path")
    if path.is_file() and is_notebook(path) or path.suffix.lower() == ".ipynb":
        raise OutputError(f"-o {path} is a notebook: the grader never writes over a notebook (a shell pattern "
                          "such as subs/*/04_layernorm.ipynb after -o names a student's); give a results file or "
                          "folder")
    if folder:
        if path.exists() and not path.is_dir():
            raise OutputError(f"-o {path} is a file: results for several students go in a folder; give a folder")
        return path  # created, with the folders above it, when the results are written
    if path.is_dir():
        raise OutputError(f"-o {path} is a folder: give a file name in it (grades.csv, results.json)")
    if not path.parent.is_dir():
        what = "is not a folder" if path.parent.exists() else "does not exist"
        raise OutputError(f"-o {path}: the folder {path.parent} {what}")
    return path


def write(path, text, inputs=()) -> None:
    """Write ``text`` to ``path`` whole (a temporary file renamed over it), or raise ``OutputError``
    and leave ``path`` as it was."""
    path = target(path, inputs)
    temp = None
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
        temp = None
    except OSError as err:
        raise OutputError(f"cannot write {path}: {_why(err)}; nothing was written there"
                          + (" (the previous file is unchanged)" if path.exists() else "")) from None
    finally:
        if temp is not None:
            try:
                os.unlink(temp)
            except OSError:
                pass


def _why(err) -> str:
    reasons = {errno.ENOSPC: "the disk is full", errno.EFBIG: "the file would be too large for the limits this "
               "process runs under", errno.EDQUOT: "the disk quota is used up", errno.EACCES: "permission denied",
               errno.EPERM: "permission denied", errno.EROFS: "the file system is read-only"}
    return reasons.get(err.errno, err.strerror or type(err).__name__)
