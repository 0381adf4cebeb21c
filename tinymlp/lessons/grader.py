"""Grading a class: every student's notebooks, one row per student and exercise.

    python -m tinymlp.lessons submissions/*/04_layernorm.ipynb            # a table
    python -m tinymlp.lessons --json submissions/*/*.ipynb > grades.json  # or --csv
    python -m tinymlp.lessons --gradescope -o /autograder/results/results.json submission/*.ipynb

(``python lessons/checks.py`` is the same command.) First the students and lessons are decided
from the submission folders, the roster and the file names (``identity.py``). Then for each
notebook the grader

1. runs it from top to bottom in a fresh kernel, in a sandbox of its own (``execute.py``,
   ``sandbox.py``; a cell that raises does not stop the rest), to report the cells that raise and
   what the notebook's own checks printed;
2. grades each exercise of its lesson: the program that defines the answer is read from the
   notebook (``notebook.py``) and scanned (``scan.py``); it runs in a sandbox of its own whose
   library is the exercise's student edition (``edition.py``: the exercise's library code
   absent), in a process (``worker.py``) that only computes the answer's outputs and gradients on
   inputs the grader sends. The inputs, the references, the hidden case's seed, the comparisons,
   the cost and the grade stay in this process, which never runs or imports the student's code
   (``remote.py``).

Last, the answers are compared with each other, with the worked notebooks and with the
library's code, after removing what the lesson hands out (``similarity.py``), and copies are
flagged for the instructor with the lines alike. The results go where ``-o`` says, never over a
notebook or an input, and whole (``output.py``). Where no sandbox can start, the grader grades
only with ``--unconfined`` (Python's confinement alone), and every report says so.

Nothing the notebook prints or changes in its kernel enters a grade: a notebook whose output
says ``passed`` for an exercise the grader fails is marked, for the instructor to look at.
"""

from __future__ import annotations

import argparse
import pathlib
import secrets
import sys
import time
from dataclasses import dataclass, field

from . import output, reports, scan, similarity
from .execute import Execution, execute, thread_env  # noqa: F401 (part of the grader's interface)
from .identity import Submission, assign, inside, read_roster
from .notebook import Notebook
from .registry import EXERCISES
from .remote import AnswerProcess, AnswerTimeout, ChannelError, RemoteError
from .runner import FAILED, NOT_DONE, PASSED, not_done, reason_of, run_check

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent  # the checkout: lessons/ holds the worked notebooks
STATUS = {PASSED: "passed", FAILED: "FAILED", NOT_DONE: "not done"}


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
    flags: list = field(default_factory=list)  # for the instructor: copies, number types, finite differences
    notes: list = field(default_factory=list)  # for the instructor, not a suspicion: how long it took at scale
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
    refused: str = ""  # why it was not graded
    answers: list = field(default_factory=list)  # what the student wrote, per exercise (similarity.Answer)
    confined: bool = True  # the kernel and the answers ran in the operating system's sandboxes

    @property
    def passed(self) -> bool:
        return not self.refused and not self.errors and all(r.status == "passed" for r in self.rows)


# ------------------------------------------------------------------------------ grading an answer
def _result(status, details, **more):
    return {"status": status, "details": details, "reason": reason_of(details), "reproduce": "", **more}


