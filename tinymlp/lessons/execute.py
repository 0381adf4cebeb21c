"""Running a submitted notebook top to bottom, in a sandbox, to report what raised and what it printed.

``execute(path)`` copies the notebook into the scratch folder of a sandbox of its own
(``sandbox.py``) and runs it there in a fresh kernel (nbclient; a cell that raises does not stop
the rest): the kernel sees the Python environment and the tinymlp package read-only, its
scratch folder, and nothing else; every process it starts ends with the sandbox, before the
grader goes on. Inside, ``python -m tinymlp.lessons.execute`` runs the notebook and sends the
executed notebook back as JSON through a pipe. The grader reads it as data (bounded in size),
and takes from it the cells that raised and the lines the notebook's own checks printed: like
everything the kernel says, these mark a row for the instructor and decide no grade.

``confined=False`` runs the kernel here, as the grader's user (``--unconfined``).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import sys
import time
from dataclasses import dataclass

__all__ = ["Execution", "execute", "thread_env"]

LINE = re.compile(r"^exercise (?P<id>\d\d\.\d+) (?P<title>.*): (?P<status>passed|not done yet|FAILED)")
THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
PACKAGE = pathlib.Path(__file__).resolve().parent.parent  # tinymlp/
MAX_BYTES = 256 << 20  # an executed notebook larger than this is not read
NAME = "notebook.ipynb"


def thread_env(env=None) -> dict:
    """The environment with one BLAS/OpenMP thread, unless the caller chose: the lessons' arrays
    are small, and on a busy two-core machine threads that spin waiting for each other make a
    lesson several times slower (lesson 7: 8 s alone, 48 s next to one busy core)."""
    env = dict(os.environ if env is None else env)
    for var in THREADS:
        env.setdefault(var, "1")
    return env


@dataclass
class Execution:
    """A notebook run top to bottom: what raised, what its checks printed, all it printed."""

    errors: list  # "cell 7: ZeroDivisionError: division by zero", one per cell that raised
    claims: dict  # exercise id -> what the notebook's own check printed ("passed", "FAILED", "not done yet")
    outputs: str  # everything the notebook printed
    seconds: float
    notebook: object  # the executed notebook (nbformat), outputs included
    confined: bool = True


def execute(path, timeout=600, kernel_name="python3", *, confined=None, hide=()) -> Execution:
    """Run a notebook top to bottom in a fresh kernel, in a sandbox (see the module docstring;
    ``confined=None``: where one can start here); a cell that runs past ``timeout`` seconds is
    named with its first line. ``hide``: places the sandbox must not show even inside a folder it
    shows (the submissions, the outputs)."""
    import nbformat

    path = pathlib.Path(path)
    if confined is None:
        from .sandbox import unavailable

        confined = not unavailable()
    start = time.perf_counter()
    if not confined:
        nb, errors = _run(path, timeout, kernel_name, str(path.parent.resolve()))
        return _read(nb, errors, time.perf_counter() - start, confined=False)
    from .sandbox import SCRATCH, Sandbox

    cells = sum(1 for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    result_r, result_w = os.pipe()
    with Sandbox(PACKAGE, hide=(path.parent, *hide)) as box:
        shutil.copyfile(path, box.scratch / NAME)
        (box.scratch / NAME).chmod(0o666)
        try:
            box.start(["python", "-m", "tinymlp.lessons.execute", f"{SCRATCH}/{NAME}", str(timeout), kernel_name,
                       str(result_w)], pass_fds=(result_w,), env=thread_env({}))
        finally:
            os.close(result_w)
        try:
            data = _read_all(result_r, time.monotonic() + timeout * (cells + 1) + 120)
        finally:
            os.close(result_r)
        said = box.errors() if not data else ""
    seconds = time.perf_counter() - start
    try:
        message = json.loads(data.decode("utf-8")) if data else None
        nb = nbformat.from_dict(message["notebook"])
        errors = [str(e) for e in message.get("errors", [])][:100]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        why = "it sent no readable result" + (f" (bubblewrap: {said})" if said else "")
        return Execution([f"the notebook: the sandbox that ran it ended without finishing: {why}"], {}, "", seconds,
                         nbformat.read(path, as_version=4))
    return _read(nb, errors, seconds)


def _read_all(fd, deadline) -> bytes:
    import select

    data = b""
    while len(data) <= MAX_BYTES:
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            return b""
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return data
        data += chunk
    return b""


def _read(nb, errors, seconds, confined=True) -> Execution:
    """The cells that raised and the lines the notebook's checks printed, from an executed notebook."""
    claims, texts, stopped = {}, [], None
    for err in errors:
        match = re.match(r"^cell (\d+) .* did not finish in", err)
        if match:
            stopped = int(match.group(1))
    for i, cell in enumerate(nb.cells, start=1):
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            interrupted = i == stopped and out.get("ename") == "KeyboardInterrupt"  # by the timeout
            if out.get("output_type") == "error" and not interrupted:
                errors.append(f"cell {i}: {out.get('ename')}: {out.get('evalue')}")
            text = _text_of(out)
            texts.append(text)
            for line in text.splitlines():
                m = LINE.match(line)
                if m:
                    claims[m.group("id")] = m.group("status")
    return Execution(errors, claims, "\n".join(texts), seconds, nb, confined)


def _text_of(output) -> str:
    if output.get("output_type") == "stream":
        return str(output.get("text", ""))
    if output.get("output_type") in ("execute_result", "display_data"):
        return str(output.get("data", {}).get("text/plain", ""))
    return ""


def _run(path, timeout, kernel_name, folder):
    """Run the notebook at ``path`` in a kernel started here, working in ``folder``: (the executed
    notebook, the lines for a cell that timed out or a kernel that died)."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    saved = dict(os.environ)
    os.environ.update(thread_env())
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [str(PACKAGE.parent)]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    errors, current = [], {}
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, allow_errors=True,
                                     resources={"metadata": {"path": folder}})
    client.on_cell_start = lambda cell, cell_index: current.update(cell=cell, index=cell_index)
    try:
        client.execute()
    except Exception as err:  # noqa: BLE001 (a timeout or a dead kernel is a result, not a crash)
        cell = current.get("cell")
        first = next((line for line in (cell.source if cell else "").splitlines() if line.strip()), "")
        where = f"cell {current['index'] + 1} ({first.strip()[:80]})" if cell is not None else "the notebook"
        if isinstance(err, TimeoutError):
            errors.append(f"{where} did not finish in {timeout} s (CellTimeoutError)")
        else:
            last = str(err).strip().splitlines()[-1] if str(err).strip() else ""
            errors.append(f"{where}: {type(err).__name__}: {last}")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb, errors


def _inside(path, timeout, kernel_name, fd):
    """In the sandbox: run the notebook, send it back through ``fd`` (which no kernel inherits)."""
    os.set_inheritable(fd, False)
    nb, errors = _run(path, timeout, kernel_name, os.path.dirname(path))
    data = json.dumps({"notebook": nb, "errors": errors}).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.close(fd)


if __name__ == "__main__" and len(sys.argv) == 5:
    _inside(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
