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

    python lessons/make_lessons.py            # (re)write every notebook that has a source
    python lessons/make_lessons.py --check    # exit 1 if a notebook differs from its source
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = pathlib.Path(__file__).resolve().parent.parent  # the repository root
SOURCES = ROOT / "lessons" / "src"
LESSONS = ROOT / "lessons"

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


def build(source_path: pathlib.Path) -> nbformat.NotebookNode:
    """The notebook (no outputs, stable ids) for one lesson source file."""
    stem = source_path.stem
    nb = new_notebook(metadata=METADATA)
    for i, (kind, source) in enumerate(parse(source_path.read_text())):
        cell = new_markdown_cell(source) if kind == "markdown" else new_code_cell(source)
        cell["id"] = f"{stem[:50]}-{i:03d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    text = nbformat.writes(nb, version=4)
    return text if text.endswith("\n") else text + "\n"


def target_of(source_path: pathlib.Path) -> pathlib.Path:
    return LESSONS / f"{source_path.stem}.ipynb"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    for src in sorted(SOURCES.glob("*.py")):
        text, target = render(build(src)), target_of(src)
        if args.check:
            if not target.exists() or target.read_text() != text:
                stale.append(target)
        elif not target.exists() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {target.relative_to(ROOT)}")
    for target in stale:
        print(f"out of date: {target.relative_to(ROOT)} (run python lessons/make_lessons.py)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