def grade_answer(nb, ex, seeds, timeout=120, *, confined=None, hide=()) -> dict:
    """One exercise of one notebook (a ``Notebook``): its answer run in a process of its own (in a
    sandbox: ``confined``, see ``grade_notebook``), the check run here on the public case and the
    hidden ones; the result as a dict."""
    program = nb.program(ex.id, ex.answer)
    base = {"answer": program.answer, "program": program, "flags": scan.flags(program, ex)}
    unplaced = scan.unplaced(program)
    if not program.found and unplaced:
        return {**_result(FAILED, "\n".join(unplaced)), **base}
    if not program.found:
        details = (f"the notebook defines no {program.answer} (the answer to exercise {ex.id})"
                   + (f"; cells with a syntax error: {'; '.join(nb.syntax_errors)}" if nb.syntax_errors else ""))
        return {**_result(NOT_DONE, details), **base}
    base["flags"] = base["flags"] + scan.copies(program, ex)
    problems = scan.refusals(program, ex)
    if problems:
        return {**_result(FAILED, "\n".join(problems)), **base}
    try:
        with AnswerProcess(program.job(ex, nb.label), timeout, confined=confining(confined), hide=hide) as proc:
            first = proc.first
            if "error" in first:
                error = first["error"] if isinstance(first["error"], dict) else {}
                if error.get("not_done"):
                    result = not_done(ex, error["not_done"])
                    return {**_result(NOT_DONE, result.details), "needs": result.needs, **base}
                text = str(error.get("text", ""))
                if not error.get("forbidden"):
                    text = "the code that defines the answer raised " + text
                return {**_result(FAILED, text), **base}
            checked = run_check(ex.id, first.get("answer"), seeds=tuple(seeds), answer_text=program.answer,
                                remote=proc)
            if ex.derived:
                base["flags"] = base["flags"] + _number_types(proc, base["flags"])
    except (AnswerTimeout, ChannelError, RemoteError) as err:
        return {**_result(FAILED, getattr(err, "details", None) or str(err)), **base}
    details, note = checked.details, scan.own_apply(program)
    if checked.status == FAILED and note:
        details = f"{details.rstrip()}\n{note}"
    if checked.note:
        base["notes"] = [checked.note]
    return {"status": checked.status, "details": details, "reason": checked.reason,
            "reproduce": checked.reproduce, "seed": checked.seed, "needs": checked.needs, **base}


def _number_types(proc, flagged):
    """Flags for the answer's own number types its process found that the scan of its code did not."""
    try:
        found = proc.evidence()
    except (AnswerTimeout, ChannelError, RemoteError):
        return []
    named = " ".join(flagged)
    return [f"defines its own number type, {kind}, at run time: dual numbers compute a derivative without deriving "
            "it" for kind in found if kind.split(" ")[0].split(".")[-1] not in named]


def grade_exercise(path, label, ex_id, seeds, timeout=120, *, confined=None) -> dict:
    """One exercise of the notebook at ``path`` (``label`` names it in messages); see ``grade_answer``."""
    from . import checks  # noqa: F401 (registers the checks)

    return grade_answer(Notebook(path, label), EXERCISES[ex_id], seeds, timeout, confined=confined)


def grade_notebook(path, seed, *, execute_first=True, cell_timeout=600, check_timeout=120,
                   submission: Submission | None = None, confined=None, hide=()) -> Graded:
    """Run one notebook, then grade every exercise of its lesson; one Row per exercise.

    ``confined``: the kernel and the answers run in sandboxes (``sandbox.py``); False: confined by
    Python alone (``--unconfined``); None: in sandboxes where they can start here. ``hide``:
    places no sandbox shows (the other submissions, the outputs)."""
    from . import checks  # noqa: F401 (registers the checks)

    path = pathlib.Path(path)
    start = time.perf_counter()
    nb = Notebook(path, submission.label if submission else None)
    if submission is None:
        submission = assign([(path, nb)])[0]
    confined = confining(confined)
    graded = Graded(submission.student, str(path), submission.lesson or "", refused=submission.refused,
                    confined=confined)
    if submission.refused:
        return graded
    claims = {}
    if execute_first:
        run = execute(path, cell_timeout, confined=confined, hide=hide)
        graded.errors, claims, graded.outputs, graded.run_seconds = run.errors, run.claims, run.outputs, run.seconds
        graded.executed, graded.notebook = True, run.notebook
    skeleton, worked = _lesson_builds(submission.lesson)
    ids = sorted((k for k in EXERCISES if EXERCISES[k].lesson == submission.lesson), key=_order)
    for ex_id in ids:
        ex = EXERCISES[ex_id]
        t = time.perf_counter()
        if submission.wrong_lesson:
            result = _result(FAILED, submission.wrong_lesson, flags=[])
        else:
            result = grade_answer(nb, ex, [None, seed], check_timeout, confined=confined, hide=hide)
            program = result.pop("program")
            if program.found:
                stub = skeleton.program(ex_id, ex.answer) if skeleton else None
                graded.answers.append(similarity.written(submission.student, ex_id, program, stub))
        status = STATUS.get(result["status"], "FAILED")
        said = {"passed": "passed", "FAILED": "FAILED", "not done yet": "not done"}.get(claims.get(ex_id), "")
        graded.rows.append(Row(
            submission.student, path.name, ex_id, ex.title, status, 1.0 if status == "passed" else 0.0,
            reason=result.get("reason", ""), details=result.get("details", ""),
            reproduce=result.get("reproduce", ""), section=ex.section, reference=ex.reference,
            notebook_said=said, flags=list(result.get("flags", [])), notes=list(result.get("notes", [])),
            seconds=round(time.perf_counter() - t, 2)))
    graded.seconds = time.perf_counter() - start
    return graded


