"""The lessons: every notebook in lessons/ runs top to bottom, and is committed clean.

Each ``lessons/*.ipynb`` is executed in a fresh ``python3`` kernel with ``lessons/`` as the
working directory (marker ``lessons``; deselect with ``-m "not lessons"``), one test per
notebook, so a new lesson is picked up by its file name alone. A lesson that raises, or whose
asserts fail, fails here; ``-s`` prints each lesson's run time. Committed notebooks carry no
outputs and no execution counts (the reader runs them), and a notebook built from a source in
``lessons/src/`` must be what ``python lessons/make_lessons.py`` makes of it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent  # the repository root
LESSONS = ROOT / "lessons"
NOTEBOOKS = sorted(LESSONS.glob("*.ipynb"))
CELL_TIMEOUT = 120  # seconds per cell; a lesson should take well under two minutes in all


def _ids(paths):
    return [p.stem for p in paths]


@pytest.mark.lessons
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_lesson_runs(path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    # the kernel imports this checkout's tinymlp even without `pip install -e .`
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    # the lessons' arrays are small: one BLAS thread per kernel is as fast, and it keeps a
    # shared CI machine (several test processes, two cores) from thrashing in spin-waits
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if var not in os.environ:
            monkeypatch.setenv(var, "1")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT, kernel_name="python3", resources={"metadata": {"path": str(LESSONS)}},
    )
    start = time.perf_counter()
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:
        message = re.sub(r"\x1b\[[0-9;]*m", "", str(err))  # the traceback without terminal colours
        pytest.fail(f"{path.name} failed:\n{message}", pytrace=False)
    print(f"{path.name}: {time.perf_counter() - start:.1f} s")


def test_lessons_exist_and_are_numbered():
    assert NOTEBOOKS, "no notebooks in lessons/"
    for path in NOTEBOOKS:
        assert path.name[:2].isdigit() and path.name[2] == "_", f"{path.name}: expected NN_name.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_lesson_is_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    assert nb.get("nbformat") == 4, f"{path.name}: not an nbformat 4 notebook"
    dirty = [i for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or execution counts; clear them before committing"


SOURCES = sorted((LESSONS / "src").glob("*.py"))


@pytest.mark.parametrize("source", SOURCES, ids=_ids(SOURCES))
def test_lesson_matches_its_source(source):
    pytest.importorskip("nbformat")
    spec = importlib.util.spec_from_file_location("make_lessons", LESSONS / "make_lessons.py")
    make_lessons = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_lessons)
    target = make_lessons.target_of(source)
    assert target.exists(), f"{target.name} missing: run python lessons/make_lessons.py"
    assert target.read_text() == make_lessons.render(make_lessons.build(source)), (
        f"{target.name} differs from lessons/src/{source.name}: run python lessons/make_lessons.py")
