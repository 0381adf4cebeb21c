"""Grading a class: every student's notebooks, one row per student and exercise.

    python -m tinymlp.lessons submissions/*/04_layernorm.ipynb            # a table
    python -m tinymlp.lessons --json submissions/*/*.ipynb > grades.json  # or --csv
    python -m tinymlp.lessons --gradescope -o /autograder/results/results.json submission/*.ipynb

(``python lessons/checks.py`` is the same command.) For each notebook the grader

1. runs it from top to bottom in a fresh kernel (nbclient; a cell that raises does not stop
   the rest), to report the cells that raise and what the notebook's own checks printed;
2. grades each exercise of its lesson in a fresh worker process (``worker.py``): the answer's
   code is read from the notebook (``notebook.py``), and the check runs there on the public
   case and on a hidden one (the grader's seed, other shapes), with the library code that would
   do the exercise made unavailable (``guard.py``).

Nothing the notebook prints or changes in its kernel enters a grade: a notebook whose output
says ``passed`` for an exercise the grader fails is marked, for the instructor to look at.

The student is the notebook's folder (``submissions/alice/04_layernorm.ipynb`` is alice's),
or the name in the notebook's metadata (``"student": "Alice Martin"``); the lesson is the
first two digits of the file name (or ``metadata.tinymlp.lesson``).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import pathlib
import re
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from .registry import EXERCISES
from .runner import FAILED, NOT_DONE, PASSED

LINE = re.compile(r"^exercise (?P<id>\d\d\.\d+) (?P<title>.*): (?P<status>passed|not done yet|FAILED)")
THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


@dataclass
class Row:
    """One student's result on one exercise."""

    student: str
    notebook: str
    exercise: str
    title: str
    status: str  # "passed", "FAILED", "not done"
    score: float
    max_score: float = 1.0
    reason: str = ""  # one line: the first ``likely`` line of a report, else the first line of the details
    details: str = ""
    reproduce: str = ""  # a line that repeats the failing case in the student's notebook
    section: str = ""  # where the lesson teaches it
    reference: str = ""  # the library file that implements the same thing
    notebook_said: str = ""  # what the notebook's own check printed ("" if it printed nothing)
    seconds: float = 0.0


@dataclass
class Graded:
    """One notebook: its rows, the cells that raised when it ran, the time taken."""

    student: str
    path: str
    lesson: str
    rows: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    seconds: float = 0.0
    run_seconds: float = 0.0
    executed: bool = False
    notebook: object = None  # the executed notebook, when it was run
    outputs: str = ""  # everything the notebook printed (for the test suite and for debugging)

    @property
    def passed(self) -> bool:
        return not self.errors and all(r.status == "passed" for r in self.rows)


# ------------------------------------------------------------------------------ running a notebook
def thread_env(env=None) -> dict:
    """The environment with one BLAS/OpenMP thread, unless the caller chose: the lessons' arrays
    are small, and on a busy two-core machine threads that spin waiting for each other make a
    lesson several times slower (lesson 7: 8 s alone, 48 s next to one busy core)."""
    env = dict(os.environ if env is None else env)
    for var in THREADS:
        env.setdefault(var, "1")
    return env


def _package_path() -> str:
    return str(pathlib.Path(__file__).resolve().parent.parent.parent)


@dataclass
class Execution:
    """A notebook run top to bottom: what raised, what its checks printed, all it printed."""

    errors: list  # "cell 7: ZeroDivisionError: division by zero", one per cell that raised
    claims: dict  # exercise id -> what the notebook's own check printed ("passed", "FAILED", "not done yet")
    outputs: str  # everything the notebook printed
    seconds: float
    notebook: object  # the executed notebook (nbformat), outputs included


def execute(path, timeout=600, kernel_name="python3") -> Execution:
    """Run a notebook top to bottom in a fresh kernel (a cell that raises does not stop the rest).

    The kernel imports the tinymlp this grader belongs to (a PYTHONPATH already set comes
    first) and uses one BLAS thread (``thread_env``).
    """
    import nbclient
    import nbformat

    path = pathlib.Path(path)
    nb = nbformat.read(path, as_version=4)
    saved = dict(os.environ)
    os.environ.update(thread_env())
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [_package_path()]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    errors, start = [], time.perf_counter()
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, allow_errors=True,
                                     resources={"metadata": {"path": str(path.parent.resolve())}})
    try:
        client.execute()
    except Exception as err:  # noqa: BLE001: a timeout or a dead kernel is a result, not a crash
        last = str(err).strip().splitlines()[-1] if str(err).strip() else ""
        errors.append(f"{type(err).__name__}: {last}")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    seconds = time.perf_counter() - start
    claims, texts = {}, []
    for i, cell in enumerate(nb.cells, start=1):
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                errors.append(f"cell {i}: {output.get('ename')}: {output.get('evalue')}")
            text = _text_of(output)
            texts.append(text)
            for line in text.splitlines():
                m = LINE.match(line)
                if m:
                    claims[m.group("id")] = m.group("status")
    return Execution(errors, claims, "\n".join(texts), seconds, nb)