def confining(confined) -> bool:
    """Whether to run in sandboxes: ``confined`` as given, or (None) where one can start here."""
    if confined is None:
        from .sandbox import unavailable

        return not unavailable()
    return bool(confined)


def _order(ex_id):
    lesson, number = ex_id.split(".")
    return int(lesson), int(number)


def _lesson_builds(lesson):
    """(the student build, the worked build) of a lesson, as Notebooks (None where not found)."""
    if not lesson:
        return None, None
    found = []
    for folder in (ROOT / "lessons" / "exercises", ROOT / "lessons"):
        paths = sorted(folder.glob(f"{lesson}_*.ipynb"))
        found.append(Notebook(paths[0], f"{folder.name}/{paths[0].name}") if paths else None)
    return found[0], found[1]


def grade_class(paths, seed, *, roster=None, execute_first=True, cell_timeout=600, check_timeout=120, log=None,
                confined=None, hide=()):
    """Every notebook of a class: (the Graded notebooks, notes for the instructor, similarity report)."""
    from . import checks  # noqa: F401 (registers the checks)

    subs = assign([(p, Notebook(p)) for p in paths], roster)
    graded = []
    for sub in subs:
        if log:
            log(f"grading {sub.path} ...")
        g = grade_notebook(sub.path, seed, execute_first=execute_first, cell_timeout=cell_timeout,
                           check_timeout=check_timeout, submission=sub, confined=confined,
                           hide=[*hide, *{pathlib.Path(p).parent for p in paths}])
        if log:
            log(f"  ... {g.seconds:.1f} s")
        graded.append(g)
    notes = [note for sub in subs for note in sub.notes]
    flags, similar = _similar(graded, subs)
    for g in graded:
        for row in g.rows:
            row.flags += flags.get((g.student, row.exercise), [])
    return graded, notes, similar


def _similar(graded, subs):
    answers = [a for g in graded for a in g.answers]
    lessons = {s.lesson for s in subs if s.lesson}
    worked, library, bases = {}, {}, {}
    for lesson in lessons:
        skeleton, worked_nb = _lesson_builds(lesson)
        for ex_id in (k for k in EXERCISES if EXERCISES[k].lesson == lesson):
            ex = EXERCISES[ex_id]
            if worked_nb is not None:
                stub = skeleton.program(ex_id, ex.answer) if skeleton else None
                program = worked_nb.program(ex_id, ex.answer)
                worked[ex_id] = similarity.written(f"the worked notebook ({worked_nb.label.split('/')[-1]})", ex_id,
                                                   program, stub, student=False)
            bases[ex_id] = similarity.base(skeleton, worked.get(ex_id))
            library[ex_id] = similarity.library_answers(ex, ROOT)
    return similarity.compare(answers, worked, library, bases)


