"""The operating system's confinement of what a submission runs (``tinymlp/lessons/sandbox.py``).

A notebook's kernel and an answer's process each run in a throwaway bubblewrap sandbox: they see
the Python environment and a library folder read-only and a scratch folder, and nothing else
(not the checkout and its answer key, not the other students' notebooks, not the grader's
outputs, not the network), and every process they start is gone before the grader goes on.
Each test plants what a determined student tried: a process left behind that rewrites the
results after the grader wrote them, the answer key read at run time, the grader's guard stepped
around to reach the library's original code. Where no sandbox can be created (no bubblewrap, no
user namespaces) these tests skip with that reason, and the grader refuses to grade without
``--unconfined``, which the last test checks everywhere.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

nbformat = pytest.importorskip("nbformat")
from nbformat.v4 import new_code_cell, new_notebook  # noqa: E402

from tinymlp.lessons import grader, sandbox  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHECKS = ROOT / "lessons" / "checks.py"
KEY = ROOT / "lessons" / "04_layernorm.ipynb"
needs_sandbox = pytest.mark.skipif(bool(sandbox.unavailable()), reason=sandbox.unavailable() or "")


def submit(folder, student, name, source):
    path = pathlib.Path(folder) / student / name
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(new_notebook(cells=[new_code_cell(s) for s in (source if isinstance(source, list) else [source])]),
                   path)
    return path


def processes_with(marker):
    """The pids of this machine's processes whose command line holds ``marker``."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def daemon(marker, target):
    """Notebook code that starts a process which outlives its kernel and keeps writing ``target``."""
    loop = (f"import time\nfor _ in range(600):\n    try:\n        open({str(target)!r}, 'w').write('forged')\n"
            f"    except OSError:\n        pass\n    time.sleep(0.1)\n")
    return (f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {loop!r}, {marker!r}], "
            "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print('started')")


@pytest.mark.slow
@needs_sandbox
def test_nothing_a_notebook_starts_outlives_its_run_or_writes_outside_its_scratch(tmp_path, checkout_env):
    victim = tmp_path / "out" / "results.json"
    victim.parent.mkdir()
    victim.write_text("the grader's")
    marker = f"tinymlp-daemon-{os.getpid()}-{time.monotonic_ns()}"
    path = submit(tmp_path / "subs", "mallory", "04_layernorm.ipynb", daemon(marker, victim))
    run = grader.execute(path, timeout=60, confined=True)
    assert "started" in run.outputs, (run.errors, run.outputs)
    assert processes_with(marker) == []        # gone when execute returned
    time.sleep(0.5)
    assert victim.read_text() == "the grader's"


def around_python():
    """The names in the checkout that the sandbox shows: the first folders on the way to a Python
    folder inside it (a virtual environment in the checkout), nothing else."""
    inside = [pathlib.Path(f).relative_to(ROOT) for f in sandbox.python_folders() if f.startswith(f"{ROOT}{os.sep}")]
    return {f.parts[0] for f in inside}


@pytest.mark.slow
@needs_sandbox
def test_a_notebook_sees_neither_the_answer_key_nor_the_classmates_nor_the_network(tmp_path, checkout_env):
    bob = submit(tmp_path / "subs", "bob", "04_layernorm.ipynb", "x = 1")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    probes = {"the answer key": f"open({str(KEY)!r}).read()", "a classmate": f"open({str(bob)!r}).read()",
              "the checkout": f"open({str(ROOT / 'setup.cfg')!r}).read()",
              "the checkout's folders": f"assert set(__import__('os').listdir({str(ROOT)!r})) - {around_python()!r}",
              "the library's code": f"open({str(ROOT / 'tinymlp' / 'ops' / 'norm.py')!r}).read()",
              "the network": f"__import__('socket').create_connection(('127.0.0.1', {port}), timeout=2)",
              "a file outside": f"open({str(tmp_path / 'planted')!r}, 'w').write('x')",
              "the grader's files": "open('/sandbox/lib/tinymlp/lessons/grader.py', 'a').write('#')",
              "a classmate, to write": f"open({str(bob)!r}, 'a').write('#')"}
    source = "reached = []\n" + "".join(f"try:\n    {code}\n    reached.append({what!r})\nexcept Exception:\n    pass\n"
                                        for what, code in probes.items()) + "print('reached:', reached)"
    path = submit(tmp_path / "subs", "mallory", "04_layernorm.ipynb", source)
    run = grader.execute(path, timeout=60, confined=True)
    assert "reached: []" in run.outputs, (run.errors, run.outputs)
    with pytest.raises(socket.timeout):
        listener.accept()
    listener.close()
    assert not (tmp_path / "planted").exists()