def _text_of(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") in ("execute_result", "display_data"):
        return output.get("data", {}).get("text/plain", "")
    return ""


# ------------------------------------------------------------------------------ grading an answer
def grade_exercise(path, label, ex_id, seeds, timeout=120) -> dict:
    """One exercise of one notebook, graded by a worker process (see worker.py)."""
    read, write = os.pipe()
    nonce = secrets.token_hex(16)
    job = {"notebook": str(pathlib.Path(path).resolve()), "label": label, "exercise": ex_id,
           "seeds": list(seeds), "fd": write, "nonce": nonce}
    env = thread_env()
    env["PYTHONPATH"] = os.pathsep.join([_package_path()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("TINYMLP_NUMBA", "0")  # the checks' arrays are tiny: no compiled kernels to load
    env.setdefault("MPLBACKEND", "Agg")
    with tempfile.TemporaryDirectory(prefix="tinymlp-grade-") as cwd:
        proc = subprocess.Popen([sys.executable, "-m", "tinymlp.lessons.worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(write,),
                                cwd=cwd, env=env, text=True)
        os.close(write)
        try:
            _, stderr = proc.communicate(json.dumps(job) + "\n", timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
            timed_out = True
        with os.fdopen(read, "rb") as pipe:
            lines = pipe.read().decode(errors="replace").splitlines()
    if timed_out:
        return _failure(f"the check did not finish in {timeout} s: an endless loop in the answer, or an answer "
                        "far slower than its formula")
    results = []
    for line in lines:
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            return _failure("the grading process received output it did not write: the answer writes to the "
                            "grader's channel")
        results.append(item)
    if len(results) != 1 or results[0].get("nonce") != nonce:
        if not results:
            tail = (stderr or "").strip().splitlines()[-1:] or [""]
            return _failure(f"the grading process ended without a result (exit status {proc.returncode}): the "
                            f"answer ended it or crashed it {('(' + tail[0][:200] + ')') if tail[0] else ''}".strip())
        return _failure("the grading process received more than one result: the answer writes to the grader's channel")
    results[0].pop("nonce")
    return results[0]


def _failure(details):
    return {"status": FAILED, "details": details, "reason": details, "reproduce": ""}


def grade_notebook(path, seed, *, execute_first=True, cell_timeout=600, check_timeout=120) -> Graded:
    """Run one notebook, then grade every exercise of its lesson; one Row per exercise."""
    from .notebook import Notebook

    path = pathlib.Path(path)
    start = time.perf_counter()
    nb = Notebook(path)
    graded = Graded(nb.student, str(path), nb.lesson)
    claims = {}
    if execute_first:
        run = execute(path, cell_timeout)
        graded.errors, claims, graded.outputs, graded.run_seconds = run.errors, run.claims, run.outputs, run.seconds
        graded.executed, graded.notebook = True, run.notebook
    ids = sorted((k for k in EXERCISES if EXERCISES[k].lesson == nb.lesson), key=_order)
    for ex_id in ids:
        ex = EXERCISES[ex_id]
        t = time.perf_counter()
        result = grade_exercise(path, nb.label, ex_id, [None, seed], check_timeout)
        status = {PASSED: "passed", FAILED: "FAILED", NOT_DONE: "not done"}.get(result["status"], "FAILED")
        said = {"passed": "passed", "FAILED": "FAILED", "not done yet": "not done"}.get(claims.get(ex_id), "")
        graded.rows.append(Row(
            nb.student, path.name, ex_id, ex.title, status, 1.0 if status == "passed" else 0.0,
            reason=result.get("reason", ""), details=result.get("details", ""),
            reproduce=result.get("reproduce", ""), section=ex.section, reference=ex.reference,
            notebook_said=said, seconds=round(time.perf_counter() - t, 2)))
    graded.seconds = time.perf_counter() - start
    return graded


def _order(ex_id):
    lesson, number = ex_id.split(".")
    return int(lesson), int(number)


# ------------------------------------------------------------------------------ outputs
def rows_of(graded):
    return [row for g in graded for row in g.rows]


def table(graded) -> str:
    """A table for a terminal: one line per student and exercise, the reason of each failure."""
    rows = rows_of(graded)
    head = ("student", "exercise", "title", "result", "reason")
    lines, marked = [], False
    cells = []
    for r in rows:
        mark = "*" if r.notebook_said == "passed" and r.status != "passed" else ""
        marked = marked or bool(mark)
        reason = r.reason if len(r.reason) <= 90 else r.reason[:87] + "..."
        cells.append((r.student, r.exercise, r.title, r.status + mark, reason if r.status != "passed" else ""))
    widths = [max(len(c[k]) for c in [head, *cells]) for k in range(4)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths) + "  {}"
    lines.append(fmt.format(*head).rstrip())
    lines.append(fmt.format(*("-" * w for w in widths), "-" * 6))
    lines += [fmt.format(*c).rstrip() for c in cells]
    for g in graded:
        if not g.rows:
            lines.append(f"{g.student}: {pathlib.Path(g.path).name} has no exercises"
                         + (" (it ran without an error)" if g.executed and not g.errors else ""))
        for err in g.errors:
            lines.append(f"{g.student}: {pathlib.Path(g.path).name} raised in {err[:110]}")
    done = sum(r.status == "passed" for r in rows)
    students = len({g.student for g in graded})
    lines.append("")
    lines.append(f"{done} of {len(rows)} exercises passed ({students} student{'s' * (students != 1)})")
    if marked:
        lines.append("* the notebook's own output says passed: its output was changed, or the answer only passes "
                     "without the grader's hidden case and forbidden calls")
    return "\n".join(lines)


CSV_FIELDS = ("student", "notebook", "exercise", "title", "status", "score", "max_score", "reason", "reproduce",
              "notebook_said", "section", "reference")


def to_csv(graded) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows_of(graded):
        writer.writerow(asdict(row))
    return out.getvalue()


def to_json(graded, seed) -> str:
    data = {
        "seed": seed,
        "results": [asdict(r) for r in rows_of(graded)],
        "notebooks": [{"student": g.student, "notebook": g.path, "lesson": g.lesson, "errors": g.errors,
                       "seconds": round(g.seconds, 2)} for g in graded],
    }
    return json.dumps(data, indent=2)


def gradescope(graded) -> dict:
    """Gradescope's results.json for one student's notebooks (one test per exercise)."""
    tests = []
    for r in rows_of(graded):
        output = "passed" if r.status == "passed" else (r.details or r.reason)
        if r.status != "passed":
            if r.reproduce and "reproduce:" not in output:
                output += f"\nreproduce: {r.reproduce}"
            output += f"\nsee: {r.section}; the library's version: {r.reference}"
        tests.append({"name": f"{r.exercise} {r.title}", "number": r.exercise, "score": r.score,
                      "max_score": r.max_score, "status": "passed" if r.status == "passed" else "failed",
                      "output": output, "visibility": "visible"})
    notes = [f"{pathlib.Path(g.path).name} raised in {e}" for g in graded for e in g.errors]
    total = sum(t["score"] for t in tests)
    return {
        "score": total,
        "execution_time": int(round(sum(g.seconds for g in graded))),
        "output": f"{sum(t['status'] == 'passed' for t in tests)} of {len(tests)} exercises passed"
                  + ("\n" + "\n".join(notes) if notes else ""),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    }


# ------------------------------------------------------------------------------ the command line
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tinymlp.lessons",
        description="Run the course's notebooks and grade their exercises, one row per student and exercise "
                    "(the student: the notebook's folder, or 'student' in its metadata).")
    parser.add_argument("notebooks", nargs="+", type=pathlib.Path, help="notebooks to run and grade")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--csv", action="store_true", help="print CSV: one row per student and exercise")
    form.add_argument("--json", action="store_true", help="print JSON: the rows, the notebooks' errors, the seed")
    form.add_argument("--gradescope", action="store_true",
                      help="write Gradescope's results.json (one per student: -o FILE for one, -o DIR for several)")
    parser.add_argument("-o", "--output", type=pathlib.Path, help="write the output here instead of printing it")
    parser.add_argument("--seed", type=int, default=None,
                        help="the hidden cases' seed (default: a new one each run, printed)")
    parser.add_argument("--no-execute", action="store_true",
                        help="grade the answers without running the notebooks first (faster; no cell errors)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell (default 600)")
    parser.add_argument("--check-timeout", type=int, default=120,
                        help="seconds allowed per exercise's check (default 120)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.notebooks if not p.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    quiet = args.json or args.csv or args.gradescope
    graded = []
    for path in args.notebooks:
        print(f"grading {path} ...", file=sys.stderr, flush=True)
        g = grade_notebook(path, seed, execute_first=not args.no_execute, cell_timeout=args.timeout,
                           check_timeout=args.check_timeout)
        print(f"  ... {g.seconds:.1f} s", file=sys.stderr, flush=True)
        graded.append(g)
    if args.gradescope:
        _write_gradescope(graded, args.output)
    else:
        text = to_csv(graded) if args.csv else to_json(graded, seed) if args.json else table(graded)
        if args.output:
            args.output.write_text(text if text.endswith("\n") else text + "\n")
        else:
            print(text)
        if not quiet:
            print(f"hidden cases: seed {seed} (--seed {seed} repeats this grading)")
    return 0 if all(g.passed for g in graded) else 1


def _write_gradescope(graded, output):
    by_student = {}
    for g in graded:
        by_student.setdefault(g.student, []).append(g)
    if len(by_student) == 1 and (output is None or output.suffix == ".json"):
        text = json.dumps(gradescope(next(iter(by_student.values()))), indent=2)
        if output is None:
            print(text)
        else:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(text + "\n")
        return
    if output is None or output.suffix == ".json":
        raise SystemExit("--gradescope with several students writes one results.json each: pass -o FOLDER")
    for student, items in by_student.items():
        target = output / student / "results.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(gradescope(items), indent=2) + "\n")
        print(f"wrote {target}", file=sys.stderr)
