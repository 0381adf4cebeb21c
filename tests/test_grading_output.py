"""Where the grader writes (``-o``): never over a notebook or an input, whole or not at all, and a
place it cannot write is one line, not a traceback.

A shell pattern after ``-o`` (``-o subs/*/04_layernorm.ipynb``) puts a student's notebook where
the results go: it is refused before anything is graded. A write that fails (a folder given for a
file, a missing or read-only folder, a full disk) says so in one line naming the path, and leaves
whatever was there before as it was.
"""

from __future__ import annotations

import os
import pathlib
import resource
import signal
import subprocess
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
from nbformat.v4 import new_code_cell, new_notebook  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHECKS = ROOT / "lessons" / "checks.py"
RIGHT_06 = ("from tinymlp.lessons import check\n"
            "def mixer_block_parameters(S, C, D_S, D_C):\n"
            "    return 4 * C + 2 * S * D_S + D_S + S + 2 * C * D_C + D_C + C\n"
            "check('06.1', mixer_block_parameters)")


def submit(folder, student, source=RIGHT_06):
    path = folder / student / "06_mlp_mixer.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(new_notebook(cells=[new_code_cell(source)]), path)
    return path


def grade(*args, limit=None):
    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(CHECKS), "--seed", "1", "--no-execute", "--unconfined",
                           *map(str, args)], capture_output=True, text=True, timeout=300, env=env,
                          preexec_fn=small_files if limit else None)


def one_line(run):
    lines = [line for line in run.stderr.splitlines() if line.strip() and not line.startswith(("grading ", "  ..."))]
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    assert len(lines) == 1, run.stderr
    return lines[0]


@pytest.mark.parametrize("form", [(), ("--csv",), ("--json",), ("--gradescope",)], ids=["table", "csv", "json",
                                                                                         "gradescope"])
def test_a_shell_pattern_after_o_never_writes_over_a_students_notebook(form, tmp_path):
    alice, bob = submit(tmp_path / "subs", "alice"), submit(tmp_path / "subs", "bob")
    before = alice.read_bytes()
    # `-o subs/*/06_mlp_mixer.ipynb` as the shell expands it: alice's notebook becomes the output
    run = grade(*form, "-o", alice, bob)
    line = one_line(run)
    assert str(alice) in line and "notebook" in line, line
    assert alice.read_bytes() == before


def test_an_input_is_never_an_output(tmp_path):
    alice = submit(tmp_path / "subs", "alice")
    roster = tmp_path / "roster.csv"
    roster.write_text("alice,Alice\n")
    before = roster.read_text()
    line = one_line(grade("--csv", "--roster", roster, "-o", roster, alice))
    assert str(roster) in line and "input" in line, line
    assert roster.read_text() == before
    renamed = tmp_path / "subs" / "alice" / "notes.txt"        # a notebook under another name
    renamed.write_bytes(alice.read_bytes())
    line = one_line(grade("-o", renamed, alice))
    assert "notebook" in line, line
    assert renamed.read_bytes() == alice.read_bytes()


def test_places_that_cannot_be_written_are_one_line(tmp_path):
    alice = submit(tmp_path / "subs", "alice")
    folder = tmp_path / "out"
    folder.mkdir()
    line = one_line(grade("--csv", "-o", folder, alice))
    assert str(folder) in line and "folder" in line, line
    line = one_line(grade("--csv", "-o", tmp_path / "missing" / "grades.csv", alice))
    assert str(tmp_path / "missing") in line and "does not exist" in line, line
    if os.geteuid() != 0:      # root writes into read-only folders
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            line = one_line(grade("--csv", "-o", locked / "grades.csv", alice))
            assert str(locked / "grades.csv") in line, line
        finally:
            locked.chmod(0o700)


@pytest.mark.slow
def test_a_full_disk_leaves_the_previous_results_whole_and_says_so_in_one_line(tmp_path):
    alice = submit(tmp_path / "subs", "alice")
    out = tmp_path / "grades.json"
    out.write_text('{"previous": true}\n')
    line = one_line(grade("--json", "-o", out, alice, limit=64))   # files may not grow past 64 bytes
    assert str(out) in line and ("too large" in line or "space" in line), line
    assert out.read_text() == '{"previous": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grades.json", "subs"]   # no temporary file left
    folder = tmp_path / "results"
    run = grade("--gradescope", "-o", folder, alice, submit(tmp_path / "subs", "bob"), limit=64)
    assert str(folder) in one_line(run)
    assert not list(folder.rglob("*.tmp*")) and not list(folder.rglob(".*"))


@pytest.mark.slow
def test_results_are_written_whole(tmp_path):
    alice = submit(tmp_path / "subs", "alice")
    out = tmp_path / "grades.csv"
    run = grade("--csv", "-o", out, alice)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr     # 06.2 and 06.3 not done
    assert out.read_text().startswith("student,notebook,exercise")
