"""Build the lesson notebooks from their Python sources.

Each lesson is written as a plain Python file in ``lessons/src/`` (so that it can be read,
diffed and reviewed like code) in the "percent" cell format:

    # %% [markdown]
    # # A title
    # Prose with LaTeX: $\\frac{\\partial L}{\\partial w}$.

    # %%
    x = 1 + 1

``# %% [markdown]`` opens a markdown cell whose lines are comments (the leading ``# `` is
removed); ``# %%`` opens a code cell. Lines before the first marker are a note to the reader
of the source and are not part of the notebook. ``lessons/src/NN_name.py`` becomes
``lessons/NN_name.ipynb``, without outputs and with stable cell ids, so that building twice
gives the same bytes.

Exercises. An answer in a code cell sits between two marker lines,

    # BEGIN SOLUTION 04.2
    dx = r * (g - g.mean(axis=-1, keepdims=True) - ...)
    # END SOLUTION

and the exercise id (lesson.number) names its check in ``tinymlp/lessons/checks/``. Two builds are
written from every source: the *worked* notebook ``lessons/NN_name.ipynb`` keeps the answers
(without the marker lines), the *student* notebook ``lessons/exercises/NN_name.ipynb`` replaces
each answer by a stub at the marker's indentation: ``raise NotImplementedError("exercise 04.2")``,
or, when the marker line carries one after a ``|`` (``# BEGIN SOLUTION 06.2 | params = ...``),
that line (for answers that are values at the top level of a cell, where a raise would stop
the notebook). Markdown cells may hide a worked result the same way (marker lines
``# BEGIN SOLUTION 05.3`` / ``# END SOLUTION`` in the markdown comments); the student build
shows an invitation to derive it instead.

Where each exercise is taught. A failing check ends with a ``see:`` line naming the section of
the lesson that teaches the exercise: the headings of the notebook above the exercise's first
answer (its ``## N. Title`` and, when the answer sits in a subsection, the ``### Subsection``).
They are read from the sources and written to ``tinymlp/lessons/sections.py`` (the checks are
part of the installed package, which never reads ``lessons/``), so a moved or renamed section
moves its pointers with it.

    python lessons/make_lessons.py            # (re)write every notebook that has a source, and sections.py
    python lessons/make_lessons.py --check    # exit 1 if a notebook (either build) or sections.py is out of date
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = pathlib.Path(__file__).resolve().parent.parent  # the repository root
SOURCES = ROOT / "lessons" / "src"
LESSONS = ROOT / "lessons"
EXERCISES = LESSONS / "exercises"
SECTIONS_FILE = ROOT / "tinymlp" / "lessons" / "sections.py"

BEGIN = re.compile(r"^(?P<indent>\s*)(?:# )?BEGIN SOLUTION (?P<id>\d\d\.\d+)\s*(?:\|\s*(?P<stub>.*\S))?\s*$")
END = re.compile(r"^\s*(?:# )?END SOLUTION\s*$")
HEADING = re.compile(r"^(?P<level>#{1,6})\s+(?P<text>\S.*?)\s*$")

METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


def parse(text: str) -> list[tuple[str, str]]:
    """Split percent-format source into [(kind, source)], kind "markdown" or "code"."""
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        marker = line.strip()
        if marker.startswith("# %%"):
            kind = "markdown" if "[markdown]" in marker else "code"
            cells.append((kind, []))
        elif cells:
            kind, lines = cells[-1]
            if kind == "markdown":
                if line.startswith("# "):
                    line = line[2:]
                elif line.strip() == "#":
                    line = ""
                elif line.strip():
                    raise ValueError(f"a markdown cell line must be a comment: {line!r}")
            lines.append(line)
    out = []
    for kind, lines in cells:
        source = "\n".join(lines).strip("\n")
        if source:
            out.append((kind, source))
    return out


def solutions(kind: str, source: str, student: bool) -> str:
    """One cell's source in the worked build (answers kept) or the student build (stubs)."""
    out, inside = [], None
    for line in source.split("\n"):
        begin = BEGIN.match(line)
        if begin:
            if inside:
                raise ValueError(f"exercise {inside.group('id')}: BEGIN SOLUTION inside a solution")
            inside = begin
            if student:
                ex, indent = begin.group("id"), begin.group("indent")
                if kind == "markdown":
                    out.append(f"*Exercise {ex}: work this out on paper first; the worked notebook "
                               "(`lessons/` one folder up) has the derivation.*")
                elif begin.group("stub"):
                    out.append(f"{indent}{begin.group('stub')}  # exercise {ex}: your answer")
                else:
                    out.append(f'{indent}raise NotImplementedError("exercise {ex}")')
        elif END.match(line):
            if not inside:
                raise ValueError("END SOLUTION without BEGIN SOLUTION")
            inside = None
        elif not (inside and student):
            out.append(line)
    if inside:
        raise ValueError(f"exercise {inside.group('id')}: no END SOLUTION")
    return "\n".join(out)