@needs_sandbox
def test_an_answers_sandbox_holds_no_code_of_the_exercise_and_no_checks(tmp_path, checkout_env):
    """The student edition the answer's process sees: the exercise's library code, the checks'
    references and the answer key are in no file it can open, whatever way it reaches them."""
    from tinymlp.lessons import EXERCISES
    from tinymlp.lessons.edition import edition

    library = edition("04.1", EXERCISES["04.1"].forbidden)
    probe = f"""
import inspect, os, tinymlp.ops.norm as norm
out = {{"backward": inspect.getsource(norm.normalize_backward),
       "checks": os.path.exists('/sandbox/lib/tinymlp/lessons/checks'), "key": os.path.exists({str(KEY)!r}),
       "checkout": os.path.exists({str(ROOT / 'tinymlp')!r}),
       "root": sorted(os.listdir('/'))}}
try:
    norm.normalize_backward(1.0, 1.0, 1.0)
except RuntimeError as err:
    out["call"] = str(err)
open('/sandbox/scratch/out.json', 'w').write(__import__('json').dumps(out))
"""
    with sandbox.Sandbox(library / "tinymlp") as box:
        process = box.start(["python", "-c", probe], env={"TINYMLP_NUMBA": "0"})
        assert process.wait(120) == 0, box.errors()
        out = json.loads((box.scratch / "out.json").read_text())
    assert "raise RuntimeError" in out["backward"] and "r * (" not in out["backward"], out["backward"]
    assert "not in the answer's edition of the library" in out["call"]
    assert not out["checks"] and not out["key"] and not out["checkout"]
    shown = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sandbox", "sbin", "tmp", "usr"}
    assert set(out["root"]) <= shown | {pathlib.Path(f).parts[1] for f in sandbox.python_folders()}, out["root"]


@needs_sandbox
def test_the_guard_stepped_around_finds_no_library_code_to_call(checkout_env):
    """The originals that the Python-level guard keeps (reachable from a module global) are, in the
    sandbox, the edition's: no code of the exercise to call."""
    from tinymlp.lessons.remote import AnswerProcess, RemoteError

    source = """
import numpy as np
import tinymlp.lessons.forbidden as guard

def attempt():
    originals = {original.__name__: original for _, original, _ in guard._DIVERTED.values()}
    return originals["normalize_backward"](np.ones(4), np.linspace(-1, 1, 4), 2.0)
"""
    job = {"exercise": "04.1", "forbidden": ["tinymlp.ops.norm.normalize_backward"], "label": "mallory/x.ipynb",
           "answer": "attempt", "cells": {"<mallory/x.ipynb, cell 1>": source},
           "statements": [["<mallory/x.ipynb, cell 1>", i] for i in range(3)]}
    with AnswerProcess(job, timeout=120, confined=True) as proc:
        with pytest.raises(RemoteError, match="not in the answer's edition of the library"):
            proc.first["answer"]()


@pytest.mark.slow
@needs_sandbox
def test_a_process_left_behind_cannot_rewrite_the_gradescope_results(tmp_path, checkout_env):
    out = tmp_path / "results"
    out.mkdir()
    marker = f"tinymlp-daemon-{os.getpid()}-{time.monotonic_ns()}"
    path = submit(tmp_path / "subs", "mallory", "06_mlp_mixer.ipynb", daemon(marker, out / "results.json"))
    run = subprocess.run([sys.executable, str(CHECKS), "--seed", "1", "--gradescope", "-o", out / "results.json",
                          path], capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stderr
    time.sleep(0.5)
    assert json.loads((out / "results.json").read_text())["score"] == 0
    assert processes_with(marker) == []


@pytest.mark.slow
def test_without_a_sandbox_the_grader_says_so_in_one_line_and_grades_only_when_told(tmp_path):
    path = submit(tmp_path / "subs", "alice", "06_mlp_mixer.ipynb", "x = 1")
    env = {**os.environ, "PATH": os.path.dirname(sys.executable), "PYTHONPATH": str(ROOT)}   # no bwrap on it
    refused = subprocess.run([sys.executable, str(CHECKS), "--no-execute", path], capture_output=True, text=True,
                             timeout=300, env=env)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.count("\n") == 1 and "bubblewrap" in refused.stderr and "--unconfined" in refused.stderr
    graded = subprocess.run([sys.executable, str(CHECKS), "--no-execute", "--unconfined", path],
                            capture_output=True, text=True, timeout=300, env=env)
    assert graded.returncode == 1 and "unconfined: these submissions ran without" in graded.stdout, graded.stdout
    data = json.loads(subprocess.run([sys.executable, str(CHECKS), "--no-execute", "--unconfined", "--json", path],
                                     capture_output=True, text=True, timeout=300, env=env).stdout)
    assert data["confined"] is False


@pytest.mark.parametrize("where", ["site-packages holds the package", "a shown folder holds the checkout"])
def test_the_library_and_the_checkout_are_covered_where_a_shown_folder_holds_them(where, monkeypatch):
    """tinymlp installed into a virtual environment's site-packages (not editable) puts the
    exercises' library code inside a folder the sandbox shows: an empty folder covers it."""
    shown = ROOT if where.startswith("site") else ROOT.parent        # as python_folders() would find it
    monkeypatch.setattr(sandbox, "python_folders", lambda: [str(shown)])
    box = sandbox.Sandbox(ROOT / "tinymlp")
    try:
        argv = box.argv(["true"])
    finally:
        box.end()
    covered = {argv[i + 1] for i, arg in enumerate(argv) if arg == "--tmpfs"}
    assert str(ROOT / "tinymlp") in covered
    assert (str(ROOT) in covered) is (shown != ROOT)                # never the shown folder itself
    at = {(arg, argv[i + 1]): i for i, arg in enumerate(argv[:-1])}
    assert at["--ro-bind", str(shown)] < at["--tmpfs", str(ROOT / "tinymlp")], "covered after it is shown"
