"""A graded class, written out: a table for a terminal, CSV, JSON, and Gradescope's results.json.

Every output has one row per student and exercise with its status, score, one-line reason, a
``reproduce`` line, the lesson section and library file to compare with, what the notebook's own
check printed, and the flags (copies, number types, finite-difference steps: for the
instructor, never a failure). The table ends with the notes (identities refused, notebooks not
graded), the flags and the similarity report; Gradescope's file, which the student sees, carries
the flags only in ``extra_data``.
"""

from __future__ import annotations

import csv
import io
import json
import pathlib
from dataclasses import asdict

__all__ = ["CSV_FIELDS", "gradescope", "table", "to_csv", "to_json"]


def rows_of(graded):
    return [row for g in graded for row in g.rows]


def table(graded, notes=(), similar=()) -> str:
    """A table for a terminal: one line per student and exercise, the reason of each failure."""
    rows = rows_of(graded)
    head = ("student", "exercise", "title", "result", "reason")
    lines, marked = [], False
    cells = []
    for r in rows:
        mark = "*" if r.notebook_said == "passed" and r.status != "passed" else ""
        marked = marked or bool(mark)
        flag = "!" if r.flags else ""
        reason = r.reason if len(r.reason) <= 90 else r.reason[:87] + "..."
        cells.append((r.student, r.exercise, r.title, r.status + mark + flag, reason if r.status != "passed" else ""))
    widths = [max(len(c[k]) for c in [head, *cells]) for k in range(4)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths) + "  {}"
    lines.append(fmt.format(*head).rstrip())
    lines.append(fmt.format(*("-" * w for w in widths), "-" * 6))
    lines += [fmt.format(*c).rstrip() for c in cells]
    for g in graded:
        if g.refused:
            lines.append(f"not graded: {g.refused}")
        elif not g.rows:
            lines.append(f"{g.student}: {pathlib.Path(g.path).name} has no exercises"
                         + (" (it ran without an error)" if g.executed and not g.errors else ""))
        for err in g.errors:
            lines.append(f"{g.student}: {pathlib.Path(g.path).name} raised in {err[:110]}")
    lines += list(notes)
    if any(not g.confined for g in graded):
        lines.append(UNCONFINED)
    done = sum(r.status == "passed" for r in rows)
    students = len({g.student for g in graded if not g.refused})
    lines.append("")
    lines.append(f"{done} of {len(rows)} exercises passed ({students} student{'s' * (students != 1)})")
    if marked:
        lines.append("* the notebook's own output says passed: its output was changed, or the answer only passes "
                     "without the grader's hidden case and refusals")
    flagged = [r for r in rows if r.flags]
    if flagged:
        lines.append("! flagged for the instructor (not failures):")
        lines += [f"  {r.student} {r.exercise}: {flag}" for r in flagged for flag in r.flags]
    noted = [r for r in rows if r.notes]
    if noted:
        lines.append("notes (not failures, not suspicions):")
        lines += [f"  {r.student} {r.exercise}: {note}" for r in noted for note in r.notes]
    if similar:
        lines.append("similar answers (the share of their code in common, most similar first):")
        lines += [f"  {line}" for line in similar]
    return "\n".join(lines)


UNCONFINED = ("unconfined: these submissions ran without the operating system's sandbox (--unconfined), confined by "
              "Python alone: a determined student could reach the grader's files or leave a process running")

CSV_FIELDS = ("student", "notebook", "exercise", "title", "status", "score", "max_score", "reason", "reproduce",
              "notebook_said", "flags", "notes", "section", "reference")


def to_csv(graded) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows_of(graded):
        writer.writerow({**asdict(row), "flags": "; ".join(row.flags), "notes": "; ".join(row.notes)})
    return out.getvalue()


def to_json(graded, seed, notes=(), similar=()) -> str:
    data = {
        "seed": seed,
        "confined": all(g.confined for g in graded),
        "results": [asdict(r) for r in rows_of(graded)],
        "notebooks": [{"student": g.student, "notebook": g.path, "lesson": g.lesson, "errors": g.errors,
                       "refused": g.refused, "seconds": round(g.seconds, 2)} for g in graded],
        "notes": list(notes),
        "similar": list(similar),
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
        test = {"name": f"{r.exercise} {r.title}", "number": r.exercise, "score": r.score,
                "max_score": r.max_score, "status": "passed" if r.status == "passed" else "failed",
                "output": output, "visibility": "visible"}
        if r.flags or r.notes:
            test["extra_data"] = {"flags": list(r.flags), "notes": list(r.notes)}
        tests.append(test)
    notes = [f"{pathlib.Path(g.path).name} raised in {e}" for g in graded for e in g.errors]
    notes += [f"not graded: {g.refused}" for g in graded if g.refused]
    total = sum(t["score"] for t in tests)
    unconfined = {"extra_data": {"confined": False}} if any(not g.confined for g in graded) else {}
    return {**unconfined,
        "score": total,
        "execution_time": int(round(sum(g.seconds for g in graded))),
        "output": f"{sum(t['status'] == 'passed' for t in tests)} of {len(tests)} exercises passed"
                  + ("\n" + "\n".join(notes) if notes else ""),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    }