def exercise_ids(source_path: pathlib.Path) -> list[str]:
    """The exercise ids of one lesson source, in order."""
    return [m.group("id") for m in map(BEGIN.match, source_path.read_text().splitlines()) if m]


def sections(source_path: pathlib.Path) -> dict[str, tuple[str, ...]]:
    """{exercise id: the headings above its first answer}: the level-2 heading (``1. Softmax``)
    and, when a level-3 heading follows it before the answer, that one too, as the notebook shows them."""
    found, open_headings = {}, {}
    for kind, source in parse(source_path.read_text()):
        for line in source.split("\n"):
            heading = HEADING.match(line) if kind == "markdown" else None
            if heading:
                level = len(heading.group("level"))
                open_headings = {k: v for k, v in open_headings.items() if k < level}
                open_headings[level] = heading.group("text")
                continue
            begin = BEGIN.match(line)
            if begin and begin.group("id") not in found:
                found[begin.group("id")] = tuple(open_headings[k] for k in sorted(open_headings) if k >= 2)
    return found


def render_sections(sources) -> str:
    """The text of ``tinymlp/lessons/sections.py`` for the given lesson sources."""
    entries = {}
    for src in sources:
        entries.update(sections(src))
    lines = ['"""Where the lessons teach each exercise: the headings of its notebook above the exercise\'s answer',
             "(the section, and the subsection when there is one), for the ``see:`` line of a failing check.",
             "",
             "Written by lessons/make_lessons.py from lessons/src/: rebuild it there, do not edit it here.",
             '"""',
             "",
             "SECTIONS = {"]
    for ex_id in sorted(entries):
        lines.append(f"    {ex_id!r}: {entries[ex_id]!r},")
    lines.append("}")
    return "\n".join(lines) + "\n"


def build(source_path: pathlib.Path, student: bool = False) -> nbformat.NotebookNode:
    """The notebook (no outputs, stable ids) for one lesson source file, worked or student."""
    stem = source_path.stem
    nb = new_notebook(metadata=METADATA)
    for i, (kind, source) in enumerate(parse(source_path.read_text())):
        source = solutions(kind, source, student)
        cell = new_markdown_cell(source) if kind == "markdown" else new_code_cell(source)
        cell["id"] = f"{stem[:50]}-{i:03d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    text = nbformat.writes(nb, version=4)
    return text if text.endswith("\n") else text + "\n"


def target_of(source_path: pathlib.Path, student: bool = False) -> pathlib.Path:
    return (EXERCISES if student else LESSONS) / f"{source_path.stem}.ipynb"


def has_exercises(source_path: pathlib.Path) -> bool:
    return bool(exercise_ids(source_path))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    sources = sorted(SOURCES.glob("*.py"))
    text = render_sections(sources)
    if not SECTIONS_FILE.exists() or SECTIONS_FILE.read_text() != text:
        if args.check:
            stale.append(SECTIONS_FILE)
        else:
            SECTIONS_FILE.write_text(text)
            print(f"wrote {SECTIONS_FILE.relative_to(ROOT)}")
    for src in sources:
        for student in (False, True):
            text, target = render(build(src, student)), target_of(src, student)
            if args.check:
                if not target.exists() or target.read_text() != text:
                    stale.append(target)
            elif not target.exists() or target.read_text() != text:
                target.parent.mkdir(exist_ok=True)
                target.write_text(text)
                print(f"wrote {target.relative_to(ROOT)}")
    for target in stale:
        print(f"out of date: {target.relative_to(ROOT)} (run python lessons/make_lessons.py)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