# ------------------------------------------------------------------------------ the command line
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tinymlp.lessons",
        description="Run the course's notebooks and grade their exercises, one row per student and exercise "
                    "(the student: the notebook's folder, its roster name, or a safe and unique name in its metadata).")
    parser.add_argument("notebooks", nargs="+", type=pathlib.Path, help="notebooks to run and grade")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--csv", action="store_true", help="print CSV: one row per student and exercise")
    form.add_argument("--json", action="store_true", help="print JSON: the rows, the notebooks' errors, the seed")
    form.add_argument("--gradescope", action="store_true",
                      help="write Gradescope's results.json (one per student: -o FILE for one, -o DIR for several)")
    parser.add_argument("-o", "--output", type=pathlib.Path,
                        help="write the output to this file (a folder for --gradescope with several students); "
                             "never a notebook or an input")
    parser.add_argument("--roster", type=pathlib.Path,
                        help="a file of lines 'folder,Student Name': the students, by submission folder")
    parser.add_argument("--seed", type=int, default=None,
                        help="the hidden cases' seed (default: a new one each run, printed)")
    parser.add_argument("--no-execute", action="store_true",
                        help="grade the answers without running the notebooks first (faster; no cell errors)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell (default 600)")
    parser.add_argument("--check-timeout", type=int, default=120,
                        help="seconds allowed per exercise's check (default 120)")
    parser.add_argument("--unconfined", action="store_true",
                        help="grade without the operating system's sandbox where none can start (the report says so)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.notebooks if not p.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    inputs = list(args.notebooks) + ([args.roster] if args.roster else [])
    several = args.gradescope and args.output is not None and args.output.suffix != ".json"
    try:
        if args.output is not None:
            output.target(args.output, inputs, folder=several)
        roster = read_roster(args.roster) if args.roster else None
    except output.OutputError as err:
        return _refuse(str(err))
    except (OSError, ValueError) as err:
        parser.error(str(err))
    from .sandbox import unavailable

    if unavailable() and not args.unconfined:
        return _refuse(f"no sandbox can start here, so nothing was graded: {unavailable()}; or grade with "
                       "--unconfined, which runs the submissions confined by Python alone (the report says so)")
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    quiet = args.json or args.csv or args.gradescope
    graded, notes, similar = grade_class(args.notebooks, seed, roster=roster, execute_first=not args.no_execute,
                                         cell_timeout=args.timeout, check_timeout=args.check_timeout,
                                         confined=not args.unconfined, hide=[args.output] if args.output else [],
                                         log=lambda line: print(line, file=sys.stderr, flush=True))
    for note in notes + [f"not graded: {g.refused}" for g in graded if g.refused]:
        print(note, file=sys.stderr)
    try:
        if args.gradescope:
            _write_gradescope(graded, args.output, inputs)
        else:
            text = (reports.to_csv(graded) if args.csv else reports.to_json(graded, seed, notes, similar) if args.json
                    else reports.table(graded, notes, similar))
            if args.output:
                output.write(args.output, text if text.endswith("\n") else text + "\n", inputs)
            else:
                print(text)
            if not quiet:
                print(f"hidden cases: seed {seed} (--seed {seed} repeats this grading)")
    except output.OutputError as err:
        return _refuse(str(err))
    return 0 if all(g.passed for g in graded) else 1


def _refuse(sentence) -> int:
    print(f"error: {sentence}", file=sys.stderr)
    return 2


def _write_gradescope(graded, where, inputs=()):
    import json

    by_student = {}
    for g in graded:
        if not g.refused:
            by_student.setdefault(g.student, []).append(g)
    if len(by_student) <= 1 and (where is None or where.suffix == ".json"):
        text = json.dumps(reports.gradescope(next(iter(by_student.values()), [])), indent=2)
        if where is None:
            print(text)
        else:
            output.write(where, text + "\n", inputs)
        return
    if where is None or where.suffix == ".json":
        raise output.OutputError("--gradescope with several students writes one results.json each: pass -o FOLDER")
    try:
        where.mkdir(parents=True, exist_ok=True)
        for student, items in by_student.items():
            target = inside(where, student, "results.json")
            target.parent.mkdir(exist_ok=True)
            output.write(target, json.dumps(reports.gradescope(items), indent=2) + "\n", inputs)
            print(f"wrote {target}", file=sys.stderr)
    except OSError as err:
        raise output.OutputError(f"cannot write in {where}: {err.strerror or err}") from None
